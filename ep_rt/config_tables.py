"""Tuned Config values by rank count: data rows, kept apart from code (DeepEP V1's static tables)."""
from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    kind: str            # "dispatch" or "combine"
    num_ranks: int
    nvl_send: int        # num_max_nvl_chunked_send_tokens
    nvl_recv: int        # num_max_nvl_chunked_recv_tokens
    rdma_send: int       # num_max_rdma_chunked_send_tokens
    rdma_recv: int       # num_max_rdma_chunked_recv_tokens


# num_sms comes from Buffer.num_sms, as in DeepEP.
ROWS = (
    Row("dispatch", 2, 24, 256, 6, 128),
    Row("dispatch", 4, 6, 256, 6, 128),
    Row("dispatch", 8, 6, 256, 6, 128),
    Row("combine", 2, 10, 256, 6, 128),
    Row("combine", 4, 9, 256, 6, 128),
    Row("combine", 8, 4, 256, 6, 128),
)


def lookup(kind: str, num_ranks: int) -> Row:
    for row in ROWS:
        if row.kind == kind and row.num_ranks == num_ranks:
            return row
    tuned = sorted(r.num_ranks for r in ROWS if r.kind == kind)
    raise ValueError(f"no tuned config ({kind}) for {num_ranks} ranks (tuned: {tuned}); pass config= explicitly")
