"""Plain-torch reference semantics of ep_rt (DeepEP V1 compatible).

This package is the executable definition of what the GPU kernels must produce and
serves as the oracle for the GPU tests. It simulates *all ranks of a collective at
once*: every collective function takes one input per rank (``xs[r]`` is what rank
``r`` passes in) and returns one result per rank (``out[me]`` is what rank ``me``
gets back). Everything is deterministic, uses only torch, and works on CPU and CUDA
tensors (outputs live on the inputs' device).

Conventions: R = number of ranks, E = number of experts, L = E // R local experts per
rank, N_r = tokens on rank r, K = top-k, H = hidden size, C = number of channels.
See docs/deepep-v1-reference.md sections 2.1-2.3 (layout, dispatch, combine) and
2.7 (FP8 cast) for the semantics mirrored here; internode.py (several nodes of G ranks)
follows shared/docs/INTERNODE.md 1.3 and 4 and documents its handle in its docstring.
"""

from .fp8 import FP8_MARGIN, FP8_MAX, pack_ue8m0, per_token_cast_back, per_token_cast_to_fp8, unpack_ue8m0
from .internode import (
    INTERNODE_HANDLE_FIELDS,
    decode_source_meta,
    encode_source_meta,
    handle_tuple,
    internode_cached_dispatch,
    internode_combine,
    internode_dispatch,
)
from .intranode import channel_ranges, intranode_cached_dispatch, intranode_combine, intranode_dispatch
from .layout import NUM_RANKS_PER_NODE, dispatch_layout
from .logfmt import logfmt_decode, logfmt_encode, logfmt_roundtrip
from .low_latency import low_latency_combine, low_latency_dispatch

__all__ = [
    "FP8_MAX",
    "FP8_MARGIN",
    "NUM_RANKS_PER_NODE",
    "dispatch_layout",
    "channel_ranges",
    "intranode_dispatch",
    "intranode_cached_dispatch",
    "intranode_combine",
    "per_token_cast_to_fp8",
    "per_token_cast_back",
    "pack_ue8m0",
    "unpack_ue8m0",
    "low_latency_dispatch",
    "low_latency_combine",
    "logfmt_encode",
    "logfmt_decode",
    "logfmt_roundtrip",
    "INTERNODE_HANDLE_FIELDS",
    "internode_dispatch",
    "internode_cached_dispatch",
    "internode_combine",
    "handle_tuple",
    "encode_source_meta",
    "decode_source_meta",
]
