"""The lean LL host path's own rules (issue 23 item 2), with the CUDA calls stubbed (tools/host_path_stub.py):
stream waits reuse one event per stream, plans and checked shapes are reused, a call makes no more allocations than
it returns tensors, and bad shapes are still refused after a good call of the same numbers."""

import pytest
import torch

from ep_rt import events
from tests.host_path_tools import load_stub

stub = load_stub()


@pytest.fixture
def ll():
    with stub.stubbed():
        events._fences.clear()
        yield stub.ll_buffer()
        events._fences.clear()


def census(fn):
    stub.COUNT.clear()
    fn()
    return dict(stub.COUNT)


def test_eager_calls_create_no_event_after_the_first(ll):
    T, H, E = 8, 256, 8
    x, idx = torch.zeros(4, H, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64)
    first = census(lambda: ll.low_latency_dispatch(x, idx, T, E))
    assert first.get("torch.cuda.Event()") == 2  # one fence per stream (compute, comm), made once
    later = census(lambda: ll.low_latency_dispatch(x, idx, T, E))
    assert "torch.cuda.Event()" not in later and later["cuEventRecord + cuStreamWaitEvent"] == 2  # driver fences
    assert "Event.record" not in later and "Stream.wait_event" not in later
    assert "Stream.wait_stream (a new Event each)" not in later


def test_allocations_are_the_returned_tensors(ll):
    T, H, E = 8, 256, 8
    x, idx, w = torch.zeros(4, H, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2)
    assert census(lambda: ll.low_latency_dispatch(x, idx, T, E))["torch.empty"] == 5  # x, scales, count, 2 handle
    assert census(lambda: ll.low_latency_dispatch(x, idx, T, E, use_fp8=False))["torch.empty"] == 4
    handle = ll.low_latency_dispatch(x, idx, T, E)[2]
    y = torch.zeros(E // 2, 2 * T, H, dtype=torch.bfloat16)
    assert census(lambda: ll.low_latency_combine(y, idx, w, handle))["torch.empty"] == 1
    out = torch.zeros(4, H, dtype=torch.bfloat16)
    assert "torch.empty" not in census(lambda: ll.low_latency_combine(y, idx, w, handle, out=out))


def test_plans_are_reused_and_bounded(ll):
    op = ll._ll
    x, idx = torch.zeros(4, 256, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64)
    for _ in range(4):
        ll.low_latency_dispatch(x, idx, 8, 8)
    assert len(op.call_plans) == 2  # one per buffer
    for T in range(4, 4 + 80):
        ll.low_latency_dispatch(x, idx, T, 8)
    assert len(op.call_plans) <= 64


@pytest.mark.parametrize(
    "T,E,error", [(True, 8, TypeError), (8.0, 8, TypeError), (8, 8.0, TypeError), (8, 7, ValueError)]
)
def test_a_checked_shape_does_not_let_other_types_through(ll, T, E, error):
    x, idx = torch.zeros(4, 256, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64)
    ll.low_latency_dispatch(x, idx, 8, 8)
    before = ll._ll.idx
    with pytest.raises(error):
        ll.low_latency_dispatch(x, idx, T, E)
    assert ll._ll.idx == before  # nothing was taken


def test_a_shape_too_big_for_the_buffer_takes_no_buffer(ll):
    op = ll._ll
    x, idx = torch.zeros(4, 7168, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(Exception, match="get_low_latency_rdma_size_hint"):
        ll.low_latency_dispatch(x, idx, 1024, 288)
    assert op.idx == 0 and op.pending_recv == [False, False]


def test_a_hook_launches_once_and_a_held_hook_blocks_its_buffer(ll):
    x, idx = torch.zeros(4, 256, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64)
    hook = ll.low_latency_dispatch(x, idx, 8, 8, return_recv_hook=True)[4]
    ll.low_latency_dispatch(x, idx, 8, 8)  # the other buffer
    with pytest.raises(Exception, match="never called"):
        ll.low_latency_dispatch(x, idx, 8, 8)
    launches = census(hook)
    assert launches.get("cuLaunchKernel") == 1
    with pytest.raises(Exception, match="already called"):
        hook()
    ll.low_latency_dispatch(x, idx, 8, 8)


def test_current_stream_keeps_one_stream_object_per_stream(monkeypatch):
    """events.current_stream: torch's two C calls, the Stream object made once per (id, device, type); a torch
    without them takes torch.cuda.current_stream()."""
    made = []

    class FakeStream:
        def __init__(self, stream_id, device_index, device_type):
            made.append((stream_id, device_index, device_type))

    current = {"device": 0, "stream": 5}
    monkeypatch.setattr(events, "_device_index", lambda: current["device"])
    monkeypatch.setattr(events, "_stream_of_device", lambda d: (current["stream"], d, 1))
    monkeypatch.setattr(events, "_streams", {})
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    a = events.current_stream()
    assert events.current_stream() is a and made == [(5, 0, 1)]
    current["stream"] = 9
    b = events.current_stream()
    current["device"] = 1
    c = events.current_stream()
    assert len({id(a), id(b), id(c)}) == 3 and made == [(5, 0, 1), (9, 0, 1), (9, 1, 1)]
    monkeypatch.setattr(events, "_stream_of_device", None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "torch's")
    assert events.current_stream() == "torch's"


def test_a_dispatch_handle_carries_the_facts_handle_facts_of_would_give(ll):
    """low_latency_dispatch builds its handle's facts directly (no pass over the entries): they must equal
    HandleFacts.of's, which the combine's checks compare against; a replaced tensor is still refused."""
    from ep_rt.handles import HandleFacts, with_facts

    T, H, E = 8, 256, 8
    x, idx, w = torch.zeros(4, H, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2)
    handle = ll.low_latency_dispatch(x, idx, T, E)[2]
    assert handle.facts == HandleFacts.of(handle, ll._ll.serial)
    y = torch.zeros(E // 2, 2 * T, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"handle\[0\] is not the tensor the dispatch returned"):
        ll.low_latency_combine(y, idx, w, with_facts(type(handle)(handle[0].clone(), *handle[1:]), handle.facts))


def test_packed_combine_checks_the_src_info_plane_only_for_handles_without_facts(monkeypatch):
    """The packed layout's combine needs the dispatch's own src_info view (plane 0 of [2, L, R*T]). The handle the
    dispatch returned carries facts that the combine checks first (same Buffer, same tensors), so the plane check is
    skipped for it (2.6 us a call, timed alone on the CPU machine); a rebuilt tuple has no facts and still gets the
    plane check, which refuses a copied src_info."""
    from ep_rt.ops import low_latency as ll_ops

    seen = []
    real = ll_ops.check_packed_src_info
    monkeypatch.setattr(ll_ops, "check_packed_src_info", lambda *a: seen.append(a) or real(*a))
    with stub.stubbed():
        events._fences.clear()
        buf = stub.ll_buffer(packed=True)
        T, H, E = 8, 256, 8
        x, idx, w = torch.zeros(4, H, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2)
        handle = buf.low_latency_dispatch(x, idx, T, E)[2]
        y = torch.zeros(E // 2, 2 * T, H, dtype=torch.bfloat16)
        buf.low_latency_combine(y, idx, w, handle)
        assert seen == []  # the dispatch's own handle: its facts held
        rebuilt = tuple(handle)
        buf.low_latency_combine(y, idx, w, rebuilt)
        assert len(seen) == 1  # no facts: the plane is checked
        copied = (handle[0].clone(),) + tuple(handle[1:])
        with pytest.raises(ValueError, match="must be the tensor the low-latency dispatch returned"):
            buf.low_latency_combine(y, idx, w, copied)
        events._fences.clear()
