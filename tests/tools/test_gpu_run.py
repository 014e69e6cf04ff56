"""tools/gpu_run.sh on the CPU: it refuses a tree whose digest is not the one given (and says so in its own
record), refuses unknown steps before running any, keeps each attempt apart, and records ok / failed / timed-out
steps as such, with every log in the one archive that comes back."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ..repo import REPO as ROOT

SCRIPT = ROOT / "tools" / "gpu_run.sh"
_spec = importlib.util.spec_from_file_location("tree_digest", ROOT / "tools" / "tree_digest.py")
td = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(td)

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and coreutils' timeout"
)


def _run(tmp_path, *args, python3_head="", **env):
    """The script in this checkout, python3 being this interpreter, results under tmp_path. python3_head: shell
    lines the python3 wrapper runs first (to answer some commands itself)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "python3"  # (a symlink would lose the virtual environment)
    wrapper.write_text(f'#!/bin/sh\n{python3_head}exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    full_env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OUT": str(tmp_path / "out"),
        "LOG_ROOT": str(tmp_path / "logs"),
        **env,
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout + done.stderr


def _attempts(tmp_path):
    return sorted(p for p in (tmp_path / "out").iterdir())


def _here():
    """The digest the script computes of this checkout (its files as they are now)."""
    return td.digest_of(td.file_lines(ROOT))


def test_usage_without_a_digest(tmp_path):
    rc, text = _run(tmp_path, "abc1234")
    assert rc == 2 and "tree_digest.py --commit COMMIT" in text


def test_a_tree_that_is_not_the_commit_is_refused_and_recorded(tmp_path):
    wrong = "0" * 64
    rc, text = _run(tmp_path, "abc1234", wrong, STEPS="doctor")
    assert rc == 2 and "REFUSED" in text
    (attempt,) = _attempts(tmp_path)
    assert sorted(p.name for p in attempt.iterdir()) == ["env.txt", "logs.tar.gz", "summary.txt"]
    env = (attempt / "env.txt").read_text()
    assert f"expected tree digest (from git, CPU side): {wrong}" in env and f"of the files here): {_here()}" in env
    summary = (attempt / "summary.txt").read_text()
    assert "not commit abc1234" in summary and "result: refused, no step ran" in summary
    assert "=== doctor" not in summary
    with tarfile.open(attempt / "logs.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"env.txt", "summary.txt", "tree_digest.txt", "cubin_check.txt"} <= names


def test_an_unknown_step_or_a_missing_setting_refuses_before_any_step(tmp_path):
    rc, text = _run(tmp_path, "abc1234", _here(), STEPS="doctor no_such_step")
    assert rc == 2 and "step 'no_such_step' is unknown" in text and "=== doctor" not in text
    rc, text = _run(tmp_path, "abc1234", _here(), STEPS="retest")  # retest needs RETEST
    assert rc == 2 and "step 'retest'" in text
    rc, text = _run(tmp_path, "abc1234", _here(), STEPS="cu12_marked", CU12_FILES="tests/gpu")  # and CU12_MARK
    assert rc == 2 and "step 'cu12_marked'" in text and "CU12_MARK" in text
    assert len(_attempts(tmp_path)) == 3  # three attempts, three folders


def test_steps_are_recorded_ok_failed_and_timed_out(tmp_path):
    # retest of one CPU test: ok; soak_base on a checkout that is not there: failed; gpu_core under a 0.1 s
    # limit: timeout.
    rc, text = _run(
        tmp_path,
        "abc1234",
        _here(),
        STEPS="retest soak_base gpu_core",
        LIMIT="0.1",
        RETEST="tests/tools/test_tree_digest.py::test_contents_of_an_ignored_folder_are_ignored",
        BASE=str(tmp_path / "no_checkout"),
    )
    assert rc == 1, text
    (attempt,) = _attempts(tmp_path)
    summary = (attempt / "summary.txt").read_text()
    assert re.search(r"=== retest: ok after \d+ s, log retest.log", summary), summary
    assert re.search(r"=== soak_base: FAILED \(exit 1\) after \d+ s", summary), summary
    assert re.search(r"=== gpu_core: TIMEOUT \(limit 0.1 s, exit 124\) after \d+ s", summary), summary
    assert "result: failed or timed out: soak_base gpu_core (of 3 steps)" in summary
    env = (attempt / "env.txt").read_text()
    assert "cubins up to date" in env and ("NVIDIA" in env or "nvidia-smi" in env)  # the machine block ran
    with tarfile.open(attempt / "logs.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"retest.log", "soak_base.log", "gpu_core.log", "summary.txt", "env.txt"} <= names


def test_parallel_groups_each_run_their_steps_and_all_are_recorded(tmp_path):
    rc, text = _run(
        tmp_path,
        "abc1234",
        _here(),
        PARALLEL="retest; soak_base",
        RETEST="tests/tools/test_tree_digest.py::test_contents_of_an_ignored_folder_are_ignored",
        BASE=str(tmp_path / "no_checkout"),
    )
    assert rc == 1, text
    (attempt,) = _attempts(tmp_path)
    summary = (attempt / "summary.txt").read_text()
    assert "groups at the same time: 2" in summary
    assert re.search(r"=== retest: ok after \d+ s", summary) and re.search(r"=== soak_base: FAILED", summary)
    assert "result: failed or timed out: soak_base (of 2 steps)" in summary
    with tarfile.open(attempt / "logs.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"retest.log", "soak_base.log"} <= names
    rc, text = _run(
        tmp_path,
        "abc1234",
        _here(),
        PARALLEL="retest; no_such_step",
        RETEST="tests/tools/test_tree_digest.py::test_contents_of_an_ignored_folder_are_ignored",
    )
    assert rc == 2 and "step 'no_such_step' is unknown" in text


def test_a_gpu_test_failure_is_in_the_log_even_when_the_run_is_killed(tmp_path):
    """tests/gpu/conftest.py writes each GPU test's verdict, and a failure's traceback, as soon as the test ends:
    a step killed at its time limit never reaches pytest's summary (attempt 20261202T012159Z kept only '.F.')."""
    shutil.copy(ROOT / "tests" / "gpu" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(
        "import os, signal, subprocess, sys\n\n"
        "def test_fails():\n"
        "    subprocess.run([sys.executable, '-c', 'import sys; sys.stderr.write(\"a rank said this\\\\n\")'])\n"
        "    assert 1 + 1 == 3, 'the reason it failed'\n\n"
        "def test_passes():\n    pass\n\n"
        "def test_killed():\n    os.kill(os.getpid(), signal.SIGKILL)  # as a step's time limit kills pytest\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == -9, out
    assert "short test summary" not in out, out  # it really was killed before the summary
    assert "[ep_rt] FAILED test_x.py::test_fails (call" in out and "the reason it failed" in out, out
    assert "[ep_rt] PASSED test_x.py::test_passes (call" in out, out
    assert "a rank said this" in out.split("[ep_rt] FAILED")[1], out  # a child process's stderr, with the failure


@pytest.mark.parametrize(
    "step,later", [("exp_ll", ("exp_ll_suite", "exp_ab_")), ("exp_ht", ("exp_ht_suite", "exp_ht_p"))]
)
def test_an_experiment_without_its_delta_fails_and_runs_nothing_of_it(tmp_path, step, later):
    stale = Path("/tmp/ep_rt_exp_cubins")  # where the experiment is laid out; never an earlier attempt's
    rc, text = _run(tmp_path, "abc1234", _here(), STEPS=step, EXP_DELTA=str(tmp_path / "no_delta"))
    assert rc == 1, text
    (attempt,) = _attempts(tmp_path)
    summary = (attempt / "summary.txt").read_text()
    assert re.search(rf"=== {step}_cubins: FAILED \(exit 1\)", summary), summary
    assert not any(name in summary for name in later)
    assert f"result: failed or timed out: {step}_cubins (of 1 steps)" in summary
    assert not stale.exists()


def test_on_h200_says_it_ran_nothing_on_another_card(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # every query answers with this card's name
    smi.write_text('#!/bin/sh\necho "NVIDIA H100 80GB HBM3"\n')
    smi.chmod(0o755)
    rc, text = _run(tmp_path, "abc1234", _here(), STEPS="on_h200")
    assert rc == 0, text
    (attempt,) = _attempts(tmp_path)
    summary = (attempt / "summary.txt").read_text()
    assert "=== on_h200: bench_cli, host_profile and soak_calls not run: the GPU is NVIDIA H100 80GB HBM3" in summary
    assert not any(f"=== {name}" in summary for name in ("bench_cli", "host_profile", "soak_calls"))


def test_on_h200_runs_the_benches_and_the_call_soak_on_an_h200(tmp_path):
    """On an H200 the step runs issue 23 item 6's three measurements (here answered by a stand-in python3 that
    logs its arguments), the soak under a limit of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "NVIDIA H200"\n')
    smi.chmod(0o755)
    head = 'case "$1 $2" in "-m ep_rt"|"-m pytest"|"tools/host_profile.py "*) echo "stand-in: $*"; exit 0;; esac\n'
    rc, text = _run(tmp_path, "abc1234", _here(), STEPS="on_h200", python3_head=head)
    assert rc == 0, text
    (attempt,) = _attempts(tmp_path)
    summary = (attempt / "summary.txt").read_text()
    assert "not run: the GPU is" not in summary
    assert re.search(r"=== bench_cli: python3 -m ep_rt bench --json \S+ \(limit 600 s", summary), summary
    assert re.search(r"=== host_profile: python3 tools/host_profile.py --json \S+ \(limit 300 s", summary), summary
    assert re.search(
        r"=== soak_calls: python3 -m pytest -q -rs -s -m soak tests/gpu/test_call_soak_gpu.py \(limit 300 s", summary
    ), summary
    for name in ("bench_cli", "host_profile", "soak_calls"):
        assert f"=== {name}: ok after" in summary, summary


def test_exp_ll_refuses_an_unknown_variant_before_any_step(tmp_path):
    rc, text = _run(tmp_path, "abc1234", _here(), STEPS="exp_ll", EXP_VARIANT="fast")
    assert rc == 2 and "step 'exp_ll'" in text and "EXP_VARIANT must be packed or default" in text


def test_cu12_marked_refuses_a_marker_that_selects_no_test_before_any_step(tmp_path):
    """Attempt 20261207T232243Z spent a machine call on a marker that selected nothing in its module (pytest exit
    5); the check before any step now collects the selection and refuses an empty one, naming marker and files."""
    files = "tests/gpu/test_internode_cases_gpu.py"
    rc, text = _run(
        tmp_path,
        "abc1234",
        _here(),
        STEPS="cu12_marked",
        CU12_FILES=files,
        CU12_MARK="sixteen and not aggressive and not chaos",
    )
    assert rc == 2 and "step 'cu12_marked'" in text and f"selects no test in {files}" in text
    assert "=== cu12_unpack" not in text


def test_cu12_marked_with_a_selection_goes_on_to_its_steps(tmp_path):
    """The same check lets a marker that selects tests through: the attempt starts its steps (here the unpack fails
    at once, for want of the carried library in a missing folder)."""
    rc, text = _run(
        tmp_path,
        "abc1234",
        _here(),
        STEPS="cu12_marked",
        CU12_MARK="sixteen and not aggressive",
        CU12_FILES="tests/gpu/test_internode_cases_gpu.py tests/gpu/test_internode_gpu.py",
        CU12_NVSHMEM=str(tmp_path / "no_such_folder"),
    )
    assert "REFUSED" not in text and "=== cu12_unpack" in text and "FAILED" in text


def test_exp_ht_refuses_an_unknown_variant_before_any_step(tmp_path):
    rc, text = _run(tmp_path, "abc1234", _here(), STEPS="exp_ht", EXP_VARIANT="aggressive")
    assert rc == 2 and "step 'exp_ht'" in text and "EXP_VARIANT for exp_ht must be tma or safe" in text
