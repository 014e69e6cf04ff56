"""Low-latency buffer sizing (DeepEP V1's formula, so sizes agree; the LL kernels themselves are not in
this release)."""
from __future__ import annotations


def rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """Bytes of symmetric buffer for two alternating LL buffers: signal | send | recv each."""
    if hidden % 128:
        raise ValueError(f"hidden must be a multiple of 128, got {hidden}")
    T, H, E = num_max_dispatch_tokens_per_rank, hidden, num_experts
    num_scales = H // 128
    dispatch_msg = 16 + max(2 * H, H + 4 * num_scales)
    combine_msg = 4 * num_scales + 2 * H
    send = max(T * dispatch_msg, E * T * combine_msg)
    recv = max(E * T * dispatch_msg, E * T * combine_msg)
    signal = (E * 4 + 127) // 128 * 128
    total = 2 * (signal + send + recv)
    return (total + 128) // 128 * 128
