"""Issue 25 item 1 on the CPU: the host path of the hot calls keeps no Python memory per call. The real Buffer runs
LL dispatch and combine (plain and with a receive hook) and HT dispatch, combine and cached dispatch with CUDA
stubbed (tests/host_trace.py, no trace recorded, stand-in tensors freed); tracemalloc compares the Python heap after a
warm-up with the heap after many more calls. Growth on a GPU outside Python's heap (the driver, torch's allocator)
is what the GPU soaks sample (ep_rt/testing/memory.py)."""

import gc
import tracemalloc

import pytest
import torch

from .. import host_trace

WARMUP, CALLS = 300, 3000
LIMIT_BYTES_PER_ROUND = 4  # a list or dict that grew by one entry a round would take 50 or more


def _ll_round(buf, state):
    idx, x, w, y = state
    _, _, handle, _, _ = buf.low_latency_dispatch(x, idx, 8, host_trace.E, use_fp8=False)
    buf.low_latency_combine(y, idx, w, handle)
    _, _, _, _, hook = buf.low_latency_dispatch(x, idx, 8, host_trace.E, return_recv_hook=True)
    hook()


def _ll_state(buf):
    idx, x, w, _ = host_trace._inputs(buf.group_size)
    y = torch.zeros(host_trace.E // buf.group_size, buf.group_size * 8, host_trace.H, dtype=torch.bfloat16)
    return idx, x, w, y


def _ht_round(buf, state):
    x, idx, w, common = state
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
    buf.combine(recv_x, handle, topk_weights=recv_w)
    buf.dispatch(x, handle=handle)


@pytest.mark.parametrize(
    "scenario, make_state, one_round",
    [("low latency, shrink, no NVL", _ll_state, _ll_round), ("intranode", host_trace.ht_inputs, _ht_round)],
    ids=["low latency", "intranode"],
)
def test_the_hot_calls_keep_no_python_memory(monkeypatch, scenario, make_state, one_round):
    with host_trace.driven(scenario) as (trace, make):
        buf = make()
        state = make_state(buf)
        monkeypatch.setattr(host_trace, "KEEP_TENSORS", False)
        monkeypatch.setattr(trace, "add", lambda *a: None)
        for _ in range(WARMUP):
            one_round(buf, state)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for _ in range(CALLS):
                one_round(buf, state)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        monkeypatch.setattr(host_trace, "KEEP_TENSORS", True)
        buf.destroy()
    assert grown < LIMIT_BYTES_PER_ROUND * CALLS, f"the Python heap grew by {grown} bytes over {CALLS} rounds"
