"""Plain-torch reference semantics of ep_rt (DeepEP V1 compatible).

This module is the executable definition of what the GPU kernels must produce and
serves as the oracle for the GPU tests. It simulates *all ranks of a collective at
once*: every collective function takes one input per rank (``xs[r]`` is what rank
``r`` passes in) and returns one result per rank (``out[me]`` is what rank ``me``
gets back). Everything is deterministic, uses only torch, and works on CPU and CUDA
tensors (outputs live on the inputs' device).

Conventions: R = number of ranks, E = number of experts, L = E // R local experts per
rank, N_r = tokens on rank r, K = top-k, H = hidden size, C = number of channels.
See docs/deepep-v1-reference.md sections 2.1-2.3 (layout, dispatch, combine) and
2.7 (FP8 cast) for the semantics mirrored here.
"""
import torch

__all__ = [
    "dispatch_layout", "channel_ranges", "intranode_dispatch", "intranode_cached_dispatch",
    "intranode_combine", "per_token_cast_to_fp8", "per_token_cast_back", "pack_ue8m0",
    "unpack_ue8m0",
]

FP8_MAX = 448.0
FP8_MARGIN = 1e-4
NUM_RANKS_PER_NODE = 8


# ----------------------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------------------
def _check_tensor(t, name, dtype=None, ndim=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype not in (dtype if isinstance(dtype, tuple) else (dtype,)):
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")


def _check_topk_idx(topk_idx, num_experts, name="topk_idx"):
    _check_tensor(topk_idx, name, torch.int64, 2)
    if topk_idx.numel() > 0 and (topk_idx.min() < -1 or topk_idx.max() >= num_experts):
        raise ValueError(f"{name} values must lie in [-1, {num_experts}), got range "
                         f"[{int(topk_idx.min())}, {int(topk_idx.max())}]")


def _check_experts(num_experts, num_ranks):
    if num_ranks < 1 or num_experts < 1:
        raise ValueError(f"need num_experts >= 1 and num_ranks >= 1, got {num_experts}, {num_ranks}")
    if num_experts % num_ranks != 0:
        raise ValueError(f"num_experts ({num_experts}) must be divisible by num_ranks ({num_ranks})")


def _split_x(x, name):
    """Returns (data, scales-or-None) for a bf16 tensor or an (fp8, scales) tuple."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"{name} must be a bf16 tensor or an (fp8, scales) pair")
        data, scales = x
        _check_tensor(data, f"{name}[0]", torch.float8_e4m3fn, 2)
        _check_tensor(scales, f"{name}[1]", (torch.float32, torch.int32), 2)
        if scales.shape[0] != data.shape[0]:
            raise ValueError(f"{name}: scales rows ({scales.shape[0]}) != x rows ({data.shape[0]})")
        return data, scales
    _check_tensor(x, name, torch.bfloat16, 2)
    return x, None


# ----------------------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------------------
def dispatch_layout(topk_idx, num_experts, num_ranks):
    """Returns (num_tokens_per_rank i32[R], num_tokens_per_rdma_rank i32[R//8] or None,
    num_tokens_per_expert i32[E], is_token_in_rank bool[N, R]) for one rank's topk_idx."""
    _check_experts(num_experts, num_ranks)
    _check_topk_idx(topk_idx, num_experts)
    if num_ranks > NUM_RANKS_PER_NODE and num_ranks % NUM_RANKS_PER_NODE != 0:
        raise ValueError(f"num_ranks ({num_ranks}) > 8 must be a multiple of 8")
    epr = num_experts // num_ranks
    dev = topk_idx.device
    valid = topk_idx >= 0
    # Counting by comparison (no atomics, deterministic on every device).
    experts = torch.arange(num_experts, device=dev)
    num_tokens_per_expert = (topk_idx.unsqueeze(-1) == experts).sum(dim=(0, 1)).to(torch.int32)
    dst_rank = torch.where(valid, topk_idx // epr, torch.full_like(topk_idx, -1))
    ranks = torch.arange(num_ranks, device=dev)
    is_token_in_rank = (dst_rank.unsqueeze(-1) == ranks).any(dim=1)  # [N, R]
    num_tokens_per_rank = is_token_in_rank.sum(dim=0).to(torch.int32)
    num_tokens_per_rdma_rank = None
    if num_ranks > NUM_RANKS_PER_NODE:
        per_node = is_token_in_rank.view(-1, num_ranks // NUM_RANKS_PER_NODE, NUM_RANKS_PER_NODE)
        num_tokens_per_rdma_rank = per_node.any(dim=2).sum(dim=0).to(torch.int32)
    return num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank


def channel_ranges(num_tokens, num_channels):
    """Token range [begin, end) of every channel: contiguous chunks of ceil(N / C) tokens."""
    if num_channels < 1 or num_tokens < 0:
        raise ValueError(f"need num_channels >= 1 and num_tokens >= 0, got {num_channels}, {num_tokens}")
    per = (num_tokens + num_channels - 1) // num_channels
    return [(min(c * per, num_tokens), min((c + 1) * per, num_tokens)) for c in range(num_channels)]


# ----------------------------------------------------------------------------------------
# Intranode dispatch / combine
# ----------------------------------------------------------------------------------------
def _send_pos(is_token_in_rank):
    """send_pos[t, r] = position of token t among this rank's tokens sent to r, or -1."""
    routed = is_token_in_rank.to(torch.int32)
    pos = torch.cumsum(routed, dim=0, dtype=torch.int32) - 1
    return torch.where(is_token_in_rank, pos, torch.full_like(pos, -1))


def intranode_dispatch(xs, topk_idxs, topk_weights, num_experts, num_channels, expert_alignment=1,
                       num_worst_tokens=0, is_token_in_ranks=None):
    """Simulates a (non-cached) intranode dispatch on all R = len(xs) ranks.

    xs[r]: bf16 [N_r, H] or (fp8 e4m3 [N_r, H], scales f32/int32 [N_r, S]).
    topk_idxs[r]: int64 [N_r, K] or None (then is_token_in_ranks[r] gives the routing).
    topk_weights[r]: f32 [N_r, K] or None (only allowed without topk_idxs).
    is_token_in_ranks[r]: bool [N_r, R]; when given it is the routing (as in DeepEP, whose
    kernel routes by is_token_in_rank), otherwise the routing is derived from topk_idxs.
    Returns one dict per rank (see module docs / DeepEP handle semantics).
    """
    R = len(xs)
    if R < 1:
        raise ValueError("need at least one rank")
    _check_experts(num_experts, R)
    if num_channels < 1:
        raise ValueError(f"num_channels must be >= 1, got {num_channels}")
    if expert_alignment < 1:
        raise ValueError(f"expert_alignment must be >= 1, got {expert_alignment}")
    if num_worst_tokens < 0:
        raise ValueError(f"num_worst_tokens must be >= 0, got {num_worst_tokens}")
    for name, lst in (("topk_idxs", topk_idxs), ("topk_weights", topk_weights),
                      ("is_token_in_ranks", is_token_in_ranks)):
        if lst is not None and len(lst) != R:
            raise ValueError(f"{name} must have one entry per rank ({R}), got {len(lst)}")
    topk_idxs = list(topk_idxs) if topk_idxs is not None else [None] * R
    topk_weights = list(topk_weights) if topk_weights is not None else [None] * R
    is_token_in_ranks = list(is_token_in_ranks) if is_token_in_ranks is not None else [None] * R
    L = num_experts // R

    # ---- validate and derive per-source routing -------------------------------------
    datas, scaless = zip(*[_split_x(x, f"xs[{r}]") for r, x in enumerate(xs)])
    has_topk = topk_idxs[0] is not None
    H = datas[0].shape[1]
    K = topk_idxs[0].shape[1] if has_topk else 0
    routes, tokens_per_expert = [], []
    for r in range(R):
        n = datas[r].shape[0]
        if datas[r].dtype != datas[0].dtype or datas[r].shape[1] != H:
            raise ValueError(f"xs[{r}] dtype/hidden {datas[r].dtype}/{datas[r].shape[1]} differs from "
                             f"xs[0] {datas[0].dtype}/{H}")
        if (scaless[r] is None) != (scaless[0] is None) or (
                scaless[r] is not None and (scaless[r].dtype != scaless[0].dtype
                                            or scaless[r].shape[1] != scaless[0].shape[1])):
            raise ValueError(f"xs[{r}] scales dtype/shape differ from xs[0]")
        if (topk_idxs[r] is not None) != has_topk:
            raise ValueError("topk_idxs must be given on all ranks or on none")
        if has_topk:
            _check_topk_idx(topk_idxs[r], num_experts, f"topk_idxs[{r}]")
            if topk_idxs[r].shape != (n, K):
                raise ValueError(f"topk_idxs[{r}] shape {tuple(topk_idxs[r].shape)} != {(n, K)}")
            w = topk_weights[r]
            _check_tensor(w, f"topk_weights[{r}]", torch.float32, 2)
            if w.shape != (n, K):
                raise ValueError(f"topk_weights[{r}] shape {tuple(w.shape)} != {(n, K)}")
            _, _, per_expert, itr = dispatch_layout(topk_idxs[r], num_experts, R)
            tokens_per_expert.append(per_expert)
        else:
            if topk_weights[r] is not None:
                raise ValueError(f"topk_weights[{r}] given without topk_idxs")
            if is_token_in_ranks[r] is None:
                raise ValueError(f"is_token_in_ranks[{r}] is required when topk_idxs is None")
        if is_token_in_ranks[r] is not None:
            itr = is_token_in_ranks[r]
            _check_tensor(itr, f"is_token_in_ranks[{r}]", torch.bool, 2)
            if itr.shape != (n, R):
                raise ValueError(f"is_token_in_ranks[{r}] shape {tuple(itr.shape)} != {(n, R)}")
        routes.append(itr)

    dev = datas[0].device
    # rank_prefix_matrix[i][j] = tokens sent by ranks 0..i to rank j.
    sent = torch.stack([rt.sum(dim=0) for rt in routes]).to(torch.int32)  # [src, dst]
    rank_prefix_matrix = torch.cumsum(sent, dim=0, dtype=torch.int32).to(dev)
    # channel_prefix_matrix of every source: cpm[src][dst][c] = src's tokens in channels 0..c for dst.
    cpms = []
    for r in range(R):
        ends = [end for _, end in channel_ranges(routes[r].shape[0], num_channels)]
        prefix = torch.cat([torch.zeros(1, R, dtype=torch.int32, device=dev),
                            torch.cumsum(routes[r].to(torch.int32), dim=0, dtype=torch.int32)])
        cpms.append(prefix[ends].t().contiguous())  # [R(dst), C]

    results = []
    for me in range(R):
        rows = [routes[src][:, me].nonzero().flatten() for src in range(R)]  # source token ids
        num_recv = sum(len(ix) for ix in rows)
        if num_worst_tokens > 0 and num_recv > num_worst_tokens:
            raise ValueError(f"rank {me} receives {num_recv} tokens > num_worst_tokens ({num_worst_tokens})")
        num_rows = num_worst_tokens if num_worst_tokens > 0 else num_recv

        def gather(tensors, fill=0):
            """Concatenate rows of tensors[src] selected by rows[src], padded to num_rows."""
            out = torch.cat([t.index_select(0, ix) for t, ix in zip(tensors, rows)]).contiguous()
            if num_rows > num_recv:
                pad = torch.full((num_rows - num_recv,) + tuple(out.shape[1:]), fill, dtype=out.dtype,
                                 device=out.device)
                out = torch.cat([out, pad])
            return out

        res = {"recv_x": gather(datas), "recv_x_scales": None, "recv_topk_idx": None,
               "recv_topk_weights": None, "num_recv_tokens_per_expert_list": []}
        if scaless[0] is not None:
            res["recv_x_scales"] = gather(scaless)
        if has_topk:
            idx = gather(topk_idxs, fill=-1)
            local = (idx >= me * L) & (idx < (me + 1) * L)
            res["recv_topk_idx"] = torch.where(local, idx - me * L, torch.full_like(idx, -1))
            w = gather(topk_weights)
            res["recv_topk_weights"] = torch.where(local, w, torch.zeros_like(w))
            if num_worst_tokens == 0:
                counts = torch.stack([tpe[me * L:(me + 1) * L] for tpe in tokens_per_expert]).sum(0)
                a = expert_alignment
                res["num_recv_tokens_per_expert_list"] = [(int(c) + a - 1) // a * a for c in counts]
        recv_cpm = torch.zeros(R, num_channels, dtype=torch.int32, device=dev)
        for src in range(R):
            recv_cpm[src, 1:] = cpms[src][me, :-1]
        res.update({
            "rank_prefix_matrix": rank_prefix_matrix.clone(),
            "channel_prefix_matrix": cpms[me].clone(),
            "recv_channel_prefix_matrix": recv_cpm,
            "recv_src_idx": gather([torch.arange(d.shape[0], dtype=torch.int32, device=dev) for d in datas]),
            "is_token_in_rank": routes[me].clone(),
            "send_pos": _send_pos(routes[me]),
            "num_recv": num_recv,
        })
        results.append(res)
    return results


def intranode_cached_dispatch(xs, handles):
    """Dispatch reusing the handles of a previous dispatch (uses is_token_in_rank and send_pos).

    Returns per rank {"recv_x", "recv_x_scales"} with exactly num_recv rows, equal to the
    first num_recv rows of the non-cached dispatch outputs.
    """
    R = len(xs)
    if len(handles) != R:
        raise ValueError(f"need one handle per rank ({R}), got {len(handles)}")
    datas, scaless = zip(*[_split_x(x, f"xs[{r}]") for r, x in enumerate(xs)])
    for r in range(R):
        itr = handles[r]["is_token_in_rank"]
        if itr.shape != (datas[r].shape[0], R):
            raise ValueError(f"handles[{r}] is_token_in_rank shape {tuple(itr.shape)} does not match "
                             f"{(datas[r].shape[0], R)}")
    results = []
    for me in range(R):
        rpm = handles[me]["rank_prefix_matrix"]
        num_recv = int(rpm[R - 1, me])
        res = {"recv_x": None, "recv_x_scales": None}
        for key, tensors in (("recv_x", datas), ("recv_x_scales", scaless)):
            if tensors[0] is None:
                continue
            out = torch.zeros((num_recv,) + tuple(tensors[0].shape[1:]), dtype=tensors[0].dtype,
                              device=tensors[0].device)
            for src in range(R):
                mask = handles[src]["is_token_in_rank"][:, me]
                base = int(rpm[src - 1, me]) if src > 0 else 0
                dst_rows = base + handles[src]["send_pos"][mask, me].long()
                out[dst_rows] = tensors[src][mask]
            res[key] = out
        results.append(res)
    return results


def intranode_combine(xs, handles, topk_weights=None, biases=None):
    """Simulates intranode combine on all ranks (the reverse of dispatch, summing copies).

    xs[r]: bf16 [>= num_recv_r, H] in rank r's dispatch receive order. handles[r]: dispatch
    dicts. topk_weights[r]: f32 [>= num_recv_r, K] or None. biases[r]: None, bf16 [N_r, H] or
    a pair (b0, b1) of such tensors / None. Per token t of rank me, in float32 and in exactly
    this order: acc = 0; acc += b0[t]; acc += b1[t]; acc += xs[r][row(t, r)] for r ascending
    with is_token_in_rank[t, r]; combined_x[t] = bf16(acc).
    """
    R = len(xs)
    if len(handles) != R:
        raise ValueError(f"need one handle per rank ({R}), got {len(handles)}")
    if topk_weights is not None and len(topk_weights) != R:
        raise ValueError(f"topk_weights must have one entry per rank ({R})")
    if biases is not None and len(biases) != R:
        raise ValueError(f"biases must have one entry per rank ({R})")
    H = None
    for r in range(R):
        _check_tensor(xs[r], f"xs[{r}]", torch.bfloat16, 2)
        H = xs[r].shape[1] if H is None else H
        if xs[r].shape[1] != H:
            raise ValueError(f"xs[{r}] hidden {xs[r].shape[1]} != {H}")
        if xs[r].shape[0] < handles[r]["num_recv"]:
            raise ValueError(f"xs[{r}] has {xs[r].shape[0]} rows < num_recv {handles[r]['num_recv']}")
        if topk_weights is not None:
            _check_tensor(topk_weights[r], f"topk_weights[{r}]", torch.float32, 2)
            if topk_weights[r].shape[0] < handles[r]["num_recv"] or \
                    topk_weights[r].shape[1] != topk_weights[0].shape[1]:
                raise ValueError(f"topk_weights[{r}] shape {tuple(topk_weights[r].shape)} is invalid")

    results = []
    for me in range(R):
        itr = handles[me]["is_token_in_rank"]
        send_pos = handles[me]["send_pos"]
        rpm = handles[me]["rank_prefix_matrix"]
        N = itr.shape[0]
        bias = biases[me] if biases is not None else None
        pair = tuple(bias) if isinstance(bias, (tuple, list)) else (bias, None)
        if len(pair) != 2:
            raise ValueError(f"biases[{me}] must be a tensor or a pair of tensors")
        acc = torch.zeros(N, H, dtype=torch.float32, device=xs[me].device)
        for j, b in enumerate(pair):
            if b is not None:
                _check_tensor(b, f"biases[{me}][{j}]", torch.bfloat16, 2)
                if b.shape != (N, H):
                    raise ValueError(f"biases[{me}][{j}] shape {tuple(b.shape)} != {(N, H)}")
                acc += b.float()
        w_acc = None
        if topk_weights is not None:
            w_acc = torch.zeros(N, topk_weights[0].shape[1], dtype=torch.float32, device=xs[me].device)
        for r in range(R):  # one rank at a time, ascending: fixes the f32 summation order
            mask = itr[:, r]
            base = int(rpm[me - 1, r]) if me > 0 else 0
            rows = base + send_pos[mask, r].long()
            acc[mask] += xs[r][rows].float()
            if w_acc is not None:
                w_acc[mask] += topk_weights[r][rows]
        results.append({"combined_x": acc.to(torch.bfloat16), "combined_topk_weights": w_acc})
    return results


# ----------------------------------------------------------------------------------------
# FP8 helpers (per 128 channels along the last dim)
# ----------------------------------------------------------------------------------------
def _f32_bits(x):
    return x.contiguous().view(torch.int32)


def _bits_f32(bits):
    return bits.to(torch.int32).contiguous().view(torch.float32)


def per_token_cast_to_fp8(x, round_scale=False, use_ue8m0=False):
    """Casts x [..., H] to fp8 e4m3 with one scale per 128 channels (DeepEP LL kernel semantics).

    amax = max(1e-4, max |x| of the group) in f32. Default: scale_inv = amax * f32(1/448)
    (a multiply by f32(1/448)), scale = 448 / amax as one correctly rounded f32 division. round_scale: scale_inv =
    2**ceil(log2(amax * f32(1/448))) computed exactly from the float bits, scale = 1 / scale_inv.
    Returns (fp8 [..., H], scale_inv f32 [..., H/128]) or, with use_ue8m0, packed int32 [..., H/512].
    """
    _check_tensor(x, "x")
    if not x.is_floating_point() or x.dtype == torch.float8_e4m3fn or x.dim() < 1:
        raise TypeError(f"x must be a floating tensor (bf16/f16/f32) with >= 1 dim, got {x.dtype}")
    H = x.shape[-1]
    if H % 128 != 0:
        raise ValueError(f"hidden size {H} must be a multiple of 128")
    if use_ue8m0 and not round_scale:
        raise ValueError("use_ue8m0 requires round_scale=True")
    if use_ue8m0 and H % 512 != 0:
        raise ValueError(f"hidden size {H} must be a multiple of 512 with use_ue8m0")
    groups = x.float().reshape(*x.shape[:-1], H // 128, 128)
    amax = groups.abs().amax(dim=-1).clamp(min=FP8_MARGIN)
    inv_max = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32, device=x.device)
    if round_scale:
        bits = _f32_bits(amax * inv_max)
        exponent = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)  # ceil(log2)
        scale_inv = _bits_f32((exponent + 127) << 23)
        scale = _bits_f32((127 - exponent) << 23)
    else:
        scale_inv = amax * inv_max
        # A true f32 division (torch's `scalar / tensor` is reciprocal-then-multiply, one ulp off at times).
        scale = torch.full_like(amax, FP8_MAX) / amax
    values = (groups * scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    values = values.reshape(x.shape)
    return values, (pack_ue8m0(scale_inv) if use_ue8m0 else scale_inv)


def pack_ue8m0(scale_inv):
    """Packs f32 power-of-two scales [..., S] into int32 [..., S/4]: byte = bits >> 23,
    byte j of each group of 4 goes to bits 8j..8j+7 (little-endian)."""
    _check_tensor(scale_inv, "scale_inv", torch.float32)
    if scale_inv.dim() < 1 or scale_inv.shape[-1] % 4 != 0:
        raise ValueError(f"last dim of scale_inv must be a multiple of 4, got {tuple(scale_inv.shape)}")
    if scale_inv.numel() == 0:
        return torch.empty(*scale_inv.shape[:-1], scale_inv.shape[-1] // 4, dtype=torch.int32, device=scale_inv.device)
    bits = _f32_bits(scale_inv)
    exp = (bits >> 23) & 0xFF
    ok = (bits >= 0) & ((bits & 0x7FFFFF) == 0) & (exp > 0) & (exp < 255)
    if not bool(ok.all()):
        raise ValueError("pack_ue8m0 requires positive, normal, power-of-two scales")
    b = exp.to(torch.int64).reshape(*scale_inv.shape[:-1], -1, 4)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)  # in [0, 2**32)
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def unpack_ue8m0(packed):
    """Inverse of pack_ue8m0: int32 [..., P] -> f32 [..., 4P] with bits = byte << 23."""
    _check_tensor(packed, "packed", torch.int32)
    if packed.dim() < 1:
        raise ValueError("packed must have at least one dim")
    word = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(4, device=packed.device, dtype=torch.int64) * 8
    b = (word.unsqueeze(-1) >> shifts) & 0xFF
    return _bits_f32(b << 23).reshape(*packed.shape[:-1], packed.shape[-1] * 4)


def per_token_cast_back(x_fp8, scales):
    """bf16(x.float() * scale_inv) with one scale per 128 channels (f32 or packed UE8M0 int32)."""
    _check_tensor(x_fp8, "x_fp8", torch.float8_e4m3fn)
    _check_tensor(scales, "scales", (torch.float32, torch.int32))
    if scales.dtype == torch.int32:
        scales = unpack_ue8m0(scales)
    H = x_fp8.shape[-1]
    if H % 128 != 0 or tuple(scales.shape) != tuple(x_fp8.shape[:-1]) + (H // 128,):
        raise ValueError(f"scales shape {tuple(scales.shape)} does not match x {tuple(x_fp8.shape)} "
                         f"(one scale per 128 channels)")
    groups = x_fp8.float().reshape(*x_fp8.shape[:-1], H // 128, 128)
    return (groups * scales.unsqueeze(-1)).reshape(x_fp8.shape).to(torch.bfloat16)
