"""pytest-benchmark cases for the internode workload (4096 tokens, hidden 7168, top-8, 256 experts) on 2 GPUs as
2 emulated nodes of 1 rank (EP_RT_RANKS_PER_NODE=1): the "RDMA" hop crosses NVLink between the two GPUs, so these
figures measure ep_rt's kernels and NVLink, not a network. DeepEP's internode metrics go into extra_info.
Run with: python -m pytest -m bench tests/bench (never run yet: it needs two GPUs)."""

import os
import statistics

import pytest
import torch
import torch.distributed as dist

from ep_rt import Buffer, Config
from ep_rt.testing.bench import IN_KERNELS, ht_inputs

from . import two_ranks

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

TOKENS, HIDDEN, TOPK, EXPERTS, SMS = 4096, 7168, 8, 256, 24
WARMUP, ROUNDS = 5, 30


def _calls(buf, case, sets):
    config = Config(SMS, 6, 256, 6, 128)
    x, x_fp8, idx, w = sets[0]
    per_rank, per_node, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, EXPERTS)
    args = dict(
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_node,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
        config=config,
    )
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, **args)
    n, rdma_tokens = recv_x.size(0), int(per_node.sum())
    if case == "dispatch_bf16":
        return (lambda: buf.dispatch(x, **args)), HIDDEN * 2, n, rdma_tokens
    if case == "dispatch_fp8":
        return (lambda: buf.dispatch(x_fp8, **args)), HIDDEN * (1 + 4 / 128), n, rdma_tokens
    return (lambda: buf.combine(recv_x, handle, topk_weights=recv_w, config=config)), HIDDEN * 2, n, rdma_tokens


def _setup(rank):
    os.environ["EP_RT_RANKS_PER_NODE"] = "1"
    cfg = Config(SMS)
    buf = Buffer(
        dist.group.WORLD,
        cfg.get_nvl_buffer_size_hint(HIDDEN * 2, 2, TOKENS),
        cfg.get_rdma_buffer_size_hint(HIDDEN * 2, 2, TOKENS),
        explicitly_destroy=True,
    )
    assert buf.topology.num_nodes == 2
    return buf, ht_inputs(TOKENS, HIDDEN, TOPK, EXPERTS, buf.device, copies=1, seed=rank)


def _make_call(buf, case, sets):
    return _calls(buf, case, sets)[0]


@pytest.fixture(scope="module")
def pair():
    old = os.environ.get("EP_RT_RANKS_PER_NODE")
    try:
        yield from two_ranks.pair(_setup, _make_call, WARMUP + ROUNDS)
    finally:  # the other benchmarks of this process see one node again
        if old is None:
            os.environ.pop("EP_RT_RANKS_PER_NODE", None)
        else:
            os.environ["EP_RT_RANKS_PER_NODE"] = old


@pytest.mark.parametrize("case", ["dispatch_bf16", "dispatch_fp8", "combine_bf16"])
def test_internode(benchmark, pair, case):
    buf, sets = pair
    two_ranks.announce(case)
    fn, row_bytes, num_recv, rdma_tokens = _calls(buf, case, sets)
    got = two_ranks.timed_ht_kernels(benchmark, buf, fn, ROUNDS, WARMUP)
    kernels = IN_KERNELS["combine" if case.startswith("combine") else "dispatch"]
    sums = [sum(v) for v in zip(*(got[k] for k in kernels))][WARMUP:]
    kernel_us = statistics.median(sums)
    benchmark.extra_info.update(
        kernels="+".join(kernels),
        kernel_us_median=round(kernel_us, 1),
        num_sms=SMS,
        rdma_gbps_deepep_metric=round(rdma_tokens * row_bytes / kernel_us / 1e3, 1),
        nvl_gbps_deepep_metric=round(num_recv * row_bytes / kernel_us / 1e3, 1),
        emulated_nodes=True,
    )
    assert len(sums) == ROUNDS
