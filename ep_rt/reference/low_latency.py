"""Plain-torch reference semantics of ep_rt's low-latency (LL) dispatch / combine and LogFMT-10.

Like ``ep_rt.reference`` (the high-throughput oracle) this module simulates *all ranks of a
collective at once*: ``xs[r]`` is what rank ``r`` passes in and ``out[me]`` is what rank ``me``
gets back. Everything is deterministic, uses only torch and works on CPU and CUDA tensors. It is
the oracle of the GPU tests, so it is written for obviousness, not speed.

Notation: R ranks, E experts, L = E // R local experts per rank, T =
num_max_dispatch_tokens_per_rank, H hidden, S = H // 128, K top-k, N_r tokens on rank r
(N_r <= T). Expert e lives on rank e // L as local expert e % L.
See docs/deepep-v1-reference.md sections 2.7 (LL dispatch), 2.8 (LL combine, LogFMT) and 2.9
(masked ranks).

Differences to the GPU that tests must respect:

* Receive layout: on the GPU, the order of the per-source blocks of an expert and the order of rows
  inside a block come from atomics (nondeterministic); only ``packed_recv_layout_range`` describes
  it. The reference fixes one order: blocks by source rank ascending, rows by (t, k) ascending.
* Rows past ``packed_recv_count[l]`` are zero here and undefined on the GPU. An empty block (count 0,
  e.g. from a masked source) gets begin = the running sum here; compare begins only where count > 0.
* The GPU returns ``packed_recv_x_scales`` with column-major strides in the last two dims; the
  reference returns a contiguous tensor with the same logical shape and values.
* LogFMT: the GPU uses the approximate ``lg2.approx`` / ``ex2.approx`` instructions, so GPU LogFMT
  results are to be compared against this reference with a tolerance, not bit for bit.
"""

import torch

from ._checks import (
    _check_experts,
    _check_masked,
    _check_per_rank,
    _check_ranks,
    _check_tensor,
    _check_topk_idx,
    _pack_range,
)
from .fp8 import per_token_cast_to_fp8
from .logfmt import LOGFMT_DIVISION, logfmt_roundtrip


# ----------------------------------------------------------------------------------------
# LL dispatch
# ----------------------------------------------------------------------------------------
def low_latency_dispatch(
    xs,
    topk_idxs,
    num_max_dispatch_tokens_per_rank,
    num_experts,
    use_fp8=True,
    round_scale=False,
    use_ue8m0=False,
    masked_ranks=(),
):
    """Simulates an LL dispatch on all R = len(xs) ranks.

    xs[r]: bf16 [N_r, H]; topk_idxs[r]: int64 or int32 [N_r, K] with values in [-1, E) (-1 = no selection).
    Every selection (s, t, k) with e = topk_idxs[s][t, k] >= 0 of a source rank s not in
    masked_ranks sends token t of rank s to rank e // L, local expert l = e % L (a token that
    selects the same expert twice is sent twice). On the receiver, block (l, s) holds rank s's rows
    for l in ascending (t, k) order and blocks are laid out by s ascending.

    Returns per rank me a dict:
      packed_recv_x            [L, R*T, H] fp8 e4m3 (per_token_cast_to_fp8 on the source) or bf16
      packed_recv_x_scales     None (bf16), f32 [L, R*T, S], or int32 [L, R*T, S // 4] (use_ue8m0)
      packed_recv_src_info     int32 [L, R*T]: source token index t of each valid row
      packed_recv_layout_range int64 [L, R]: (begin << 32) | count of block (l, s)
      packed_recv_count        int32 [L]: valid rows per local expert
      num_recv_per_expert_and_source int32 [L, R]
    Rows past the valid count are zero (undefined on the GPU).
    Unlike DeepEP (which asserts H % 512 == 0 for fp8), plain fp8 needs only H % 128 == 0; H % 512
    is required with use_ue8m0 (which also requires round_scale). Without use_fp8, round_scale and
    use_ue8m0 have no effect.
    """
    if not isinstance(xs, (list, tuple)) or len(xs) < 1:
        raise ValueError("xs must be a non-empty list with one entry per rank")
    R = len(xs)
    _check_per_rank(topk_idxs, "topk_idxs", R)
    _check_experts(num_experts, R)
    T = num_max_dispatch_tokens_per_rank
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"num_max_dispatch_tokens_per_rank must be a positive int, got {T!r}")
    if use_ue8m0 and not round_scale:
        raise ValueError("use_ue8m0 requires round_scale=True")
    masked = _check_masked(masked_ranks, R)
    L = num_experts // R

    H = None
    K = None
    for r in range(R):
        _check_tensor(xs[r], f"xs[{r}]", torch.bfloat16, 2)
        n, h = xs[r].shape
        if H is None:
            H = h
        if h != H:
            raise ValueError(f"xs[{r}] hidden size {h} differs from xs[0] ({H})")
        if n > T:
            raise ValueError(f"xs[{r}] has {n} tokens > num_max_dispatch_tokens_per_rank ({T})")
        _check_topk_idx(topk_idxs[r], num_experts, f"topk_idxs[{r}]")
        if topk_idxs[r].shape[0] != n:
            raise ValueError(f"topk_idxs[{r}] has {topk_idxs[r].shape[0]} rows != {n} tokens of xs[{r}]")
        if K is None:
            K = topk_idxs[r].shape[1]
        if topk_idxs[r].shape[1] != K:
            raise ValueError(f"topk_idxs[{r}] has top-k {topk_idxs[r].shape[1]} != {K} of topk_idxs[0]")
    if H % 128 != 0:
        raise ValueError(f"hidden size {H} must be a multiple of 128")
    if use_fp8 and use_ue8m0 and H % 512 != 0:
        raise ValueError(f"hidden size {H} must be a multiple of 512 with use_ue8m0")
    S = H // 128
    dev = xs[0].device

    # Payload of every source token, cast on the SOURCE rank (per token, so casting all at once is
    # the same as casting each token alone).
    payloads, scaless = [], []
    for s in range(R):
        if use_fp8 and xs[s].shape[0] == 0:  # (pack_ue8m0 cannot reshape an empty tensor)
            data = torch.zeros(0, H, dtype=torch.float8_e4m3fn, device=dev)
            scales = torch.zeros(
                0, S // 4 if use_ue8m0 else S, dtype=torch.int32 if use_ue8m0 else torch.float32, device=dev
            )
        elif use_fp8:
            data, scales = per_token_cast_to_fp8(xs[s], round_scale=round_scale, use_ue8m0=use_ue8m0)
        else:
            data, scales = xs[s], None
        payloads.append(data)
        scaless.append(scales)

    x_dtype = torch.float8_e4m3fn if use_fp8 else torch.bfloat16
    results = []
    for me in range(R):
        recv_x = torch.zeros(L, R * T, H, dtype=x_dtype, device=dev)
        recv_scales = None
        if use_fp8:
            recv_scales = torch.zeros(
                L, R * T, S // 4 if use_ue8m0 else S, dtype=torch.int32 if use_ue8m0 else torch.float32, device=dev
            )
        src_info = torch.zeros(L, R * T, dtype=torch.int32, device=dev)
        layout_range = torch.zeros(L, R, dtype=torch.int64, device=dev)
        counts = torch.zeros(L, R, dtype=torch.int32, device=dev)
        recv_count = torch.zeros(L, dtype=torch.int32, device=dev)
        for l in range(L):
            e = me * L + l
            begin = 0
            for s in range(R):
                if s in masked:
                    layout_range[l, s] = _pack_range(begin, 0)
                    continue
                # (t, k) pairs with topk_idxs[s][t, k] == e in ascending (row-major) order.
                tk = (topk_idxs[s] == e).nonzero()
                t = tk[:, 0]
                n = t.numel()
                rows = torch.arange(begin, begin + n, device=dev)
                recv_x[l, rows] = payloads[s][t]
                if recv_scales is not None:
                    recv_scales[l, rows] = scaless[s][t]
                src_info[l, rows] = t.to(torch.int32)
                layout_range[l, s] = _pack_range(begin, n)
                counts[l, s] = n
                begin += n
            recv_count[l] = begin
        results.append(
            {
                "packed_recv_x": recv_x,
                "packed_recv_x_scales": recv_scales,
                "packed_recv_src_info": src_info,
                "packed_recv_layout_range": layout_range,
                "packed_recv_count": recv_count,
                "num_recv_per_expert_and_source": counts,
            }
        )
    return results


# ----------------------------------------------------------------------------------------
# LL combine
# ----------------------------------------------------------------------------------------
def _position_in_block(topk_idx, num_experts):
    """pos[t, k] = number of selections (t', k') < (t, k) (row-major) of the same expert; -1 where
    topk_idx < 0. This is the row of (t, k) inside its (expert, source) block."""
    N, K = topk_idx.shape
    flat = topk_idx.reshape(-1)
    experts = torch.arange(num_experts, device=topk_idx.device)
    onehot = (flat.unsqueeze(1) == experts).to(torch.int64)  # [N*K, E]
    csum = torch.cumsum(onehot, dim=0)  # inclusive counts
    pos = csum.gather(1, flat.clamp(min=0).unsqueeze(1)).squeeze(1) - 1
    return torch.where(flat >= 0, pos, torch.full_like(pos, -1)).reshape(N, K)


def low_latency_combine(
    expert_outs, topk_idxs, topk_weights, dispatch_results, masked_ranks=(), use_logfmt=False, ranks=None
):
    """Simulates an LL combine on all R = len(expert_outs) ranks (weighted sum, unlike HT combine).

    expert_outs[r]: bf16 [L, R*T, H] in rank r's packed receive layout (dispatch_results[r]).
    topk_idxs[r] int64 or int32 / topk_weights[r] float32 [N_r, K]: the ORIGINAL routing of rank r's tokens.
    For rank me and token t, in float32 and exactly this order:
        acc = 0
        for k = 0 .. K-1:
            e = topk_idxs[me][t, k]; skip if e < 0 or e // L in masked_ranks
            row = row of (me, t, k) in block (e % L, me) of rank o = e // L
                = begin(e % L, me) + (selections (t', k') < (t, k) of e on rank me)
            y = expert_outs[o][e % L, row]            (logfmt_roundtrip(y) with use_logfmt)
            acc = acc + (w * y)   with w = topk_weights[me][t, k]: f32 multiply, then f32 add
        combined_x[t] = bf16(acc)
    Returns per rank {"combined_x": bf16 [N_me, H]}; for a rank in masked_ranks combined_x is None
    (its tokens were never dispatched; its result is undefined on the GPU).
    ranks: compute combined_x only for these ranks (default: every rank); the others get None. Each rank's sum
    reads only the inputs above, so a test rank that checks its own output need not pay for all R (R x the work:
    16 ranks sharing one GPU spent minutes here).
    """
    if not isinstance(expert_outs, (list, tuple)) or len(expert_outs) < 1:
        raise ValueError("expert_outs must be a non-empty list with one entry per rank")
    R = len(expert_outs)
    _check_per_rank(topk_idxs, "topk_idxs", R)
    _check_per_rank(topk_weights, "topk_weights", R)
    _check_per_rank(dispatch_results, "dispatch_results", R)
    masked = _check_masked(masked_ranks, R)
    wanted = set(range(R)) if ranks is None else _check_ranks(ranks, R)

    _check_tensor(expert_outs[0], "expert_outs[0]", torch.bfloat16, 3)
    L, RT, H = expert_outs[0].shape
    if L < 1 or RT % R != 0 or RT < R:
        raise ValueError(f"expert_outs[0] shape {tuple(expert_outs[0].shape)} is not [L, R*T, H] for R = {R}")
    T = RT // R
    E = L * R
    if use_logfmt and H % LOGFMT_DIVISION != 0:
        raise ValueError(f"hidden size {H} must be a multiple of {LOGFMT_DIVISION} with use_logfmt")
    K = None
    for r in range(R):
        _check_tensor(expert_outs[r], f"expert_outs[{r}]", torch.bfloat16, 3)
        if tuple(expert_outs[r].shape) != (L, RT, H):
            raise ValueError(f"expert_outs[{r}] shape {tuple(expert_outs[r].shape)} != {(L, RT, H)}")
        _check_topk_idx(topk_idxs[r], E, f"topk_idxs[{r}]")
        n, k = topk_idxs[r].shape
        K = k if K is None else K
        if k != K:
            raise ValueError(f"topk_idxs[{r}] has top-k {k} != {K} of topk_idxs[0]")
        if n > T:
            raise ValueError(f"topk_idxs[{r}] has {n} tokens > num_max_dispatch_tokens_per_rank ({T})")
        _check_tensor(topk_weights[r], f"topk_weights[{r}]", torch.float32, 2)
        if tuple(topk_weights[r].shape) != (n, K):
            raise ValueError(f"topk_weights[{r}] shape {tuple(topk_weights[r].shape)} != {(n, K)}")
        lr = dispatch_results[r]["packed_recv_layout_range"]
        _check_tensor(lr, f"dispatch_results[{r}]['packed_recv_layout_range']", torch.int64, 2)
        if tuple(lr.shape) != (L, R):
            raise ValueError(f"dispatch_results[{r}]['packed_recv_layout_range'] shape {tuple(lr.shape)} != {(L, R)}")
        si = dispatch_results[r]["packed_recv_src_info"]
        _check_tensor(si, f"dispatch_results[{r}]['packed_recv_src_info']", torch.int32, 2)
        if tuple(si.shape) != (L, RT):
            raise ValueError(f"dispatch_results[{r}]['packed_recv_src_info'] shape {tuple(si.shape)} != {(L, RT)}")

    ys = [logfmt_roundtrip(o) if use_logfmt else o for o in expert_outs]
    results = []
    for me in range(R):
        if me in masked or me not in wanted:
            results.append({"combined_x": None})
            continue
        idx, w = topk_idxs[me], topk_weights[me]
        N = idx.shape[0]
        dev = expert_outs[me].device
        pos = _position_in_block(idx, E)
        tokens = torch.arange(N, device=dev)
        acc = torch.zeros(N, H, dtype=torch.float32, device=dev)
        for k in range(K):
            e = idx[:, k]
            for o in range(R):
                if o in masked:
                    continue
                sel = (e >= 0) & (e // L == o)
                if not bool(sel.any()):
                    continue
                t = tokens[sel]
                l = e[sel] % L
                lr = dispatch_results[o]["packed_recv_layout_range"][:, me].to(dev)
                begin, count = lr[l] >> 32, lr[l] & 0xFFFFFFFF
                p = pos[sel, k]
                row = begin + p
                src = dispatch_results[o]["packed_recv_src_info"].to(dev)
                if not bool((p < count).all()) or not bool((src[l, row] == t.to(torch.int32)).all()):
                    raise ValueError(
                        f"dispatch_results[{o}] does not match topk_idxs[{me}] (block of source "
                        f"rank {me} is missing rows or is not in ascending (t, k) order)"
                    )
                y = ys[o][l, row].float()  # [n_sel, H]
                prod = w[sel, k].unsqueeze(1) * y  # f32 multiply, rounded to f32
                acc[t] = acc[t] + prod  # separate f32 add (no FMA)
        results.append({"combined_x": acc.to(torch.bfloat16)})
    return results
