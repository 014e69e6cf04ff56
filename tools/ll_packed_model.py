"""A CPU model of the packed LL layout (docs/LL_PACKED_DESIGN.md; built as the LL cubins' packed variants,
EP_RT_LL_PACKED=1). It places every message of a call the way the design says, written apart from the kernels and
from ep_rt.transport.ll_layout's packed sizes, so tests can hold both to it on random routings, and it prints the
design's size tables from ll_layout's message sizes.

    python tools/ll_packed_model.py            # the size tables (MiB)

Dispatch: at receiver r, source s owns a block of T x min(16, L) slots (16: the largest top-k); its messages for
local expert l start at base[s][r][l], the sum of s's counts to r's lower local experts, and keep today's order
inside the (expert, source) cell (the number of earlier (t', k') in token-major order that chose the same expert).
Combine: the row of selection (t, k) comes back to its source at slot t x min(16, E) + k (the expert's rank knows k
from the dispatch message's header, kept in the handle's second src_info plane). Staging: a copy of each token per
choice (the header differs in k), T x min(16, E) messages, or the zero-copy combine rows, E x T."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ep_rt.transport import ll_layout  # noqa: E402

MIB = 1 << 20


def cell_slots(topk: list[list[int]]) -> dict:
    """{(t, k): (expert, slot)} for one source's valid selections: slot = how many earlier (t', k') in token-major
    order chose the same expert (today's slot inside the (expert, source) cell, which the packed layout keeps)."""
    seen: dict[int, int] = {}
    out = {}
    for t, row in enumerate(topk):
        for k, e in enumerate(row):
            if e < 0:
                continue
            out[(t, k)] = (e, seen.get(e, 0))
            seen[e] = seen.get(e, 0) + 1
    return out


def dispatch_positions(topk: list[list[int]], num_experts: int, num_ranks: int, T: int) -> dict:
    """{(t, k): (destination rank, slot in this source's block there)}; raises ValueError where the kernels raise
    EP_RT_ERR_CAPACITY (a cell past T messages: duplicates of an expert in a token)."""
    L = num_experts // num_ranks
    slots = cell_slots(topk)
    counts = [[0] * L for _ in range(num_ranks)]
    for e, slot in slots.values():
        if slot >= T:
            raise ValueError(f"expert {e} gets more than {T} messages from one source")
        counts[e // L][e % L] += 1
    base = [[sum(c[:l]) for l in range(L)] for c in counts]  # what the receiver rebuilds from the count signals
    return {tk: (e // L, base[e // L][e % L] + slot) for tk, (e, slot) in slots.items()}


MAX_TOPK = 16  # the largest top-k an LL call takes


def block_slots(T: int, num_ranks: int, num_experts: int) -> int:
    """A source's dispatch block at one receiver: a token reaches at most min(16, L) of the receiver's L experts."""
    return T * min(MAX_TOPK, num_experts // num_ranks)


def combine_slots(topk: list[list[int]], num_experts: int) -> dict:
    """{(t, k): slot in the source's combine receive area} for the valid selections."""
    per_token = min(MAX_TOPK, num_experts)
    return {(t, k): t * per_token + k for t, row in enumerate(topk) for k, e in enumerate(row) if e >= 0}


def buffer_bytes(T: int, hidden: int, num_ranks: int, num_experts: int) -> tuple[int, int, int, int]:
    """(today's staging, today's receive, packed staging, packed receive) bytes of one LL buffer at this shape."""
    send, recv = ll_layout.data_bytes(T, hidden, num_experts)
    d, c = ll_layout.dispatch_msg_bytes(hidden), ll_layout.combine_msg_bytes(hidden)
    per_token = min(MAX_TOPK, num_experts)
    packed_send = max(T * per_token * d, num_experts * T * c)  # a copy per choice, or the zero-copy combine rows
    packed_recv = max(num_ranks * block_slots(T, num_ranks, num_experts) * d, T * per_token * c)
    return send, recv, packed_send, packed_recv


TABLE = ((2, 288, 7168), (8, 256, 4096), (8, 288, 7168), (16, 288, 7168), (64, 256, 7168), (160, 320, 7168))


def table(T: int = 128) -> list[tuple]:
    """(ranks, experts, hidden, today MiB, packed MiB, ratio) per row of LL_PACKED_DESIGN.md's table."""
    rows = []
    for R, E, H in TABLE:
        send, recv, packed_send, packed_recv = buffer_bytes(T, H, R, E)
        today, packed = send + recv, packed_send + packed_recv
        rows.append((R, E, H, round(today / MIB, 1), round(packed / MIB, 1), round(packed / today, 2)))
    return rows


def packed_num_rdma_bytes(T: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """num_rdma_bytes the packed layout needs: two halves, each its receive and staging areas, rounded up to 128."""
    _, _, send, recv = buffer_bytes(T, hidden, num_ranks, num_experts)
    return 2 * ((recv + send + 127) // 128 * 128)


def whole_buffer(T: int, hidden: int, num_ranks: int, num_experts: int) -> tuple[int, int, int]:
    """(DeepEP's hint, ep_rt's LL allocation today, the same packed) in bytes: an allocation is num_rdma_bytes
    (two halves) and ep_rt's control area after it (ll_layout.control_offsets)."""
    hint = ll_layout.rdma_size_hint(T, hidden, num_ranks, num_experts)
    control = ll_layout.control_offsets(hint, num_ranks)["end"] - hint
    packed = packed_num_rdma_bytes(T, hidden, num_ranks, num_experts)
    return hint, hint + control, ll_layout.control_offsets(packed, num_ranks)["end"]


def whole_table(T: int = 128) -> list[tuple]:
    """(ranks, experts, hidden, DeepEP's hint MiB, ep_rt today MiB, packed MiB) per row of TABLE."""
    rows = []
    for R, E, H in TABLE:
        rows.append((R, E, H) + tuple(round(b / MIB, 1) for b in whole_buffer(T, H, R, E)))
    return rows


def main() -> None:
    print("Per buffer (MiB):")
    print("| ranks | experts | hidden | today (DeepEP's) | packed | ratio |")
    print("|---|---|---|---|---|---|")
    for row in table():
        print("| " + " | ".join(str(v) for v in row) + " |")
    print("Per Buffer, both buffers and the control area (MiB):")
    print("| ranks | experts | hidden | DeepEP's hint | ep_rt today | ep_rt packed |")
    print("|---|---|---|---|---|---|")
    for row in whole_table():
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
