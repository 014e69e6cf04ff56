"""The internode symmetric buffer (kernels_src/internode.cu): offsets identical on every rank.

The caller's num_rdma_bytes hold two equal halves, a staging area and a receive area, each [N nodes][cap] records
of the call's record size (so cap, the longest (rank -> node) stream a call may have, follows from the buffer and
the call's shape alone, the same on every rank). A control area at fixed offsets follows: notify slots and
signal words, one u64 word per (sender, chunk) for each kind of call, the forwarders' relay flags and the combine
ready flags. Dispatch and combine reuse the halves: every call starts with an all-to-all (notify or handshake)
that each rank enters only once its previous call's readers are done.

The NVL buffer of each rank holds its combine input rows (bf16 row + f32 weights, 16-aligned) for the node's
forwarders to read.
"""
from __future__ import annotations

from ..runtime import abi

ALIGN = 128
MAX_RANKS = abi.EP_RT_IN_MAX_RANKS
MAX_NODES = abi.EP_RT_IN_MAX_NODES
MAX_CHANNELS = abi.EP_RT_MAX_CHANNELS
SLOT_BYTES = abi.EP_RT_IN_NOTIFY_SLOT_BYTES


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def dispatch_record_bytes(hidden_bytes: int, num_scales: int, num_topk: int) -> int:
    """Row, scales (32-bit words), top-k ids (int32) and weights, source token and mask; 16-aligned."""
    return _align(hidden_bytes + 4 * num_scales + 8 * num_topk + 8, 16)


def combine_record_bytes(hidden: int, num_topk: int) -> int:
    """A bf16 row of `hidden` and num_topk f32 weights, 16-aligned (symmetric areas and NVL rows alike)."""
    return _align(2 * hidden + 4 * num_topk, 16)


def control_offsets(num_rdma_bytes: int, num_ranks: int, num_nodes: int) -> dict:
    """Byte offsets of the control area, which starts after the caller's num_rdma_bytes; "end" = the allocation."""
    sizes = (
        ("notify_send", num_ranks * SLOT_BYTES),
        ("notify_recv", num_ranks * SLOT_BYTES),
        ("notify_words", num_ranks * 8),
        ("dispatch_words", num_nodes * MAX_CHANNELS * 8),
        ("combine_words", num_nodes * MAX_CHANNELS * 8),
        ("cached_words", num_ranks * 8),
        ("combine_hs", num_ranks * 8),
        ("relay", num_nodes * MAX_CHANNELS * 8),
        ("relay_prefix", num_nodes * MAX_CHANNELS * 4),
        ("ready", 8),
        ("ready_prefix", num_ranks * 4),
        ("barrier_words", num_ranks * 8),
    )
    offsets, at = {}, _align(num_rdma_bytes)
    for name, size in sizes:
        offsets[name] = at
        at = _align(at + size)
    offsets["end"] = at
    return offsets


def half_bytes(num_rdma_bytes: int) -> int:
    return num_rdma_bytes // 2 // ALIGN * ALIGN


def capacity(num_rdma_bytes: int, num_nodes: int, record_bytes: int) -> int:
    """Records per node area: the longest (rank -> node) stream a call of this record size may have."""
    return half_bytes(num_rdma_bytes) // (num_nodes * record_bytes)


def fill(lay: abi.InternodeLayout, control: dict, num_rdma_bytes: int, num_nodes: int, record_bytes: int) -> int:
    """The layout of one call (record size known); returns its capacity."""
    for name, offset in control.items():
        setattr(lay, name, offset)
    lay.stage, lay.recv = 0, half_bytes(num_rdma_bytes)
    lay.record_bytes = record_bytes
    lay.cap = capacity(num_rdma_bytes, num_nodes, record_bytes)
    return lay.cap


def rdma_bytes_for(record_bytes: int, num_nodes: int, max_stream: int) -> int:
    """num_rdma_bytes whose areas hold `max_stream` records per node (a multiple of 128)."""
    return _align(2 * num_nodes * max_stream * record_bytes + 2 * ALIGN)


def rdma_size_hint(hidden_bytes: int, num_ranks: int, num_ranks_per_node: int, num_max_tokens_per_rank: int) -> int:
    """num_rdma_bytes for dispatches of up to num_max_tokens_per_rank tokens per rank, hidden_bytes per token, with
    FP8 scales (hidden_bytes / 128 words) and top-k up to 32 (so any such dispatch, and its combine, fits)."""
    num_nodes = num_ranks // num_ranks_per_node
    record = max(dispatch_record_bytes(hidden_bytes, hidden_bytes // 128 + 1, 32),
                 combine_record_bytes(max(hidden_bytes // 2, 8), 32))
    return rdma_bytes_for(record, num_nodes, num_max_tokens_per_rank)


def nvl_size_hint(hidden_bytes: int, num_ranks: int, num_max_tokens_per_rank: int) -> int:
    """num_nvl_bytes for the combine input of the worst case: every rank's every token to this rank."""
    hidden = max(hidden_bytes // 2, 8)
    return _align(num_ranks * num_max_tokens_per_rank * combine_record_bytes(hidden, 32))
