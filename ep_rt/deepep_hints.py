"""DeepEP V1's buffer size hints, for comparison with ep_rt's (issue 22 item 2; README "Buffer sizes against
DeepEP's"). The formulas of deep_ep's Config.get_nvl_buffer_size_hint / get_rdma_buffer_size_hint (csrc/config.hpp,
as shared/docs/deepep-v1-reference.md gives them) applied to DeepEP's own rows (config_tables) with DeepEP's
default Buffer.num_sms = 20 (10 channels) and an NVSHMEM build (int64 topk_idx, the NVL SourceMeta included); the
sizes Megatron-Core's and SGLang's get_buffer ask for are the larger of the dispatch and the combine row's."""

from __future__ import annotations

from . import config_tables

DEEPEP_NUM_SMS = 20
_MAX_TOPK = _MAX_SCALES = 128  # DeepEP's per-token slots for top-k and scales
_TOPK_IDX_BYTES = 8


def _align(n: int) -> int:
    return (n + 127) // 128 * 128


def nvl_bytes(num_sms: int, nvl_recv: int, hidden_bytes: int, nvl_peers: int, rdma_ranks: int) -> int:
    """DeepEP's NVL formula for `nvl_peers` ranks per node and `rdma_ranks` nodes (DeepEP itself: min(R, 8) and
    max(R / 8, 1)): per channel and NVL peer, 2 * rdma_ranks + 3 ints and a ring of nvl_recv token slots."""
    C, N, Rr, B = num_sms // 2, nvl_peers, rdma_ranks, nvl_recv
    per_token = hidden_bytes + 8 + _MAX_TOPK * _TOPK_IDX_BYTES + _MAX_TOPK * 4 + _MAX_SCALES * 4
    return _align(C * N * (2 * Rr + 3) * 4 + C * N * B * per_token)


def rdma_bytes(num_sms: int, rdma_send: int, rdma_recv: int, hidden_bytes: int, rdma_ranks: int) -> int:
    """DeepEP's RDMA formula for `rdma_ranks` nodes: per channel and node, a send and a receive ring of rdma_recv
    token slots (rounded up to a multiple of rdma_send, as DeepEP's Config does) and their head and tail words."""
    C, Rr = num_sms // 2, rdma_ranks
    Br = -(-rdma_recv // rdma_send) * rdma_send
    per_token = hidden_bytes + 8 + _MAX_TOPK * _TOPK_IDX_BYTES + _MAX_TOPK * 4 + _MAX_SCALES * 4 + 16
    return _align(C * Rr * (8 * 2 + 2) * 2 * 4 + 2 * C * Rr * Br * per_token)


def nvl_hint(row: config_tables.Row, hidden_bytes: int, num_ranks: int, num_sms: int = DEEPEP_NUM_SMS) -> int:
    return nvl_bytes(num_sms, row.nvl_recv, hidden_bytes, min(num_ranks, 8), max(num_ranks // 8, 1))


def rdma_hint(row: config_tables.Row, hidden_bytes: int, num_ranks: int, num_sms: int = DEEPEP_NUM_SMS) -> int:
    if num_ranks <= 8:
        return 0
    return rdma_bytes(num_sms, row.rdma_send, row.rdma_recv, hidden_bytes, num_ranks // 8)


def client_sizes(hidden_bytes: int, num_ranks: int) -> tuple[int, int]:
    """(num_nvl_bytes, num_rdma_bytes) a DeepEP client's get_buffer computes: the larger of the dispatch and the
    combine config's hint, for nodes of 8 GPUs."""
    rows = [config_tables.lookup(kind, num_ranks) for kind in ("dispatch", "combine")]
    return (
        max(nvl_hint(r, hidden_bytes, num_ranks) for r in rows),
        max(rdma_hint(r, hidden_bytes, num_ranks) for r in rows),
    )
