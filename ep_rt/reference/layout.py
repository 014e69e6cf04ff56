"""Reference get_dispatch_layout (deepep-v1-reference.md 2.1; INTERNODE.md 1.3 for the per-node counts)."""
import torch

from ._checks import _check_experts, _check_topk_idx

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
