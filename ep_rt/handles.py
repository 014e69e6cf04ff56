"""The handles dispatch returns and combine (or a cached dispatch) takes back. NamedTuples: to DeepEP code they
are the plain tuples it knows (same length, same order, indexable, unpackable); to ep_rt they say which kind
of call made them, so checks and op selection go by type instead of by tuple length.

A handle ep_rt made also carries host-side facts (not tuple entries, so DeepEP code never sees them): which
Buffer part made it, the tensors it held, and the largest row counts of its call on any rank. They make the checks
of a cached dispatch or a combine cheap: a handle from another Buffer, a handle whose tensors were replaced, and a
call whose rows would not fit the NVL buffer are refused on the host before any kernel runs, on every rank alike.
A handle rebuilt by the caller as a plain tuple has no facts; it gets the checks that need none."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

_serials = itertools.count(1)


def next_serial() -> int:
    """A number no other Buffer part of this process has had (identities, not id(), which is reused)."""
    return next(_serials)


@dataclass(frozen=True)
class HandleFacts:
    owner: int  # serial of the part that made the handle
    tensor_ptrs: tuple  # data_ptr of each tensor entry, in order (0 for non-tensors)
    max_dispatch_rows: Optional[int] = None  # most rows any rank received (None: not known on the host)
    max_combine_rows: Optional[int] = None  # most rows any rank gets back in combine
    max_stream: Optional[int] = None  # internode: the longest (rank -> node) stream of the call

    @staticmethod
    def of(handle, owner: int, **counts) -> "HandleFacts":
        ptrs = tuple(t.data_ptr() if isinstance(t, torch.Tensor) else 0 for t in handle)
        return HandleFacts(owner, ptrs, **counts)

    def check(self, handle, owner: int, what: str) -> None:
        if self.owner != owner:
            raise ValueError(
                f"{what}: this handle was made by another Buffer (or by one destroyed since); pass the "
                f"handle this Buffer's dispatch returned"
            )
        for i, (t, ptr) in enumerate(zip(handle, self.tensor_ptrs)):
            if isinstance(t, torch.Tensor) and t.data_ptr() != ptr:
                raise ValueError(
                    f"{what}: handle[{i}] is not the tensor the dispatch returned (it was replaced); "
                    f"pass the handle unchanged"
                )


class _IntranodeFields(NamedTuple):
    """DeepEP's 6-tuple. In ep_rt every column of rank_prefix_matrix is valid, and send_pos holds each token's
    position among those sent to a rank (-1 if not sent) instead of DeepEP's ring-slot counters."""

    rank_prefix_matrix: torch.Tensor  # int32 [R, R]: inclusive prefix over sources, every column
    channel_prefix_matrix: torch.Tensor  # int32 [R, C]
    recv_channel_prefix_matrix: torch.Tensor  # int32 [R, C]
    recv_src_idx: torch.Tensor  # int32 [num_recv]
    is_token_in_rank: torch.Tensor  # bool [N, R]
    send_pos: torch.Tensor  # int32 [N, R]


class IntranodeRounds(NamedTuple):
    """A call that went through the NVL buffer in rounds (ep_rt/ops/intranode.py): its combine and a cached
    dispatch from it take the same rounds. Host-side, like the facts: a handle rebuilt as a plain tuple has none, and
    its combine then runs in one pass (refused for size by the kernels, on every rank concerned)."""

    tokens_per_round: int
    num_rounds: int
    rank_prefix_matrix: torch.Tensor  # int32 [rounds, R, R]: each round's
    recv_channel_prefix_matrix: torch.Tensor  # int32 [rounds, R, C]: each round's
    send_pos: torch.Tensor  # int32 [N, R]: each token's position among the tokens of its round sent to a rank

    def tensors(self) -> tuple:
        return self.rank_prefix_matrix, self.recv_channel_prefix_matrix, self.send_pos


class IntranodeHandle(_IntranodeFields):
    """DeepEP's 6-tuple (fields above); `facts` and, for a call in rounds, `rounds` when ep_rt made it."""

    facts: Optional[HandleFacts] = None
    rounds: Optional[IntranodeRounds] = None


class _InternodeFields(NamedTuple):
    """DeepEP's 10-tuple of an internode dispatch (N nodes of G ranks; ep_rt/reference/internode.py says what each
    field holds). Where ep_rt differs: send_rdma_head holds each token's position in its (rank -> node) stream and
    send_nvl_head the position in the (source -> destination rank) stream (G columns), both -1 when not sent, never
    rewritten by combine; with G < 8 the node count is R / G and masks use bits 0..G-1."""

    is_token_in_rank: torch.Tensor  # bool [T, R]
    rdma_channel_prefix_matrix: torch.Tensor  # int32 [N, C]
    gbl_channel_prefix_matrix: torch.Tensor  # int32 [R, C]
    recv_rdma_channel_prefix_matrix: torch.Tensor  # int32 [N, C]
    recv_rdma_rank_prefix_sum: torch.Tensor  # int32 [N]
    recv_gbl_channel_prefix_matrix: torch.Tensor  # int32 [R, C]
    recv_gbl_rank_prefix_sum: torch.Tensor  # int32 [R]
    recv_src_meta: torch.Tensor  # uint8 [rows, 8]: source node, mask (int32 each)
    send_rdma_head: torch.Tensor  # int32 [T, N]
    send_nvl_head: torch.Tensor  # int32 [forwarded rows, G]


class InternodeRounds(NamedTuple):
    """An internode call larger than the buffers, made of ordinary calls on token ranges (ep_rt/ops/
    internode_rounds.py): each round's handle, and where each round's received rows sit in the whole call's outputs.
    Its combine and a cached dispatch from it take the same rounds. Host-side, like the facts: a handle rebuilt as a
    plain tuple has none, and its combine then runs in one pass, which the kernels refuse for size."""

    starts: tuple  # the first token of each round; a round ends where the next starts (the last: every token)
    handles: tuple  # InternodeHandle of each round (its own facts)
    rows: tuple  # int64 [rows of round k]: each row's row in the whole call's outputs

    def tensors(self) -> tuple:
        return tuple(t for h in self.handles for t in h) + tuple(self.rows)


class InternodeHandle(_InternodeFields):
    """DeepEP's 10-tuple (fields above); `facts` when ep_rt made it, and `rounds` for a call in rounds (its ten
    entries are still those of one pass)."""

    facts: Optional[HandleFacts] = None
    rounds: Optional[InternodeRounds] = None


class _LowLatencyFields(NamedTuple):
    """DeepEP's 5-tuple of a low-latency dispatch."""

    src_info: torch.Tensor  # int32 [L, R*T]: source token of every packed row
    layout_range: torch.Tensor  # int64 [L, R]: (begin << 32) | count per (local expert, source)
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int


class LowLatencyHandle(_LowLatencyFields):
    """DeepEP's 5-tuple (fields above); `facts` when ep_rt made it."""

    facts: Optional[HandleFacts] = None


class DispatchResult(NamedTuple):
    """What an HT op's dispatch returns (intranode or internode): the outputs and the handle."""

    recv_x: torch.Tensor
    recv_x_scales: Optional[torch.Tensor]
    recv_topk_idx: Optional[torch.Tensor]
    recv_topk_weights: Optional[torch.Tensor]
    num_recv_tokens_per_expert_list: list
    handle: tuple
    tensors: list  # everything the comm stream touched, for record_stream


def with_facts(handle, facts: HandleFacts):
    handle.facts = facts
    return handle


def as_handle(kind: type, handle, what: str, owner: int | None = None):
    """`handle` as `kind`: itself, or a plain tuple of kind's length (DeepEP code may rebuild handles). With `owner`
    (the serial of the op that must have made it), a handle carrying facts is also checked against them."""
    typed = _typed(kind, handle, what)
    facts = getattr(handle, "facts", None)
    if facts is not None and owner is not None:
        facts.check(handle, owner, what)
    return typed


def _typed(kind: type, handle, what: str):
    if isinstance(handle, kind):
        return handle
    others = [k for k in (IntranodeHandle, InternodeHandle, LowLatencyHandle) if k is not kind]
    for other in others:
        if isinstance(handle, other):
            raise ValueError(f"{what} needs the handle of a {_NAMES[kind]}; this one comes from a {_NAMES[other]}")
    if isinstance(handle, tuple) and len(handle) == len(kind._fields):
        return kind(*handle)  # rebuilt by the caller: no facts
    raise ValueError(
        f"{what} needs the {len(kind._fields)}-tuple handle returned by a {_NAMES[kind]}, got "
        f"{type(handle).__name__}" + (f" of length {len(handle)}" if isinstance(handle, tuple) else "")
    )


_NAMES = {
    IntranodeHandle: "high-throughput (intranode) dispatch",
    InternodeHandle: "high-throughput internode dispatch",
    LowLatencyHandle: "low-latency dispatch",
}
