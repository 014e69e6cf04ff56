"""Buffer's host code asks the same of CUDA, NVSHMEM and the process group as before the refactor of issue 26
(tests/host_trace.py): construction, every hot call, the argument errors and the teardown, in every mode, each
kernel launched with the same grid, block, stream and parameter fields in the same order. The golden trace was
recorded from the code before the refactor (commit 'host trace: golden'); a deliberate behaviour change re-records
it with `python -m tests.host_trace --write` and says why in its commit."""

import json

import pytest

from .. import host_trace


@pytest.mark.parametrize("scenario", sorted(host_trace.SCENARIOS))
def test_the_host_trace_is_the_golden_one(scenario):
    golden = json.loads(host_trace.GOLDEN.read_text())
    got = {scenario: host_trace.run_scenario(scenario)}
    diffs = host_trace.differences(got, {scenario: golden[scenario]})
    assert not diffs, "\n".join(diffs)


def test_the_comparison_sees_a_changed_field():
    """The trace is fine-grained enough to fail: one kernel field changed is a difference."""
    events = host_trace.run_scenario("intranode")
    changed = json.loads(json.dumps(events))
    launch = next(e for e in changed if e[0] == "launch" and e[1] == "ep_rt_intranode_dispatch")
    launch[-1]["num_channels"] += 1
    assert host_trace.differences({"s": changed}, {"s": events})
    assert not host_trace.differences({"s": events}, {"s": json.loads(json.dumps(events))})
