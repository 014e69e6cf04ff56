"""The handles dispatch returns and combine (or a cached dispatch) takes back. NamedTuples: to DeepEP code they
are the plain tuples it knows (same length, same order, indexable, unpackable); to ep_rt they say which kind
of call made them, so checks and op selection go by type instead of by tuple length."""
from __future__ import annotations

from typing import NamedTuple

import torch


class IntranodeHandle(NamedTuple):
    """DeepEP's 6-tuple. In ep_rt every column of rank_prefix_matrix is valid, and send_pos holds each token's
    position among those sent to a rank (-1 if not sent) instead of DeepEP's ring-slot counters."""
    rank_prefix_matrix: torch.Tensor          # int32 [R, R]: inclusive prefix over sources, every column
    channel_prefix_matrix: torch.Tensor       # int32 [R, C]
    recv_channel_prefix_matrix: torch.Tensor  # int32 [R, C]
    recv_src_idx: torch.Tensor                # int32 [num_recv]
    is_token_in_rank: torch.Tensor            # bool [N, R]
    send_pos: torch.Tensor                    # int32 [N, R]


class LowLatencyHandle(NamedTuple):
    """DeepEP's 5-tuple of a low-latency dispatch."""
    src_info: torch.Tensor                    # int32 [L, R*T]: source token of every packed row
    layout_range: torch.Tensor                # int64 [L, R]: (begin << 32) | count per (local expert, source)
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int


def as_handle(kind: type, handle, what: str):
    """`handle` as `kind`: itself, or a plain tuple of kind's length (DeepEP code may rebuild handles)."""
    if isinstance(handle, kind):
        return handle
    others = [k for k in (IntranodeHandle, LowLatencyHandle) if k is not kind]
    for other in others:
        if isinstance(handle, other):
            raise ValueError(f"{what} needs the handle of a {_NAMES[kind]}; this one comes from a {_NAMES[other]}")
    if isinstance(handle, tuple) and len(handle) == len(kind._fields):
        return kind(*handle)
    raise ValueError(f"{what} needs the {len(kind._fields)}-tuple handle returned by a {_NAMES[kind]}, got "
                     f"{type(handle).__name__}" + (f" of length {len(handle)}" if isinstance(handle, tuple) else ""))


_NAMES = {IntranodeHandle: "high-throughput (intranode) dispatch", LowLatencyHandle: "low-latency dispatch"}
