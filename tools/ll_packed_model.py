"""A CPU model of the packed LL receive areas that docs/LL_PACKED_DESIGN.md proposes (issue 22; not built: no kernel
uses this layout). It places every message of a call the way the design says, so a test can check the design's
claims on random routings before any kernel is written, and it prints the design's size table from
ep_rt.transport.ll_layout's message sizes.

    python tools/ll_packed_model.py            # the size table (MiB per buffer)

Dispatch: at receiver r, source s owns a block of T x min(K, L) slots; its messages for local expert l start at
base[s][r][l], the sum of s's counts to r's lower local experts, and keep today's order inside the (expert, source)
cell (the number of earlier (t', k') in token-major order that chose the same expert). Combine: the row of
selection (t, k) comes back to its source at slot t x K + k (the expert's rank knows k from the dispatch message's
header, kept in the handle's second src_info plane)."""

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
    """{(t, k): (destination rank, slot in this source's block there)}; raises ValueError where today's kernels
    raise EP_RT_ERR_CAPACITY (a cell past T messages: duplicates of an expert in a token)."""
    L = num_experts // num_ranks
    slots = cell_slots(topk)
    counts = [[0] * L for _ in range(num_ranks)]
    for e, slot in slots.values():
        if slot >= T:
            raise ValueError(f"expert {e} gets more than {T} messages from one source")
        counts[e // L][e % L] += 1
    base = [[sum(c[:l]) for l in range(L)] for c in counts]  # what the receiver rebuilds from the count signals
    return {tk: (e // L, base[e // L][e % L] + slot) for tk, (e, slot) in slots.items()}


def combine_slots(topk: list[list[int]]) -> dict:
    """{(t, k): slot in the source's combine receive area} for the valid selections."""
    K = len(topk[0]) if topk else 0
    return {(t, k): t * K + k for t, row in enumerate(topk) for k, e in enumerate(row) if e >= 0}


def buffer_bytes(T: int, hidden: int, num_ranks: int, num_experts: int, K: int) -> tuple[int, int]:
    """(today's, packed) data bytes of one LL buffer (staging + receive) at this shape."""
    send, recv = ll_layout.data_bytes(T, hidden, num_experts)
    d, c = ll_layout.dispatch_msg_bytes(hidden), ll_layout.combine_msg_bytes(hidden)
    L = num_experts // num_ranks
    packed_recv = max(num_ranks * T * min(K, L) * d, T * K * c)
    return send + recv, send + packed_recv


TABLE = ((2, 288, 7168), (8, 256, 4096), (8, 288, 7168), (16, 288, 7168), (64, 256, 7168))


def table(T: int = 128, K: int = 8) -> list[tuple]:
    """(ranks, experts, hidden, today MiB, packed MiB, ratio) per row of LL_PACKED_DESIGN.md's table."""
    rows = []
    for R, E, H in TABLE:
        today, packed = buffer_bytes(T, H, R, E, K)
        rows.append((R, E, H, round(today / MIB, 1), round(packed / MIB, 1), round(packed / today, 2)))
    return rows


def whole_buffer(T: int, hidden: int, num_ranks: int, num_experts: int, K: int) -> tuple[int, int, int]:
    """(DeepEP's hint, ep_rt's LL allocation today, the same with packed receive areas) in bytes: an allocation is
    num_rdma_bytes (two halves) and ep_rt's control area after it (ll_layout.control_offsets); packed, each half
    holds the packed bytes rounded up to 128."""
    hint = ll_layout.rdma_size_hint(T, hidden, num_ranks, num_experts)
    control = ll_layout.control_offsets(hint, num_ranks)["end"] - hint
    _, packed = buffer_bytes(T, hidden, num_ranks, num_experts, K)
    num_rdma_bytes = 2 * ((packed + 127) // 128 * 128)
    return hint, hint + control, ll_layout.control_offsets(num_rdma_bytes, num_ranks)["end"]


def whole_table(T: int = 128, K: int = 8) -> list[tuple]:
    """(ranks, experts, hidden, DeepEP's hint MiB, ep_rt today MiB, packed MiB) per row of TABLE."""
    rows = []
    for R, E, H in TABLE:
        rows.append((R, E, H) + tuple(round(b / MIB, 1) for b in whole_buffer(T, H, R, E, K)))
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
