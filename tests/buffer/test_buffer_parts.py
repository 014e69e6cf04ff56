"""What Buffer composes, seen from outside the plan: every transport part has an error slot from construction and
one destroy(collective); both high-throughput ops have the methods of ep_rt.ht_op.HighThroughputOp; the factory
table has an op for every kind the plan names; _release hands each part the collective flag buffer_plan's rule says."""

import inspect
from types import SimpleNamespace

import pytest

from ep_rt import buffer as buffer_mod, buffer_plan
from ep_rt.ht_op import HighThroughputOp
from ep_rt.ops.internode import InternodeOp
from ep_rt.ops.intranode import IntranodeOp
from ep_rt.transport.error_record import ErrorRecords
from ep_rt.transport.nvl import NvlBuffer
from ep_rt.transport.nvshmem import NvshmemSession
from ep_rt.transport.symmetric import SymmetricBuffer

from .. import host_trace

PART_TYPES = (ErrorRecords, NvlBuffer, NvshmemSession, SymmetricBuffer, InternodeOp)


@pytest.mark.parametrize("part_type", PART_TYPES, ids=lambda t: t.__name__)
def test_every_part_type_has_destroy_collective(part_type):
    params = list(inspect.signature(part_type.destroy).parameters.values())
    assert [p.name for p in params[:2]] == ["self", "collective"]
    assert all(p.default is not inspect.Parameter.empty for p in params[2:]), params  # anything more is optional


# Hand-written: each scenario's parts in construction order, as (type, error_slot). The session's stand-in in
# tests/host_trace.py is a class named Session.
PARTS = {
    "intranode": [("ErrorRecords", None), ("NvlBuffer", "nvl")],
    "intranode + low latency": [
        ("ErrorRecords", None),
        ("NvlBuffer", "nvl"),
        ("Session", "nvshmem"),
        ("SymmetricBuffer", "low_latency"),
    ],
    "low latency across nodes (no HT)": [
        ("ErrorRecords", None),
        ("Session", "nvshmem"),
        ("SymmetricBuffer", "low_latency"),
    ],
    "internode": [
        ("ErrorRecords", None),
        ("NvlBuffer", "nvl"),
        ("Session", "nvshmem"),
        ("SymmetricBuffer", "internode"),
        ("InternodeOp", None),
    ],
    "internode + low latency": [  # one symmetric buffer for both modes (issue 22 item 2), as DeepEP's
        ("ErrorRecords", None),
        ("NvlBuffer", "nvl"),
        ("Session", "nvshmem"),
        ("SymmetricBuffer", ("internode", "low_latency")),
        ("InternodeOp", None),
    ],
}


@pytest.mark.parametrize("scenario", sorted(PARTS))
def test_each_part_has_its_error_slot_from_construction(scenario):
    seen = []
    host_trace.run_scenario(
        scenario,
        inspect=lambda buf: seen.extend(
            (type(p).__name__, vars(p).get("error_slot", type(p).__dict__.get("error_slot", "unset")))
            for p in buf._parts
        ),
    )
    assert seen == PARTS[scenario]


def _methods(proto):
    return {name for name, v in vars(proto).items() if callable(v) and not name.startswith("_")}


@pytest.mark.parametrize("op_type", (IntranodeOp, InternodeOp), ids=lambda t: t.__name__)
def test_both_ht_ops_have_the_interfaces_methods(op_type):
    methods = _methods(HighThroughputOp)
    assert methods == {"raise_if_failed", "check_dispatch", "run_dispatch", "combine_handle", "combine"}
    for name in methods:
        want = list(inspect.signature(getattr(HighThroughputOp, name)).parameters)
        got = list(inspect.signature(getattr(op_type, name)).parameters)
        assert got == want, (op_type.__name__, name, got, want)
    assert isinstance(op_type.is_internode, bool)


def test_the_factory_table_has_an_op_for_every_kind_the_plan_names():
    assert set(buffer_mod._HT_OPS) == {buffer_plan.INTRANODE, buffer_plan.INTERNODE}
    assert set(buffer_mod._CUBINS) == {buffer_plan.INTERNODE, buffer_plan.LOW_LATENCY}


class Part:
    def __init__(self, log, name, slot):
        self.log, self.name, self.error_slot = log, name, slot

    def destroy(self, collective):
        self.log.append((self.name, collective))


class Op:
    def __init__(self, log, name, failed=None, mask=None):
        self.log, self.name, self.failed, self.mask = log, name, failed, mask

    def barrier(self, stream):
        self.log.append((self.name + " barrier", stream))


@pytest.mark.parametrize(
    "failed_slots,want_flags",
    [
        (set(), [True, True, True, True, True]),
        ({"low_latency"}, [True, True, False, False, True]),  # the LL op failed: no LL barrier, no NVSHMEM teardown
        ({"nvl"}, [True, False, True, True, True]),
        # a peer timed out (CommTimeoutError in the nvl slot): it is not waited for again, NVSHMEM freed locally
        ({"nvl", "peer gone"}, [True, False, False, False, True]),
    ],
)
def test_release_gives_each_part_the_rules_flag(monkeypatch, failed_slots, want_flags):
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    log = []
    buf = object.__new__(buffer_mod.Buffer)
    buf.destroyed, buf.device, buf.comm_stream = False, "dev", "comm"
    buf._plan = SimpleNamespace(ht=buffer_plan.INTRANODE, nvshmem_teardown_local=False)
    buf._errors = SimpleNamespace(
        check=lambda slot: "failed" if slot in failed_slots else None,
        peer_may_be_gone=lambda: "peer gone" in failed_slots,
    )
    buf._ll = Op(log, "ll", failed="x" if "low_latency" in failed_slots else None)
    buf._ht = Op(log, "ht")  # intranode: not an NVSHMEM user, no barrier of its own
    buf._layout = buf._nvl = None
    names = [("errors", None), ("nvl", "nvl"), ("session", "nvshmem"), ("sym", "low_latency"), ("other", None)]
    buf._parts = [Part(log, n, s) for n, s in names]
    buf._release(collective=True)
    barriers = [e for e in log if e[0].endswith("barrier")]
    waits = not failed_slots & {"low_latency", "peer gone"}
    assert barriers == ([("ll barrier", "comm")] if waits else [])
    destroyed = [e for e in log if not e[0].endswith("barrier")]
    assert destroyed == list(reversed([(n, f) for (n, _), f in zip(names, want_flags)]))
    assert buf.destroyed and buf._parts == []


def test_a_teardown_barrier_that_times_out_warns_and_destroy_returns(monkeypatch):
    """Issue 25 item 5: a peer died between calls and no call saw it yet: the LL op's teardown barrier times out;
    destroy() frees every part (NVSHMEM's without collectives) and returns, with a warning saying what was left."""
    import torch

    from ep_rt.errors import CommTimeoutError

    class TimingOutOp(Op):
        def barrier(self, stream):
            self.log.append((self.name + " barrier", stream))
            self.failed = CommTimeoutError("rank 0: timed out in low-latency barrier waiting for rank 1.")
            raise self.failed

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    log = []
    buf = object.__new__(buffer_mod.Buffer)
    buf.destroyed, buf.device, buf.comm_stream = False, "dev", "comm"
    buf._plan = SimpleNamespace(ht=buffer_plan.INTRANODE, nvshmem_teardown_local=False)
    buf._errors = SimpleNamespace(check=lambda slot: None, peer_may_be_gone=lambda: False)
    buf._ll, buf._ht, buf._layout, buf._nvl = TimingOutOp(log, "ll"), Op(log, "ht"), None, None
    names = [("errors", None), ("nvl", "nvl"), ("session", "nvshmem"), ("sym", "low_latency")]
    buf._parts = [Part(log, n, s) for n, s in names]
    with pytest.warns(RuntimeWarning, match="freed without NVSHMEM's collective teardown"):
        buf._release(collective=True)  # returns: no exception
    assert log == [("ll barrier", "comm"), ("sym", False), ("session", False), ("nvl", True), ("errors", True)]
    assert buf.destroyed
