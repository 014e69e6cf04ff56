"""Reference get_dispatch_layout (deepep-v1-reference.md 2.1; INTERNODE.md 1.3 for the per-node counts)."""

from typing import NamedTuple

import torch

from ._checks import _check_experts, _check_tensor, _check_topk_idx, _split_x

NUM_RANKS_PER_NODE = 8


# ----------------------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------------------
def dispatch_layout(topk_idx, num_experts, num_ranks, num_ranks_per_node=NUM_RANKS_PER_NODE):
    """Returns (num_tokens_per_rank i32[R], num_tokens_per_rdma_rank i32[R // G] or None,
    num_tokens_per_expert i32[E], is_token_in_rank bool[N, R]) for one rank's topk_idx.

    G = num_ranks_per_node: nodes are the blocks of G consecutive ranks (ranks nG..nG+G-1 form node n).
    num_tokens_per_rdma_rank[n] = number of tokens with at least one selected expert on node n (a token
    counts once per node). It is None when all ranks fit in one node (R <= G); otherwise R must be a
    multiple of G. The default G = 8 is DeepEP V1's behaviour (None for R <= 8, R % 8 == 0 above).
    """
    _check_experts(num_experts, num_ranks)
    _check_topk_idx(topk_idx, num_experts)
    G = num_ranks_per_node
    if not isinstance(G, int) or not 1 <= G <= NUM_RANKS_PER_NODE:
        raise ValueError(f"num_ranks_per_node must be an int in [1, {NUM_RANKS_PER_NODE}], got {G!r}")
    if num_ranks > G and num_ranks % G != 0:
        raise ValueError(f"num_ranks ({num_ranks}) > {G} must be a multiple of {G} (the ranks per node)")
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
    if num_ranks > G:
        per_node = is_token_in_rank.view(-1, num_ranks // G, G)
        num_tokens_per_rdma_rank = per_node.any(dim=2).sum(dim=0).to(torch.int32)
    return num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank


def channel_ranges(num_tokens, num_channels):
    """Token range [begin, end) of every channel: contiguous chunks of ceil(N / C) tokens."""
    if num_channels < 1 or num_tokens < 0:
        raise ValueError(f"need num_channels >= 1 and num_tokens >= 0, got {num_channels}, {num_tokens}")
    per = (num_tokens + num_channels - 1) // num_channels
    return [(min(c * per, num_tokens), min((c + 1) * per, num_tokens)) for c in range(num_channels)]


class DispatchInputs(NamedTuple):
    R: int
    L: int
    datas: tuple  # the x of every rank (fp8 or bf16)
    scaless: tuple  # its scales, or None
    has_topk: bool
    H: int
    K: int
    routes: list  # bool [N_r, R] per rank: the routing
    tokens_per_expert: list  # int32 [E] per rank, from topk_idxs (empty without)
    topk_idxs: list
    topk_weights: list


def dispatch_inputs(
    xs,
    topk_idxs,
    topk_weights,
    is_token_in_ranks,
    num_experts,
    num_channels,
    expert_alignment,
    num_worst_tokens,
    num_ranks_per_node=NUM_RANKS_PER_NODE,
) -> DispatchInputs:
    """The argument checks every reference dispatch makes (as the real calls do), and each source's routing:
    is_token_in_ranks[r] when given (DeepEP routes by it), else derived from topk_idxs[r]."""
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
    for name, lst in (
        ("topk_idxs", topk_idxs),
        ("topk_weights", topk_weights),
        ("is_token_in_ranks", is_token_in_ranks),
    ):
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
            raise ValueError(
                f"xs[{r}] dtype/hidden {datas[r].dtype}/{datas[r].shape[1]} differs from xs[0] {datas[0].dtype}/{H}"
            )
        if (scaless[r] is None) != (scaless[0] is None) or (
            scaless[r] is not None
            and (scaless[r].dtype != scaless[0].dtype or scaless[r].shape[1] != scaless[0].shape[1])
        ):
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
            _, _, per_expert, itr = dispatch_layout(topk_idxs[r], num_experts, R, num_ranks_per_node)
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
        routes.append(itr.contiguous())
    return DispatchInputs(R, L, datas, scaless, has_topk, H, K, routes, tokens_per_expert, topk_idxs, topk_weights)
