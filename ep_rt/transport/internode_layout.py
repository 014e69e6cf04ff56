"""The internode buffers (kernels_src/internode.cu): the symmetric buffer and each rank's NVL area, at offsets
identical on every rank.

Symmetric buffer: the caller's num_rdma_bytes hold two equal halves, a staging area and a receive area, each
[N nodes][cap] records of the call's record size (so cap, the longest (rank -> node) stream a call may have, follows
from the buffer and the call's shape alone, the same on every rank). A control area at fixed offsets follows: the
notify slots to and from each node's rail peer and the signal words, one u64 word per (sender node, chunk) for each
kind of call. Only the network (a rail peer's put-with-signal or signal op) and the rank itself write there, and only
the rank itself reads it. Dispatch and combine reuse the halves: every call starts with an all-to-all (notify or
handshake) that each rank enters only once its previous call's readers are done.

NVL area (the data region of each rank's NVL buffer, IPC-mapped on its node): a control part (the notify slots its
node's rail peers relay to it, one per source rank, handshake words, its published start rows, the forwarders'
"block (src, c) pushed" flags, the combine ready flag and prefix), then the records region: the dispatch records the
forwarders push at their final rows, or the combine rows (bf16 row + f32 weights) this rank publishes.
"""

from __future__ import annotations

from ..runtime import abi
from .nvl_layout import Rounds

ALIGN = 128
MAX_RANKS = abi.EP_RT_IN_MAX_RANKS
MAX_NODES = abi.EP_RT_IN_MAX_NODES
MAX_CHANNELS = abi.EP_RT_MAX_CHANNELS
MAX_LOCAL_EXPERTS = abi.EP_RT_MAX_LOCAL_EXPERTS
HS_KINDS = abi.EP_RT_IN_HS_KINDS
STREAM_CHUNKS = abi.EP_RT_IN_STREAM_CHUNKS


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def dispatch_record_bytes(hidden_bytes: int, num_scales: int, num_topk: int) -> int:
    """Row, scales (32-bit words), top-k ids (int32) and weights, source token and mask; 16-aligned."""
    return _align(hidden_bytes + 4 * num_scales + 8 * num_topk + 8, 16)


def combine_record_bytes(hidden: int, num_topk: int) -> int:
    """A bf16 row of `hidden` and num_topk f32 weights, 16-aligned (symmetric areas and NVL rows alike)."""
    return _align(2 * hidden + 4 * num_topk, 16)


def network_slot_bytes(num_ranks: int, num_nodes: int) -> int:
    """One notify slot a rank puts to its rail peer on another node (params.h): header, rank and node totals, the
    stream counts, and for each of that node's ranks its channel and expert counts, at the most channels and local
    experts any call may have."""
    G = num_ranks // num_nodes
    words = abi.EP_RT_IN_SLOT_HEADER + num_ranks + num_nodes + MAX_CHANNELS + G * (MAX_CHANNELS + MAX_LOCAL_EXPERTS)
    return _align(4 * words)


def relayed_slot_bytes(num_ranks: int, num_nodes: int) -> int:
    """One notify slot a rail peer relays to a rank of its node: as the network slot, with one rank's part."""
    words = abi.EP_RT_IN_SLOT_HEADER + num_ranks + num_nodes + MAX_CHANNELS + MAX_CHANNELS + MAX_LOCAL_EXPERTS
    return _align(4 * words)


def _packed(sizes, start: int, end_name: str) -> dict:
    """Offsets of the (name, bytes) regions one after another from `start`, each ALIGN-aligned; end_name: past them."""
    offsets, at = {}, start
    for name, size in sizes:
        offsets[name] = at
        at = _align(at + size)
    offsets[end_name] = at
    return offsets


def control_offsets(num_rdma_bytes: int, num_ranks: int, num_nodes: int) -> dict:
    """Byte offsets of the symmetric control area, which starts after the caller's num_rdma_bytes; "end" = the
    allocation, "slot_bytes" = one network notify slot."""
    slot = network_slot_bytes(num_ranks, num_nodes)
    sizes = (
        ("notify_send", num_nodes * slot),
        ("notify_recv", num_nodes * slot),
        ("notify_words", num_nodes * 8),
        ("dispatch_words", num_nodes * MAX_CHANNELS * STREAM_CHUNKS * 8),
        ("combine_words", num_nodes * MAX_CHANNELS * STREAM_CHUNKS * 8),
        ("hs_words", HS_KINDS * num_nodes * 8),
        ("own_ready", 2 * MAX_CHANNELS * 8),
    )
    return {**_packed(sizes, _align(num_rdma_bytes), "end"), "slot_bytes": slot}


def nvl_control_offsets(num_ranks: int, num_nodes: int) -> dict:
    """Byte offsets of a rank's internode NVL area; "records" = where the records region starts (the control part's
    size), "slot_bytes" = one relayed notify slot."""
    slot = relayed_slot_bytes(num_ranks, num_nodes)
    sizes = (
        ("slots", num_ranks * slot),
        ("slot_flags", num_ranks * 8),
        ("hs", HS_KINDS * abi.EP_RT_MAX_NVL_RANKS * 8),
        ("pub", num_ranks * MAX_CHANNELS * 4),
        ("pub_flag", 8),
        ("relay", num_ranks * MAX_CHANNELS * 8),
        ("ready", 8),
        ("ready_prefix", num_ranks * 4),
    )
    return {**_packed(sizes, 0, "records"), "slot_bytes": slot}


def fill_nvl(nvl: abi.InternodeNvlLayout, offsets: dict, num_nvl_bytes: int) -> int:
    """The NVL area's layout; returns the bytes of its records region (0 when the control part does not fit)."""
    for name, offset in offsets.items():
        setattr(nvl, name, offset)
    nvl.records_bytes = max(0, num_nvl_bytes - offsets["records"])
    return nvl.records_bytes


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
    record = max(
        dispatch_record_bytes(hidden_bytes, hidden_bytes // 128 + 1, 32),
        combine_record_bytes(max(hidden_bytes // 2, 8), 32),
    )
    return rdma_bytes_for(record, num_nodes, num_max_tokens_per_rank)


def nvl_size_hint(hidden_bytes: int, num_ranks: int, num_ranks_per_node: int, num_max_tokens_per_rank: int) -> int:
    """num_nvl_bytes for the worst case (every rank's every token to this rank): that many dispatch records (with
    FP8 scales and top-k up to 32, as rdma_size_hint) pushed by the forwarders, or as many combine rows, after the
    NVL area's control part."""
    num_nodes = num_ranks // num_ranks_per_node
    hidden = max(hidden_bytes // 2, 8)
    record = max(dispatch_record_bytes(hidden_bytes, hidden_bytes // 128 + 1, 32), combine_record_bytes(hidden, 32))
    return _align(nvl_control_offsets(num_ranks, num_nodes)["records"] + num_ranks * num_max_tokens_per_rank * record)


def rounds_for(stream_capacity: int, recv_capacity: int, num_ranks: int, max_tokens: int):
    """The rounds of an internode call whose largest rank has max_tokens tokens (nvl_layout.Rounds: round k is every
    rank's tokens [k * T, (k + 1) * T)): a (rank -> node) stream of a round holds at most T records and at most
    num_ranks * T rows reach a rank, so T is the largest value within `stream_capacity` records per node area and
    `recv_capacity` rows of the NVL buffer (each the smaller of the dispatch's and its combine's). None when not even
    one token per rank fits a round."""
    per_round = min(stream_capacity, recv_capacity // num_ranks)
    if per_round <= 0:
        return None
    return Rounds(per_round, max(-(-max_tokens // per_round), 1))
