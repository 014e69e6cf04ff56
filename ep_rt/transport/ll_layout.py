"""Low-latency buffer layout and sizing (DeepEP V1's formula; the combine message is padded to 16 bytes,
which only changes sizes for hidden sizes that are not multiples of 512). The layout itself is ep_rt's: the
data of the two buffers in fixed halves of num_rdma_bytes, the signals in a control area after it.

The packed layout (the LL cubins' packed variants, EP_RT_LL_PACKED=1; docs/LL_PACKED_DESIGN.md) sizes the receive
areas by what can arrive: a dispatch receives at most T x min(K, L) messages from each source (a block of
T x min(16, L) slots per source, 16 = the largest top-k), a combine at most T x K rows (slots t x min(16, E) + k;
a packed call's top-k is at most the expert count). Never more than DeepEP's formula where the hidden size is a
multiple of 512, nor than the default layout's size anywhere (tests/ops/test_ll_packed_layout.py)."""

from __future__ import annotations

MAX_SIGNALS = 65536  # params.h EP_RT_LL_MAX_SIGNALS: the most experts an LL call takes
MAX_TOPK = 16  # params.h EP_RT_LL_MAX_TOPK


def dispatch_msg_bytes(hidden: int) -> int:
    """int4 header + bf16 row, or fp8 row + f32 scales (never larger than the bf16 row)."""
    return 16 + max(2 * hidden, hidden + 4 * (hidden // 128))


def dispatch_slot_bytes(hidden: int, use_fp8: bool) -> int:
    """Stride of the dispatch slots a call uses. An FP8 message is about half of DeepEP's slot: its slots are its
    own size rounded up to 128 bytes, so that every message starts on a cache line and the senders' stores cover
    whole lines. Never more than dispatch_msg_bytes (the buffer sizes stay DeepEP's)."""
    if use_fp8:
        return (16 + hidden + 4 * (hidden // 128) + 127) // 128 * 128
    return dispatch_msg_bytes(hidden)


def combine_msg_bytes(hidden: int) -> int:
    """bf16 row + LogFMT metadata (4 bytes per 128 channels), padded to 16 bytes for vector copies."""
    return (2 * hidden + 4 * (hidden // 128) + 15) // 16 * 16


def combine_slot_bytes(hidden: int, use_logfmt: bool) -> int:
    """Stride of the combine slots (and zero-copy staging rows) a call uses: LogFMT needs the metadata words after
    the row; a bf16 row alone is a multiple of 256 bytes, so its slots start on cache lines. Never more than
    combine_msg_bytes."""
    return combine_msg_bytes(hidden) if use_logfmt else 2 * hidden


def data_bytes(T: int, hidden: int, num_experts: int) -> tuple[int, int]:
    """(staging, receive) bytes one buffer needs for calls of this shape (dispatch or combine, whichever is more)."""
    d, c = dispatch_msg_bytes(hidden), combine_msg_bytes(hidden)
    return max(T * d, num_experts * T * c), max(num_experts * T * d, num_experts * T * c)


def packed_block_slots(T: int, num_ranks: int, num_experts: int) -> int:
    """Packed dispatch: the slots each source rank has in a receiver's area (its messages to every local expert,
    expert after expert): T x min(16, L), since a token chooses at most min(K, L) of one rank's L experts."""
    return T * min(MAX_TOPK, num_experts // num_ranks)


def packed_stride(num_experts: int) -> int:
    """Packed combine slots (and staged dispatch copies) per token: one per possible choice, min(16, E)."""
    return min(MAX_TOPK, num_experts)


def packed_data_bytes(T: int, hidden: int, num_ranks: int, num_experts: int) -> tuple[int, int]:
    """(staging, receive) bytes of one buffer in the packed layout. Staging: a copy of each token per choice
    (T x packed_stride dispatch messages, for puts to other nodes: each copy's header names its k), or the zero-copy
    combine rows [L, R x T] (E x T); receive: R blocks of packed_block_slots dispatch messages, or T x packed_stride
    combine rows."""
    d, c = dispatch_msg_bytes(hidden), combine_msg_bytes(hidden)
    stride = packed_stride(num_experts)
    send = max(T * stride * d, num_experts * T * c)
    recv = max(num_ranks * packed_block_slots(T, num_ranks, num_experts) * d, T * stride * c)
    return send, recv


def buffer_offsets(
    T: int, hidden: int, num_experts: int, num_rdma_bytes: int, packed: bool = False, num_ranks: int = 0
) -> dict:
    """Byte offsets of the two buffers' areas in the symmetric buffer. Buffer b owns the fixed half b of
    num_rdma_bytes whatever the call's shape (so a call can never write into the other buffer's bytes): its receive
    area at the half's start (128-byte aligned), its staging area after it (16-byte aligned). "need":
    bytes of a half this shape needs, "half": the bytes a half has. `packed` (with num_ranks) for the packed layout."""
    if packed:
        if num_ranks <= 0:
            raise ValueError("the packed layout needs num_ranks")
        send, recv = packed_data_bytes(T, hidden, num_ranks, num_experts)
    else:
        send, recv = data_bytes(T, hidden, num_experts)
    half = num_rdma_bytes // 2 // 128 * 128
    return {"recv": (0, half), "send": (recv, half + recv), "need": send + recv, "half": half}


def control_offsets(num_rdma_bytes: int, num_ranks: int) -> dict:
    """ep_rt's control area after the caller's num_rdma_bytes (params.h), every word a u64 signal word: credits,
    count signals, combine flags, dispatch and combine arrival words, barrier words, at offsets that do not depend
    on any call's shape. clean_low_latency_buffer zeroes [credit, barrier); the barrier words only grow. "end": the
    whole symmetric allocation."""

    def up(n):
        return (n + 127) // 128 * 128

    credit = up(num_rdma_bytes)
    count = credit + up(2 * num_ranks * 8)
    flag = count + 2 * MAX_SIGNALS * 8
    dispatch_arrival = flag + 2 * MAX_SIGNALS * 8
    combine_arrival = dispatch_arrival + 2 * MAX_SIGNALS * 8
    barrier = combine_arrival + 2 * MAX_SIGNALS * 8
    end = barrier + up(num_ranks * 8)
    return {
        "credit": credit,
        "count_signal": (count, count + MAX_SIGNALS * 8),
        "combine_flag": (flag, flag + MAX_SIGNALS * 8),
        "dispatch_arrival": (dispatch_arrival, dispatch_arrival + MAX_SIGNALS * 8),
        "combine_arrival": (combine_arrival, combine_arrival + MAX_SIGNALS * 8),
        "barrier": barrier,
        "end": end,
    }


def shape_digest(T: int, hidden: int, num_experts: int, message_format: int) -> int:
    """16 bits the LL kernels carry in every signal (params.h): a receiver whose own digest differs reports the
    sender as having called with another shape, instead of reading its messages at the wrong offsets. The
    message format tells fp8 from bf16 dispatch messages and LogFMT from bf16 combine rows."""
    h = 0x811C9DC5
    for v in (T, hidden, num_experts, message_format):
        for byte in int(v).to_bytes(4, "little", signed=False):
            h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF  # FNV-1a
    return (h ^ (h >> 16)) & 0xFFFF


def rdma_size_hint(
    num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int, packed: bool = False
) -> int:
    """DeepEP's num_rdma_bytes for two alternating LL buffers (signal | send | recv each); ep_rt uses the signal
    share as slack and keeps its signals in a control area of its own. `packed`: the two halves the packed layout
    needs (packed_data_bytes; see the module doc for how it compares)."""
    for name, v in (
        ("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank),
        ("hidden", hidden),
        ("num_ranks", num_ranks),
        ("num_experts", num_experts),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if hidden % 128:
        raise ValueError(f"hidden must be a multiple of 128, got {hidden}")
    T, E = num_max_dispatch_tokens_per_rank, num_experts
    if packed:
        if E % num_ranks:
            raise ValueError(f"num_experts must be a multiple of num_ranks, got {E} and {num_ranks}")
        send, recv = packed_data_bytes(T, hidden, num_ranks, E)
        return 2 * ((send + recv + 127) // 128 * 128)  # each half rounded up, as buffer_offsets rounds it down
    signal = (E * 4 + 127) // 128 * 128
    send, recv = data_bytes(T, hidden, E)
    total = 2 * (signal + send + recv)
    return (total + 128) // 128 * 128
