"""pytest-benchmark cases for the HT reference workload (4096 tokens, hidden 7168, top-8, 256 experts) on 2 GPUs.

The test process is rank 0 and times whole calls with pytest-benchmark (L2 flushed in setup); the peer
(tests/bench/two_ranks.py) is rank 1 and makes the same calls. Kernel times
(CUDA events around each kernel) and DeepEP-formula bandwidths go into each benchmark's extra_info.
Run with: python -m pytest -m bench tests/bench
"""

import statistics

import pytest
import torch
import torch.distributed as dist

from ep_rt import Buffer, Config
from ep_rt.testing.bench import ht_inputs

from . import two_ranks

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

TOKENS, HIDDEN, TOPK, EXPERTS, SMS = 4096, 7168, 8, 256, 24
WARMUP, ROUNDS = 5, 30


def _calls(buf, case, sets):
    """The per-call closure for a case, identical on both ranks; returns (fn, bytes per call)."""
    config = Config(SMS, 6, 256, 6, 128)
    x, x_fp8, idx, w = sets[0]
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, EXPERTS)
    args = dict(
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
        config=config,
    )
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, **args)
    n = recv_x.size(0)
    if case == "dispatch_bf16":
        return (lambda: buf.dispatch(x, **args)), n * HIDDEN * 2
    if case == "dispatch_fp8":
        return (lambda: buf.dispatch(x_fp8, **args)), n * HIDDEN * 2 * (1 + 4 / 128) / 2
    return (lambda: buf.combine(recv_x, handle, topk_weights=recv_w, config=config)), n * HIDDEN * 2


def _setup(rank):
    buf = Buffer(dist.group.WORLD, Config(SMS).get_nvl_buffer_size_hint(HIDDEN * 2, 2, TOKENS), explicitly_destroy=True)
    return buf, ht_inputs(TOKENS, HIDDEN, TOPK, EXPERTS, buf.device, copies=1, seed=rank)


def _make_call(buf, case, sets):
    return _calls(buf, case, sets)[0]


@pytest.fixture(scope="module")
def pair():
    yield from two_ranks.pair(_setup, _make_call, WARMUP + ROUNDS)


@pytest.mark.parametrize("case", ["dispatch_bf16", "dispatch_fp8", "combine_bf16"])
def test_ht(benchmark, pair, case):
    buf, sets = pair
    two_ranks.announce(case)
    fn, nbytes = _calls(buf, case, sets)
    kernel = "combine" if case.startswith("combine") else "dispatch"
    times = two_ranks.timed_ht_kernels(benchmark, buf, fn, ROUNDS, WARMUP)[kernel][WARMUP:]
    kernel_us = statistics.median(times)
    benchmark.extra_info.update(
        kernel=kernel,
        kernel_us_median=round(kernel_us, 1),
        num_sms=SMS,
        gbps_deepep_formula=round(nbytes / kernel_us / 1e3, 1),
    )
    assert len(times) == ROUNDS
