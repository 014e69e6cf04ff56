"""One symmetric buffer for both modes (issue 22 item 2; ep_rt/ops/mode_switch.py), on the CPU through the host
trace (tests/host_trace.py): the real Buffer in the "internode + low latency" scenario allocates one symmetric
buffer whose control areas do not overlap, and puts ep_rt_ll_barrier on the comm stream exactly at each switch of
mode, behind what the last calls of the other mode ran on; a pending receive hook refuses a high-throughput call;
no barrier inside a CUDA-graph capture (the switch stays pending); clean_low_latency_buffer settles it.
The GPU side: tests/gpu/test_internode_gpu.py::test_internode_and_low_latency_in_one_buffer."""

import pytest
import torch

from ep_rt.errors import EpRtError
from ep_rt.ops.internode import InternodeOp
from ep_rt.ops.low_latency import LowLatencyOp
from ep_rt.transport import internode_layout, ll_layout

from .. import host_trace

SCENARIO = "internode + low latency"
T = 8  # LL tokens per rank in these calls


def _barriers(trace, since: int):
    return [e for e in trace.events[since:] if e[0] == "launch" and e[1] == "ep_rt_ll_barrier"]


class Driver:
    def __init__(self, trace, buf):
        self.trace, self.buf = trace, buf
        self.x, self.idx, self.w, self.common = host_trace.ht_inputs(buf)

    def ht(self):
        recv_x, _, _, _, handle, _ = self.buf.dispatch(self.x, topk_idx=self.idx, topk_weights=self.w, **self.common)
        self.buf.combine(recv_x, handle)

    def ll(self, **kwargs):
        return self.buf.low_latency_dispatch(self.x, self.idx, T, host_trace.E, use_fp8=False, **kwargs)

    def count(self, what) -> int:
        """The ep_rt_ll_barrier launches `what()` makes."""
        since = len(self.trace.events)
        what()
        return len(_barriers(self.trace, since))


@pytest.fixture
def driver():
    with host_trace.driven(SCENARIO) as (trace, make):
        buf = make()
        yield Driver(trace, buf)
        buf.destroy()


def test_one_symmetric_allocation_whose_control_areas_follow_each_other():
    with host_trace.driven(SCENARIO) as (trace, make):
        buf = make()
        aligns = [e[1] for e in trace.events if e[0] == "driver.nvshmem.align"]
        topo = buf.topology
        R, N, nbytes = topo.num_ranks, topo.num_nodes, buf.num_rdma_bytes
        internode_end = internode_layout.control_offsets(nbytes, R, N)["end"]
        ll_control = ll_layout.control_offsets(internode_end, R)
        assert aligns == [ll_control["end"]]  # one allocation, both control areas in it
        assert buf._ll.sym == buf._ht.sym_base
        assert buf._ht.control == internode_layout.control_offsets(nbytes, R, N)  # from num_rdma_bytes on
        assert buf._ll.control == ll_control and ll_control["credit"] >= internode_end  # after the internode one
        assert InternodeOp.symmetric_bytes(nbytes, R, N) == internode_end
        assert LowLatencyOp.symmetric_bytes(nbytes, R, control_start=internode_end) == ll_control["end"]
        # what the two allocations of before took, less the second payload
        two = InternodeOp.symmetric_bytes(nbytes, R, N) + LowLatencyOp.symmetric_bytes(nbytes, R)
        assert ll_control["end"] == two - nbytes
        buf.destroy()
        (allocated,) = [e[1] for e in trace.events if e[0] == "driver.memset_d8" and e[3] == aligns[0]]
        assert [e[1] for e in trace.events if e[0] == "driver.nvshmem.free"] == [allocated]  # freed once


def test_a_barrier_exactly_at_each_switch_of_mode(driver):
    d = driver
    assert d.count(d.ht) == 0  # the first call: nothing of the other mode ran before
    assert d.count(d.ht) == 0
    assert d.count(d.ll) == 1  # HT -> LL
    assert d.count(d.ll) == 0
    assert d.count(d.ht) == 1  # LL -> HT
    assert d.count(lambda: (d.ll(), d.ll())) == 1
    assert d.buf._modes.switches == 3


def test_the_switch_barrier_runs_on_the_comm_stream_before_the_calls_kernels(driver):
    d = driver
    d.ht()
    since = len(d.trace.events)
    d.ll()
    launches = [e for e in d.trace.events[since:] if e[0] in ("launch", "launch_ex")]
    assert launches[0][1] == "ep_rt_ll_barrier" and launches[1][1].startswith("ep_rt_ll_")
    assert launches[0][5] == launches[1][5]  # the eager call's stream: the comm stream
    since = len(d.trace.events)
    d.ht()
    launches = [e for e in d.trace.events[since:] if e[0] in ("launch", "launch_ex")]
    names = [e[1] for e in launches]
    # the id check touches no symmetric memory; the barrier comes before the notify
    assert names.index("ep_rt_ll_barrier") < names.index("ep_rt_internode_notify"), names
    assert launches[names.index("ep_rt_ll_barrier")][5] == launches[names.index("ep_rt_internode_notify")][5]


def test_after_a_hooked_ll_call_the_comm_stream_waits_for_the_hooks_stream(driver):
    d = driver
    d.ht()
    *_, hook = d.ll(return_recv_hook=True)
    hook()
    since = len(d.trace.events)
    d.ht()
    ev = d.trace.events[since:]
    barrier = next(i for i, e in enumerate(ev) if e[0] == "launch" and e[1] == "ep_rt_ll_barrier")
    # the comm stream waits for the event the hook recorded, right before the barrier
    assert ev[barrier - 1][0] == "Stream.wait_event", ev[barrier - 3 : barrier + 1]


def test_a_pending_receive_hook_refuses_a_high_throughput_call(driver):
    d = driver
    *_, hook = d.ll(return_recv_hook=True)
    with pytest.raises(EpRtError, match="receive hook was never called"):
        d.ht()
    hook()
    assert d.count(d.ht) == 1  # and then the switch goes ahead


def test_no_barrier_inside_a_capture_the_switch_waits_for_the_next_call(driver, monkeypatch):
    d = driver
    d.ht()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert d.buf._modes.last == "high-throughput"
    # (the LL call itself is not captured here: only the switch's rule is looked at)
    assert d.buf._modes.before_low_latency() is False
    assert d.buf._modes.switches == 0 and d.buf._modes.last == "high-throughput"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert d.count(d.ll) == 1


def test_clean_low_latency_buffer_settles_the_switch(driver):
    d = driver
    d.ht()
    d.buf.clean_low_latency_buffer(T, host_trace.H, host_trace.E)  # host-synchronised barriers of its own
    assert d.count(d.ll) == 0
    assert d.count(d.ht) == 1


@pytest.mark.parametrize("scenario", ["internode", "intranode + low latency", "low latency across nodes (no HT)"])
def test_buffers_whose_modes_do_not_share_a_buffer_have_no_switch(scenario):
    with host_trace.driven(scenario) as (trace, make):
        buf = make()
        assert buf._modes is None
        buf.destroy()


def test_a_zero_copy_buffer_taken_after_high_throughput_calls_waits_for_the_switch(driver, monkeypatch):
    """LL dispatch, HT calls, then the next combine buffer: the caller writes into the shared payload before the
    combine runs, so the switch (and the caller stream's wait for it) comes when the buffer is taken."""
    d = driver
    monkeypatch.setattr(d.buf._ll, "next_combine_buffer", lambda *shape: None)  # (a view of device memory)
    _, _, handle, _, _ = d.ll()
    d.ht()
    since = len(d.trace.events)
    d.buf.get_next_low_latency_combine_buffer(handle)
    ev = d.trace.events[since:]
    barrier = next(i for i, e in enumerate(ev) if e[0] == "launch" and e[1] == "ep_rt_ll_barrier")
    fences = [e[2:] for e in ev[barrier:] if e[0] == "driver.record_and_wait"]
    # the caller's stream (handle 0x11) waits for the comm stream's fence, recorded after the barrier
    assert [d.buf.comm_stream.cuda_stream, 0x11] in fences, ev[barrier:]
    assert d.count(lambda: d.buf.get_next_low_latency_combine_buffer(handle)) == 0  # once per switch
