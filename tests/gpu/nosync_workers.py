"""Per-rank bodies of tests/gpu/test_no_sync_gpu.py (issue 23 item 1): the hot calls under torch's sync debug mode,
and a bad expert id on one rank, reported by the layout family's kernels."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ep_rt import Buffer
from ep_rt.errors import KernelError
from ep_rt.testing import checker, selfcheck_ht, selfcheck_ll

MB = 1 << 20
HT = selfcheck_ht.Case("no-sync round", num_tokens=256, hidden=1024, num_topk=8, num_experts=32)
LL = selfcheck_ll.LLCase("no-sync LL round", max_tokens=64, num_tokens=48, hidden=1024, num_experts=32)


def _buffer(num_ranks):
    rdma = Buffer.get_low_latency_rdma_size_hint(LL.max_tokens, LL.hidden, num_ranks, LL.num_experts)
    return Buffer(dist.group.WORLD, 256 * MB, rdma, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)


def _inputs(buf, seed):
    g = torch.Generator(device=buf.device).manual_seed(seed + buf.rank)
    x = torch.randn(HT.num_tokens, HT.hidden, generator=g, device=buf.device).to(torch.bfloat16)
    scores = torch.rand(HT.num_tokens, HT.num_experts, generator=g, device=buf.device)
    idx = torch.topk(scores, HT.num_topk).indices
    w = torch.rand(HT.num_tokens, HT.num_topk, generator=g, device=buf.device)
    return x, idx, w


def hot_calls_without_a_sync(rank, num_ranks):
    """A checked round of each mode first (warm-up, bit-exact with the reference), then every hot call with
    torch.cuda.set_sync_debug_mode("error"): any device sync torch makes in them raises."""
    buf = _buffer(num_ranks)
    seed = checker.shared_seed(buf.group)
    checks = [selfcheck_ht.run_case(buf, HT, seed), selfcheck_ll.run_ll_case(buf, LL, seed + 1)]
    failures = [f for c in checks for f in c.failures]
    x, idx, w = _inputs(buf, seed + 2)
    ll_x, ll_idx, ll_w = x[: LL.num_tokens], idx[: LL.num_tokens], w[: LL.num_tokens]
    y = torch.randn(LL.num_experts // num_ranks, num_ranks * LL.max_tokens, LL.hidden, device=buf.device)
    y = y.to(torch.bfloat16)
    synced, out = [], {}

    def run(name, fn):
        try:
            out[name] = fn()
            return out[name]
        except RuntimeError as e:  # what sync debug mode "error" raises
            synced.append(f"{name}: {e}")
            raise

    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.set_sync_debug_mode("error")
    try:
        per_rank, _, per_expert, in_rank, _ = run("layout", lambda: buf.get_dispatch_layout(idx, HT.num_experts))
        common = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
        recv_x, _, recv_w, _, handle, _ = run(
            "dispatch", lambda: buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        )
        run("cached dispatch", lambda: buf.dispatch(x, handle=handle))
        run("combine", lambda: buf.combine(recv_x, handle, topk_weights=recv_w))
        worst = num_ranks * HT.num_tokens
        run(
            "dispatch, num_worst_tokens",
            lambda: buf.dispatch(x, topk_idx=idx, topk_weights=w, num_worst_tokens=worst, **common),
        )
        _, _, ll_handle, _, _ = run(
            "LL dispatch", lambda: buf.low_latency_dispatch(ll_x, ll_idx, LL.max_tokens, LL.num_experts)
        )
        run("LL combine", lambda: buf.low_latency_combine(y, ll_idx, ll_w, ll_handle))
    except RuntimeError:
        pass  # (recorded in `synced`; the peers' calls may now time out, which the test reports too)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    buf.raise_if_failed()
    buf.destroy()
    return {"seed": seed, "failures": failures, "synced": synced, "checks": sum(c.checks for c in checks)}


def one_rank_with_a_bad_id(rank, num_ranks):
    """Rank 0's topk_idx holds num_experts once: rank 0's dispatch raises KernelError at its end (naming the id),
    every other rank's completes, and the next round is bit-exact on every rank with the same Buffer."""
    buf = _buffer(num_ranks)
    seed = checker.shared_seed(buf.group)
    x, idx, w = _inputs(buf, seed)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, HT.num_experts)
    if rank == 0:
        idx = idx.clone()
        idx[3, 1] = HT.num_experts
    error = None
    try:
        buf.dispatch(
            x,
            topk_idx=idx,
            topk_weights=w,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
        )
    except KernelError as e:
        error = str(e)
    torch.cuda.synchronize()
    dist.barrier()
    chk = selfcheck_ht.run_case(buf, HT, seed + 1)
    buf.destroy()
    return {"seed": seed, "error": error, "checks": chk.checks, "failures": chk.failures[:5]}
