"""pytest-benchmark cases for the LL reference workload (128 tokens, hidden 7168, top-8, 288 experts) on 2 GPUs.

The test process is rank 0 and times whole calls (Python + GPU, non-hook) with pytest-benchmark; the peer
(tests/bench/two_ranks.py) is rank 1 and makes the same calls. The GPU-side
numbers of ep_rt.testing.bench.bench_ll (kernel time, send and receive halves; the profiler's kernel durations when it
sees the kernels), measured by both ranks together once per module, go into each benchmark's extra_info with
DeepEP-formula bandwidth.
Run with: python -m pytest -m bench tests/bench
"""

import pytest
import torch
import torch.distributed as dist

from ep_rt import Buffer
from ep_rt.testing.bench import bench_ll, ll_inputs

from . import two_ranks

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

TOKENS, HIDDEN, TOPK, EXPERTS = 128, 7168, 8, 288
WARMUP, ROUNDS = 10, 50
ROW_NAMES = {
    "ll_dispatch_fp8": "LL dispatch FP8",
    "ll_combine_bf16": "LL combine BF16",
    "ll_combine_logfmt": "LL combine LogFMT",
}


def _buffer():
    hint = Buffer.get_low_latency_rdma_size_hint(TOKENS, HIDDEN, 2, EXPERTS)
    return Buffer(
        dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=EXPERTS // 2, explicitly_destroy=True
    )


def _call(buf, case, inputs):
    """The per-call closure for a case, identical on both ranks."""
    x, idx, w, y, y_castable = inputs
    _, _, handle, _, _ = buf.low_latency_dispatch(x, idx, TOKENS, EXPERTS)
    if case == "ll_dispatch_fp8":
        return lambda: buf.low_latency_dispatch(x, idx, TOKENS, EXPERTS)
    logfmt = case == "ll_combine_logfmt"
    return lambda: buf.low_latency_combine(y_castable if logfmt else y, idx, w, handle, use_logfmt=logfmt)


def _setup(rank):
    buf = _buffer()
    gpu_rows = {row["name"]: row for row in bench_ll(buf, TOKENS, HIDDEN, TOPK, EXPERTS)}  # both ranks together
    return buf, (ll_inputs(TOKENS, HIDDEN, TOPK, EXPERTS, 2, buf.device, seed=rank), gpu_rows)


def _make_call(buf, case, state):
    return _call(buf, case, state[0])


@pytest.fixture(scope="module")
def pair():
    yield from two_ranks.pair(_setup, _make_call, WARMUP + ROUNDS)


@pytest.mark.parametrize("case", list(ROW_NAMES))
def test_ll(benchmark, pair, case):
    buf, (inputs, gpu_rows) = pair
    two_ranks.announce(case)
    fn = _call(buf, case, inputs)

    def call():
        fn()
        torch.cuda.synchronize()

    benchmark.pedantic(call, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    row = gpu_rows[ROW_NAMES[case]]
    gpu = row["profiler"] or row["events"]  # the profiler's kernel times when it saw the kernels
    benchmark.extra_info.update(
        kernel_us_median=round(gpu["kernel"], 1),
        gbps_deepep_formula=round(row["gbps"], 1),
        send_half_us=round(gpu["send"], 1),
        recv_half_us=round(gpu["recv"], 1),
        timed_by="profiler" if row["profiler"] else "cuda events",
        events_kernel_us=round(row["events"]["kernel"], 1),
    )
    assert gpu["kernel"] > 0 and gpu["send"] > 0 and gpu["recv"] > 0
