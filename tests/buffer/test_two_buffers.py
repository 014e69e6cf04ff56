"""Issue 25 item 2 on the CPU: a high-throughput Buffer and a low-latency Buffer in one process on one group (SGLang's
prefill and decode), used in alternation, each call on its own Buffer's memory and error records, torn down in
either order, a new Buffer working afterwards; across nodes the high-throughput-only Buffer shares the low-latency
one's NVSHMEM world (that rule: tests/transport/test_nvshmem_world.py). CUDA stubbed (tests/host_trace.py). The GPU side: tests/gpu/test_server_gpu.py
(test_a_high_throughput_and_a_low_latency_buffer_in_one_process). Buffers on other ranks than a live NVSHMEM
world's are refused with the rule (tests/transport/test_nvshmem_world.py)."""

import pytest
import torch

from .. import host_trace

T = 8


def _launches(trace, start):
    return [(e[1], e[-1]) for e in trace.events[start:] if e[0] in ("launch", "launch_ex")]


def _ll_round(buf):
    R = buf.group_size
    idx, x, w, _ = host_trace._inputs(R)
    _, _, handle, _, _ = buf.low_latency_dispatch(x, idx, T, host_trace.E, use_fp8=False)
    y = torch.zeros(host_trace.E // R, R * T, host_trace.H, dtype=torch.bfloat16)
    buf.low_latency_combine(y, idx, w, handle)


def _ht_round(buf):
    x, idx, w, common = host_trace.ht_inputs(buf)
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
    buf.combine(recv_x, handle, topk_weights=recv_w)


@pytest.mark.parametrize("first", ["ht", "ll"])
def test_a_high_throughput_and_a_low_latency_buffer_on_one_group(first):
    with host_trace.driven("intranode + low latency") as (trace, make):
        made = {}
        for kind in (first, "ll" if first == "ht" else "ht"):
            args = {"num_nvl_bytes": 1 << 22} if kind == "ht" else {"num_rdma_bytes": 1 << 22, "low_latency_mode": True}
            made[kind] = host_trace.build({**args, "explicitly_destroy": True})
        ht_buf, ll_buf = made["ht"], made["ll"]
        assert ht_buf._ll is None and ll_buf._ll is not None
        ht_error, ll_error = ht_buf._errors.device_ptr("nvl"), ll_buf._errors.device_ptr("low_latency")
        for _ in range(3):  # alternation, as prefill and decode batches interleave
            start = len(trace.events)
            _ht_round(ht_buf)
            ht_launches = _launches(trace, start)
            start = len(trace.events)
            _ll_round(ll_buf)
            ll_launches = _launches(trace, start)
            assert ht_launches and all(
                n.startswith(("ep_rt_intranode", "ep_rt_check", "ep_rt_get")) for n, _ in ht_launches
            )
            assert ll_launches and all(n.startswith("ep_rt_ll") for n, _ in ll_launches)
            intranode = [p for n, p in ht_launches if n.startswith("ep_rt_intranode")]
            assert {p["error"] for p in intranode} == {trace.norm(ht_error)}  # each Buffer its own error record
            assert {p["error"] for _, p in ll_launches} == {trace.norm(ll_error)}
        # Either order of teardown; each Buffer's destroy frees only its own parts.
        (made["ll"] if first == "ht" else made["ht"]).destroy()
        other = made["ht"] if first == "ht" else made["ll"]
        (_ht_round if other is ht_buf else _ll_round)(other)  # the other one still works
        other.destroy()
        again = host_trace.build({"num_rdma_bytes": 1 << 22, "low_latency_mode": True, "explicitly_destroy": True})
        _ll_round(again)
        again.destroy()


def test_across_nodes_a_high_throughput_buffer_beside_a_low_latency_one():
    """The host side only: the stubs stand in for NVSHMEM's session, so which world the second Buffer joins is the
    rule's test (tests/transport/test_nvshmem_world.py: a high-throughput-only Buffer takes a live full world over
    the same ranks)."""
    with host_trace.driven("internode + low latency") as (trace, make):
        ll_buf = host_trace.build(
            {"num_rdma_bytes": 1 << 24, "low_latency_mode": True, "explicitly_destroy": True, "timeout_s": 30.0}
        )
        ht_buf = host_trace.build(
            {"num_nvl_bytes": 1 << 24, "num_rdma_bytes": 1 << 24, "explicitly_destroy": True, "timeout_s": 30.0}
        )
        assert ht_buf.is_internode and ht_buf._ll is None
        for _ in range(2):
            _ht_round(ht_buf)
            _ll_round(ll_buf)
        ht_buf.destroy()
        _ll_round(ll_buf)  # NVSHMEM stays up for the remaining Buffer
        ll_buf.destroy()
