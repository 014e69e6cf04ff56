"""The interface between Buffer and its high-throughput ops (ops/intranode.py IntranodeOp, ops/internode.py
InternodeOp): one checked-argument type for a dispatch and the few methods Buffer calls, so Buffer has no branch on
which op it holds. Each op checks what only it needs (the internode op: the per-node counts and the queue-pair rule;
the intranode op: whether a handle's rows fit its NVL buffer) before it launches anything."""

from __future__ import annotations

from typing import NamedTuple, Optional, Protocol

import torch

from .handles import DispatchResult


class DispatchCall(NamedTuple):
    """A dispatch's arguments once ep_rt.ops.ht_args checked the ones both ops share (x split into data and scales,
    config reduced to its channel count). `handle` set: a cached dispatch (no routing arguments)."""

    x: torch.Tensor
    x_scales: Optional[torch.Tensor]
    handle: Optional[tuple]
    topk_idx: Optional[torch.Tensor]
    topk_weights: Optional[torch.Tensor]
    num_tokens_per_rank: Optional[torch.Tensor]
    num_tokens_per_rdma_rank: Optional[torch.Tensor]
    is_token_in_rank: Optional[torch.Tensor]
    num_tokens_per_expert: Optional[torch.Tensor]
    expert_alignment: int
    num_worst_tokens: int
    num_channels: int


class HighThroughputOp(Protocol):
    """What Buffer calls on its high-throughput op. `serial` names the op in its handles' facts; `timer` is the
    benchmark hook (Buffer.set_kernel_timer); `is_internode` is what Buffer.is_internode reports."""

    is_internode: bool
    serial: int
    timer: object

    def raise_if_failed(self) -> None:
        """Raise the error this op's kernels (or a host wait of its own) recorded."""

    def check_dispatch(self, call: DispatchCall) -> None:
        """This op's own argument checks, before the call's streams are set up."""

    def run_dispatch(self, call: DispatchCall, alloc_stream, comm_stream) -> DispatchResult:
        """Launch the dispatch (cached when call.handle is set: then only recv_x, recv_x_scales and tensors hold
        something). The outputs are allocated on alloc_stream; None: the current stream (events.allocating_on)."""

    def combine_handle(self, x, handle, topk_weights):
        """The handle as this op's combine takes it, once checked against this op's buffers (before the streams)."""

    def combine(self, x, handle, topk_weights, bias0, bias1, alloc_stream, comm_stream):
        """Launch the combine; returns (combined_x, combined_topk_weights, tensors the comm stream touched)."""
