"""Low-latency GPU checks against ep_rt.reference_ll, shared by the GPU tests and `python -m ep_rt`.

ep_rt's LL layout is deterministic (blocks by source rank, rows in token-major order, as the reference),
so counts, layout ranges, source indices, payload bits, scales and the combined output (a weighted sum in
a fixed order, no FMA) are all compared exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import reference_ll
from .selfcheck import Checker


@dataclass(frozen=True)
class LLCase:
    name: str
    max_tokens: int = 128       # T
    num_tokens: int = 100       # per rank (rank 0 gets 0 tokens when zero_rank0)
    hidden: int = 1024
    num_topk: int = 8
    num_experts: int = 32
    use_fp8: bool = True
    round_scale: bool = False
    use_ue8m0: bool = False
    hook: bool = False
    async_finish: bool = False
    zero_copy: bool = False
    out: bool = False
    stats: bool = False
    holes: bool = True          # -1 entries in topk_idx
    zero_rank0: bool = False
    rounds: int = 1             # consecutive dispatch+combine pairs (both buffers in turn)


def ll_cases(num_ranks: int) -> list[LLCase]:
    return [
        LLCase("bf16", use_fp8=False),
        LLCase("fp8", rounds=3),
        LLCase("fp8 round_scale", round_scale=True),
        LLCase("fp8 ue8m0", round_scale=True, use_ue8m0=True, hidden=2048),
        LLCase("hooks", hook=True, rounds=2),
        LLCase("async", async_finish=True),
        LLCase("zero_copy + out", zero_copy=True, out=True),
        LLCase("stats", stats=True),
        LLCase("a rank with zero tokens", zero_rank0=True),
        LLCase("no -1 entries, top-16", holes=False, num_topk=16, num_experts=64),
        LLCase("hidden 1152 (not a multiple of 512)", hidden=1152),
        LLCase("hidden 16384", hidden=16384, num_tokens=32, max_tokens=32),
        LLCase("T=1024", max_tokens=1024, num_tokens=1000, hidden=1024, num_topk=4),
        LLCase("LL reference shape (128 x 7168, top-8, 288 experts)", hidden=7168, num_tokens=128,
               num_experts=288),
    ]


def ll_inputs(case: LLCase, seed: int, num_ranks: int, device):
    xs, idxs, ws = [], [], []
    for r in range(num_ranks):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        n = 0 if (case.zero_rank0 and r == 0) else case.num_tokens
        x = torch.randn(n, case.hidden, generator=g).to(torch.bfloat16)
        scores = torch.rand(n, case.num_experts, generator=g)
        idx = torch.topk(scores, case.num_topk, dim=1).indices if n else torch.empty(0, case.num_topk,
                                                                                    dtype=torch.int64)
        if case.holes and n:
            idx = torch.where(torch.rand(idx.shape, generator=g) < 0.15, torch.full_like(idx, -1), idx)
        w = torch.rand(n, case.num_topk, generator=g)
        xs.append(x.to(device))
        idxs.append(idx.to(device))
        ws.append(w.to(device))
    return xs, idxs, ws


def expert_outputs(seed: int, rank: int, L: int, R: int, T: int, H: int, device) -> torch.Tensor:
    """Rank `rank`'s expert output for (local expert, source rank, source token), identical on every process."""
    g = torch.Generator(device=device).manual_seed(seed * 7 + 11 + rank)
    return torch.randn(L, R, T, H, generator=g, device=device).to(torch.bfloat16)


def to_packed(y: torch.Tensor, src_info: torch.Tensor, layout_range: torch.Tensor, T: int) -> torch.Tensor:
    """Place y[l, s, t] at the packed rows that (src_info, layout_range) describe; other rows are zero."""
    L, R = layout_range.shape
    out = torch.zeros(L, R * T, y.size(-1), dtype=y.dtype, device=y.device)
    for l in range(L):
        for s in range(R):
            begin, n = int(layout_range[l, s]) >> 32, int(layout_range[l, s]) & 0xFFFFFFFF
            if n:
                t = src_info[l, begin:begin + n].long()
                out[l, begin:begin + n] = y[l, s, t]
    return out


def _blocks(chk: Checker, what: str, got_x, got_scales, got_src, got_range, want, L: int, R: int) -> None:
    """Compare the valid rows of every local expert (rows past the count are undefined on the GPU)."""
    for l in range(L):
        n = int(want["packed_recv_count"][l])
        chk.equal(f"{what} src_info[{l}]", got_src[l, :n], want["packed_recv_src_info"][l, :n])
        chk.equal(f"{what} x[{l}]", got_x[l, :n], want["packed_recv_x"][l, :n])
        if got_scales is not None:
            chk.equal(f"{what} scales[{l}]", got_scales[l, :n], want["packed_recv_x_scales"][l, :n])


def run_ll_case(buffer, case: LLCase, seed: int) -> Checker:
    R, me, dev = buffer.group_size, buffer.rank, buffer.device
    chk = Checker(case)
    T, H, E = case.max_tokens, case.hidden, case.num_experts
    L = E // R
    stats = torch.zeros(L, dtype=torch.int32, device=dev) if case.stats else None
    wait_stats = torch.zeros(R, dtype=torch.int64, device=dev) if case.stats else None
    for rnd in range(case.rounds):
        s = seed * 31 + rnd
        xs, idxs, ws = ll_inputs(case, s, R, dev)
        want = reference_ll.low_latency_dispatch(xs, idxs, T, E, use_fp8=case.use_fp8, round_scale=case.round_scale,
                                                 use_ue8m0=case.use_ue8m0)
        recv, count, handle, event, hook = buffer.low_latency_dispatch(
            xs[me], idxs[me], T, E, cumulative_local_expert_recv_stats=stats, dispatch_wait_recv_cost_stats=wait_stats,
            use_fp8=case.use_fp8, round_scale=case.round_scale, use_ue8m0=case.use_ue8m0,
            async_finish=case.async_finish, return_recv_hook=case.hook)
        if case.hook:
            hook()
        if case.async_finish:
            event.current_stream_wait()
        recv_x, scales = recv if case.use_fp8 else (recv, None)
        mine = want[me]
        chk.equal(f"round {rnd} packed_recv_count", count, mine["packed_recv_count"])
        chk.equal(f"round {rnd} layout_range", handle[1], mine["packed_recv_layout_range"])
        _blocks(chk, f"round {rnd}", recv_x, scales, handle[0], handle[1], mine, L, R)
        if case.stats:
            chk.equal("cumulative_local_expert_recv_stats", stats, mine["packed_recv_count"] * (rnd + 1))
            chk.equal("dispatch_wait_recv_cost_stats is non-negative", [bool((wait_stats >= 0).all())], [True])

        # Combine: outputs defined per (l, source, token), placed at each side's own packed rows.
        ys = [expert_outputs(s, r, L, R, T, H, dev) for r in range(R)]
        ref_in = [to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T)
                  for r in range(R)]
        ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want)[me]["combined_x"]
        x = to_packed(ys[me], handle[0], handle[1], T)
        out = torch.empty(xs[me].size(0), H, dtype=torch.bfloat16, device=dev) if case.out else None
        if case.zero_copy:
            buffer.get_next_low_latency_combine_buffer(handle).copy_(x)
        combined, event, hook = buffer.low_latency_combine(
            x, idxs[me], ws[me], handle, zero_copy=case.zero_copy, async_finish=case.async_finish,
            return_recv_hook=case.hook, out=out)
        if case.hook:
            hook()
        if case.async_finish:
            event.current_stream_wait()
        if out is not None:
            chk.equal("combine returns out", [combined.data_ptr() == out.data_ptr()], [True])
        chk.equal(f"round {rnd} combined_x", combined, ref)
    torch.cuda.synchronize()
    buffer.raise_if_failed()
    return chk


def run_ll_graph(buffer, seed: int, replays: int = 5) -> Checker:
    """Capture dispatch + combine in one CUDA graph; replay with new inputs copied in, check every replay."""
    case = LLCase("cuda graph", num_tokens=64, max_tokens=64, hidden=2048, num_experts=16)
    R, me, dev = buffer.group_size, buffer.rank, buffer.device
    T, H, E = case.max_tokens, case.hidden, case.num_experts
    L = E // R
    chk = Checker(case)
    xs, idxs, ws = ll_inputs(case, seed, R, dev)
    x_in, idx_in, w_in = xs[me].clone(), idxs[me].clone(), ws[me].clone()
    y_in = torch.zeros(L, R * T, H, dtype=torch.bfloat16, device=dev)
    # Warm up (both buffers), then capture.
    for _ in range(2):
        recv, count, handle, _, _ = buffer.low_latency_dispatch(x_in, idx_in, T, E)
        buffer.low_latency_combine(y_in, idx_in, w_in, handle)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, count, handle, _, _ = buffer.low_latency_dispatch(x_in, idx_in, T, E)
        combined, _, _ = buffer.low_latency_combine(y_in, idx_in, w_in, handle)
    for rep in range(replays):
        s = seed * 17 + rep
        xs, idxs, ws = ll_inputs(case, s, R, dev)
        want = reference_ll.low_latency_dispatch(xs, idxs, T, E)
        ys = [expert_outputs(s, r, L, R, T, H, dev) for r in range(R)]
        ref_in = [to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T)
                  for r in range(R)]
        ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want)[me]["combined_x"]
        # New inputs into the captured tensors; the layout is deterministic, so the expert outputs can be
        # placed before the replay runs the dispatch that produces that layout.
        x_in.copy_(xs[me])
        idx_in.copy_(idxs[me])
        w_in.copy_(ws[me])
        y_in.copy_(ref_in[me])
        graph.replay()
        torch.cuda.synchronize()
        recv_x, scales = recv
        chk.equal(f"replay {rep} count", count, want[me]["packed_recv_count"])
        chk.equal(f"replay {rep} layout_range", handle[1], want[me]["packed_recv_layout_range"])
        _blocks(chk, f"replay {rep}", recv_x, scales, handle[0], handle[1], want[me], L, R)
        chk.equal(f"replay {rep} combined_x", combined, ref)
    buffer.raise_if_failed()
    return chk
