"""The soaks' verdicts (soak_ll.problems, soak_ht.problems, tools/ll_soak.py): a leak or a mismatch fails the soak,
and ll_soak.py never prints PASSED then (it did, with exit 0, at ec2ebf6: docs/gpu_runs/2026-12-01_ec2ebf6/soak.log)."""

import importlib.util
import sys

from ep_rt.testing import soak_ht, soak_ll

from ..repo import REPO as ROOT

LEAK = "device_used grew by 506.0 MiB after the warm-up (limit 256)"


def _ll(**over):
    return {
        "variant": "default",
        "rounds": 100,
        "checks": 200,
        "bad": [0, 0, 0],
        "first_bad": None,
        "counts": {},
        "seconds": 1.0,
        "leaks": [],
        "samples": [],
        **over,
    }


def _ht(**over):
    return {"rounds": 100, "bad": [0, 0, 0], "full_failures": [], "counts": {"full": 1}, "leaks": [], **over}


def test_ll_problems():
    assert soak_ll.problems([_ll(), _ll()], 100) == []
    assert soak_ll.problems([_ll(), _ll(leaks=[LEAK])], 100) == [f"rank 1: leak: {LEAK}"]
    assert "mismatches [0, 3, 0]" in soak_ll.problems([_ll(bad=[0, 3, 0])], 100)[0]
    assert "first" in soak_ll.problems([_ll(first_bad={"rounds": [7]})], 100)[0]
    assert soak_ll.problems([_ll(rounds=60)], 100) == ["rank 0: 60 of 100 rounds ran"]
    assert soak_ll.problems([_ll(), _ll(variant="packed")], 100, "packed") == [
        "rank 0: ran the 'default' LL cubin, not 'packed'"
    ]


def test_ht_problems():
    assert soak_ht.problems([_ht(), _ht()], 100) == []
    assert soak_ht.problems([_ht(leaks=[LEAK])], 100) == [f"rank 0: leak: {LEAK}"]
    assert "mismatches" in soak_ht.problems([_ht(bad=[0, 0, 2])], 100)[0]
    assert "full reference cases failed" in soak_ht.problems([_ht(full_failures=["combine: 1 differs"])], 100)[0]
    assert soak_ht.problems([_ht(counts={"full": 0})], 100) == ["rank 0: no full reference case ran"]


def _ll_soak_tool():
    spec = importlib.util.spec_from_file_location("ll_soak_tool", ROOT / "tools" / "ll_soak.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_ll_soak_tool_fails_on_a_leak_and_passes_only_when_clean(monkeypatch, capsys):
    tool = _ll_soak_tool()
    monkeypatch.setattr(sys, "argv", ["ll_soak.py", "--rounds", "100", "--seed", "1"])
    monkeypatch.setattr(tool, "run_ranks", lambda *a, **k: [_ll(), _ll(leaks=[LEAK])])
    assert tool.main() == 1
    out = capsys.readouterr().out
    assert "PASSED" not in out and "FAILED: rank 1: leak: device_used grew" in out
    monkeypatch.setattr(tool, "run_ranks", lambda *a, **k: [_ll(), _ll(bad=[1, 0, 0], first_bad={"rounds": [3]})])
    assert tool.main() == 1 and "PASSED" not in capsys.readouterr().out
    monkeypatch.setattr(tool, "run_ranks", lambda *a, **k: [_ll(), _ll()])
    assert tool.main() == 0 and capsys.readouterr().out.rstrip().endswith("PASSED")


def test_ll_soak_tool_packed_sets_the_knob_and_fails_on_another_variant(monkeypatch, capsys):
    tool = _ll_soak_tool()
    seen = {}

    def fake_run_ranks(*a, env, **k):
        seen.update(env)
        return [_ll(variant="packed"), _ll()]  # rank 1 loaded the default cubin: the soak did not test packed

    monkeypatch.setattr(sys, "argv", ["ll_soak.py", "--rounds", "100", "--seed", "1", "--packed"])
    monkeypatch.setattr(tool, "run_ranks", fake_run_ranks)
    assert tool.main() == 1
    assert seen["EP_RT_LL_PACKED"] == "1" and seen["EP_RT_CHAOS_TRANSPORT"] == "0"
    out = capsys.readouterr().out
    assert "PASSED" not in out and "rank 1: ran the 'default' LL cubin, not 'packed'" in out
    monkeypatch.setattr(tool, "run_ranks", lambda *a, **k: [_ll(variant="packed"), _ll(variant="packed")])
    assert tool.main() == 0 and capsys.readouterr().out.rstrip().endswith("PASSED")
