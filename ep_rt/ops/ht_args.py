"""Argument checks of Buffer.dispatch and Buffer.combine (everything is checked before any kernel runs)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .. import validate
from ..config import Config
from ..handles import InternodeHandle, IntranodeHandle, as_handle
from ..transport import nvl_layout


class DispatchArgs(NamedTuple):
    x: torch.Tensor
    x_scales: Optional[torch.Tensor]


def check_handle(handle, num_ranks: int, device, owner: int | None = None, what: str = "combine") -> IntranodeHandle:
    """The handle's kind, shapes and (when ep_rt made it) identity: made by this Buffer (`owner`, the op's serial),
    tensors unchanged."""
    handle = as_handle(IntranodeHandle, handle, what, owner)
    rpm, cpm, rcpm, recv_src_idx, in_rank, send_pos = handle
    validate.tensor("handle[0] (rank_prefix_matrix)", rpm, dtype=torch.int32, ndim=2, device=device)
    if tuple(rpm.shape) != (num_ranks, num_ranks):
        raise ValueError(f"handle[0] must be [{num_ranks}, {num_ranks}]; this handle is from another group")
    validate.tensor(
        "handle[2] (recv_channel_prefix_matrix)", rcpm, dtype=torch.int32, ndim=2, device=device, rows=num_ranks
    )
    if not 0 < rcpm.size(1) <= nvl_layout.MAX_CHANNELS:
        raise ValueError("handle[2] has an invalid channel count")
    validate.tensor("handle[3] (recv_src_idx)", recv_src_idx, dtype=torch.int32, ndim=1, device=device)
    validate.tensor("handle[4] (is_token_in_rank)", in_rank, dtype=torch.bool, ndim=2, device=device)
    validate.tensor("handle[5] (send_pos)", send_pos, dtype=torch.int32, ndim=2, device=device, rows=in_rank.size(0))
    if in_rank.size(1) != num_ranks or send_pos.size(1) != num_ranks:
        raise ValueError("handle[4] / handle[5] must have one column per rank")
    return handle


def check_internode_handle(
    handle, num_ranks: int, num_nodes: int, device, owner: int | None = None, what: str = "combine"
) -> InternodeHandle:
    """An internode handle's kind, dtypes and shapes, and (when ep_rt made it) identity."""
    handle = as_handle(InternodeHandle, handle, what, owner)
    R, N = num_ranks, num_nodes
    in_rank = handle.is_token_in_rank
    validate.tensor("handle[0] (is_token_in_rank)", in_rank, dtype=torch.bool, ndim=2, device=device)
    if in_rank.size(1) != R:
        raise ValueError(f"handle[0] must have {R} columns (one per rank); this handle is from another group")
    T = in_rank.size(0)
    C = handle.rdma_channel_prefix_matrix.size(1) if handle.rdma_channel_prefix_matrix.dim() == 2 else 0
    if not 0 < C <= nvl_layout.MAX_CHANNELS:
        raise ValueError("handle[1] (rdma_channel_prefix_matrix) has an invalid channel count")
    shapes = (
        ("handle[1] (rdma_channel_prefix_matrix)", handle.rdma_channel_prefix_matrix, (N, C)),
        ("handle[2] (gbl_channel_prefix_matrix)", handle.gbl_channel_prefix_matrix, (R, C)),
        ("handle[3] (recv_rdma_channel_prefix_matrix)", handle.recv_rdma_channel_prefix_matrix, (N, C)),
        ("handle[4] (recv_rdma_rank_prefix_sum)", handle.recv_rdma_rank_prefix_sum, (N,)),
        ("handle[5] (recv_gbl_channel_prefix_matrix)", handle.recv_gbl_channel_prefix_matrix, (R, C)),
        ("handle[6] (recv_gbl_rank_prefix_sum)", handle.recv_gbl_rank_prefix_sum, (R,)),
        ("handle[8] (send_rdma_head)", handle.send_rdma_head, (T, N)),
    )
    for name, t, shape in shapes:
        validate.tensor(name, t, dtype=torch.int32, ndim=len(shape), device=device)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")
    validate.tensor("handle[7] (recv_src_meta)", handle.recv_src_meta, dtype=torch.uint8, ndim=2, device=device)
    if handle.recv_src_meta.size(1) != 8:
        raise ValueError("handle[7] (recv_src_meta) must have 8 bytes per row")
    validate.tensor("handle[9] (send_nvl_head)", handle.send_nvl_head, dtype=torch.int32, ndim=2, device=device)
    if handle.send_nvl_head.size(1) != R // N:
        raise ValueError(f"handle[9] (send_nvl_head) must have {R // N} columns (ranks per node)")
    return handle


def _handle_for(buf, handle, what: str):
    if buf.is_internode:
        return check_internode_handle(handle, buf.group_size, buf.topology.num_nodes, buf.device, buf.ht_serial, what)
    return check_handle(handle, buf.group_size, buf.device, buf.ht_serial, what)


def check(
    buf,
    x,
    handle,
    num_tokens_per_rank,
    is_token_in_rank,
    num_tokens_per_expert,
    topk_idx,
    topk_weights,
    expert_alignment,
    num_worst_tokens,
    config,
) -> DispatchArgs:
    R, dev = buf.group_size, buf.device
    data, scales = validate.dispatch_x(x, dev)
    N = data.size(0)
    if not isinstance(config, Config):
        raise TypeError(f"config must be an ep_rt.Config, got {type(config).__name__}")
    if not isinstance(expert_alignment, int) or expert_alignment < 1:
        raise ValueError(f"expert_alignment must be an int >= 1, got {expert_alignment!r}")
    if not isinstance(num_worst_tokens, int) or num_worst_tokens < 0:
        raise ValueError(f"num_worst_tokens must be an int >= 0, got {num_worst_tokens!r}")
    if handle is not None:
        if topk_idx is not None or topk_weights is not None:
            raise ValueError("cached dispatch (handle given) takes no topk_idx / topk_weights")
        handle = _handle_for(buf, handle, "cached dispatch")
        made_for = handle.is_token_in_rank.size(0)
        if made_for != N:
            raise ValueError(f"x has {N} tokens but the handle was made for {made_for}")
        return DispatchArgs(data, scales)

    if num_tokens_per_rank is None or is_token_in_rank is None:
        raise ValueError(
            "dispatch needs num_tokens_per_rank and is_token_in_rank (from get_dispatch_layout) or a handle"
        )
    validate.tensor("num_tokens_per_rank", num_tokens_per_rank, dtype=torch.int32, ndim=1, device=dev, rows=R)
    validate.tensor("is_token_in_rank", is_token_in_rank, dtype=torch.bool, ndim=2, device=dev, rows=N)
    if is_token_in_rank.size(1) != R:
        raise ValueError(f"is_token_in_rank must be [{N}, {R}], got {tuple(is_token_in_rank.shape)}")
    if config.num_sms > nvl_layout.MAX_CHANNELS:
        raise ValueError(f"config.num_sms is at most {nvl_layout.MAX_CHANNELS}")
    if (topk_idx is None) != (topk_weights is None):
        raise ValueError("pass topk_idx and topk_weights together, or neither")
    # As DeepEP: every dispatch that is not cached takes the per-expert counts (with or without top-k); they
    # give num_recv_tokens_per_expert_list and the number of experts.
    if num_tokens_per_expert is None:
        raise ValueError(
            "dispatch needs num_tokens_per_expert (from get_dispatch_layout), with or without "
            "topk_idx, as DeepEP does; or a handle (cached dispatch)"
        )
    validate.tensor("num_tokens_per_expert", num_tokens_per_expert, dtype=torch.int32, ndim=1, device=dev)
    num_experts = num_tokens_per_expert.numel()
    validate.experts(num_experts, R)
    if topk_idx is None:
        if num_worst_tokens:
            raise ValueError("num_worst_tokens needs topk_idx")
        return DispatchArgs(data, scales)
    validate.topk_idx(topk_idx, dev, rows=N)
    validate.tensor("topk_weights", topk_weights, dtype=torch.float32, ndim=2, device=dev, rows=N)
    if topk_weights.size(1) != topk_idx.size(1):
        raise ValueError("topk_weights must have the shape of topk_idx")
    return DispatchArgs(data, scales)


def check_combine(buf, x, handle, topk_weights, bias, config):
    dev = buf.device
    handle = _handle_for(buf, handle, "combine")
    if buf.is_internode:
        rows, N = handle.recv_src_meta.size(0), handle.is_token_in_rank.size(0)
    else:
        rows, N = handle[3].size(0), handle[4].size(0)
    validate.tensor("x", x, dtype=torch.bfloat16, ndim=2, device=dev, rows=rows)
    if x.size(1) == 0 or x.size(1) % 8:
        raise ValueError(f"combine's hidden size must be a positive multiple of 8, got {x.size(1)}")
    if x.data_ptr() % 16:
        raise ValueError("x must start at a 16-byte aligned address")
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be an ep_rt.Config, got {type(config).__name__}")
    if topk_weights is not None:
        validate.tensor("topk_weights", topk_weights, dtype=torch.float32, ndim=2, device=dev, rows=rows)
        if topk_weights.size(1) > nvl_layout.MAX_TOPK:
            raise ValueError(f"top-k is at most {nvl_layout.MAX_TOPK}")
    biases = bias if isinstance(bias, tuple) else (bias, None)
    if len(biases) != 2:
        raise ValueError("bias must be a tensor or a 2-tuple of tensors")
    for i, b in enumerate(biases):
        if b is not None:
            validate.tensor(f"bias[{i}]", b, dtype=torch.bfloat16, ndim=2, device=dev, rows=N)
            if b.size(1) != x.size(1):
                raise ValueError(f"bias[{i}] must be [{N}, {x.size(1)}]")
    return biases
