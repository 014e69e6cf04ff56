"""The smoke round of `python -m ep_rt doctor`: one small intranode dispatch + combine and one low-latency dispatch +
combine per rank, each checked bit for bit against ep_rt.reference (the shared selfcheck rounds, small shapes)."""

from __future__ import annotations

import torch.distributed as dist

from .checker import shared_seed
from .selfcheck_ht import Case, run_case
from .selfcheck_ll import LLCase, run_ll_case

HT_CASE = Case("doctor smoke", num_tokens=256, hidden=1024, num_topk=4, num_experts=16, routing="holes")
LL_CASE = LLCase("doctor smoke", max_tokens=64, num_tokens=50, hidden=1024, num_topk=4, num_experts=16)


def smoke_ht(rank, num_ranks):
    """(checks, failures) of layout, dispatch, cached dispatch and combine on this rank."""
    from .. import Buffer, Config

    c = HT_CASE
    buffer = Buffer(
        dist.group.WORLD,
        Config(c.num_sms).get_nvl_buffer_size_hint(c.hidden * 2, num_ranks, c.num_tokens),
        explicitly_destroy=True,
    )
    try:
        chk = run_case(buffer, c, shared_seed(buffer.group))
    finally:
        buffer.destroy()
    return chk.checks, chk.failures


def smoke_ll(rank, num_ranks):
    """(checks, failures) of a low-latency dispatch and combine on this rank."""
    from .. import Buffer

    c = LL_CASE
    hint = Buffer.get_low_latency_rdma_size_hint(c.max_tokens, c.hidden, num_ranks, c.num_experts)
    buffer = Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
    try:
        chk = run_ll_case(buffer, c, shared_seed(buffer.group))
    finally:
        buffer.destroy()
    return chk.checks, chk.failures
