"""The command line's own help: `python -m ep_rt help [COMMAND]`, what `check --help` says, and `check`'s options on
a machine without a GPU (named, with what runs instead, never silently ignored)."""

import pytest
import torch

from ep_rt.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m ep_rt [COMMAND]")
    assert all(f"  {name} " in out for name in [*COMMANDS, "help"])


def test_help_command_is_that_commands_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["help", "doctor"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m ep_rt doctor")
    assert main(["help", "nope"]) == 2
    assert "no command 'nope'" in capsys.readouterr().err


def test_check_help_describes_both_modes(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = capsys.readouterr().out
    for words in (
        "high throughput",
        "get_dispatch_layout",
        "cached dispatch",
        "low latency",
        "low_latency_dispatch",
        "CUDA-graph",
        "--quick",
        "--internode G",
        "Without a GPU",
    ):
        assert words in out, words


no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path: this machine has a GPU")


@no_gpu
def test_internode_without_gpu_says_what_runs_instead(capsys):
    assert main(["--internode", "2"]) == 0
    out = capsys.readouterr().out
    assert "--internode 2: the internode kernels need GPUs; this is the internode reference's round trip" in out
    assert "(4 ranks as 2 nodes of 2;" in out
    assert len([line for line in out.splitlines() if line.endswith(" yes")]) == 4
    assert max(len(line) for line in out.splitlines()) <= 120


@no_gpu
def test_quick_and_bench_options_without_gpu_are_named(capsys):
    assert main(["--quick", "--no-bench"]) == 0
    out = capsys.readouterr().out
    assert "--quick: the CPU round trip is one small case either way" in out
    assert "there is no benchmark without a GPU" in out
    assert main([]) == 0
    assert "--quick" not in capsys.readouterr().out


@no_gpu
def test_internode_ranks_that_form_no_two_nodes_are_refused(capsys):
    assert main(["--internode", "3", "--ranks", "4"]) == 2
    assert "at least 2 nodes of 3 ranks" in capsys.readouterr().err
