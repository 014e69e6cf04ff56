"""Low-latency buffer layout and sizing (DeepEP V1's formula; the combine message is padded to 16 bytes,
which only changes sizes for hidden sizes that are not multiples of 512)."""
from __future__ import annotations


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


def buffer_offsets(T: int, hidden: int, num_experts: int) -> dict:
    """Byte offsets in the symmetric buffer: signal0 | signal1 | send0 | send1 | recv0 | recv1."""
    d, c = dispatch_msg_bytes(hidden), combine_msg_bytes(hidden)
    signal = (num_experts * 4 + 127) // 128 * 128
    send = max(T * d, num_experts * T * c)
    recv = max(num_experts * T * d, num_experts * T * c)
    return {"signal": (0, signal), "send": (2 * signal, 2 * signal + send),
            "recv": (2 * signal + 2 * send, 2 * signal + 2 * send + recv), "total": 2 * (signal + send + recv)}


def rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """Bytes of symmetric buffer for two alternating LL buffers: signal | send | recv each."""
    if hidden % 128:
        raise ValueError(f"hidden must be a multiple of 128, got {hidden}")
    total = buffer_offsets(num_max_dispatch_tokens_per_rank, hidden, num_experts)["total"]
    return (total + 128) // 128 * 128
