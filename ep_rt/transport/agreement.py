"""Collective allocations that cannot diverge (NETWORK.md 7).

A Buffer's collective setup (the NVL buffer's IPC exchange, NVSHMEM's initialisation, nvshmem_align of the symmetric
buffers) hangs, or places offsets differently on different ranks, when the ranks disagree on what decides a size, a
layout, a mode or the NVSHMEM world, or when one rank fails before a collective its peers are already in. So before
any of it, every rank runs its local preparation (argument checks, the NVSHMEM environment it would set, the world it
would join) and contributes the values that must agree plus any error it met; one all_gather_object over the
Buffer's group compares them, and every rank raises: RankMismatchError naming the ranks and their values when the
values differ, else the failed rank its own error and the others PeerSetupError naming it.
"""

from __future__ import annotations

from typing import Callable, Mapping

from .. import env
from ..errors import PeerSetupError, RankMismatchError

_MAX_GROUPS = 6  # distinct values shown per input


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def differences(values_by_rank: list[Mapping]) -> list[str]:
    """One line per input whose value is not the same on every rank that has it, e.g.
    "num_rdma_bytes: 1073741824 on ranks 0-2; 536870912 on rank 3". Inputs missing on some rank (one whose
    preparation failed before computing them) are compared over the ranks that have them."""
    names: list[str] = []
    for values in values_by_rank:
        names += [k for k in values if k not in names]
    lines = []
    for name in names:
        groups: dict[str, list[int]] = {}
        for rank, values in enumerate(values_by_rank):
            if name in values:
                groups.setdefault(repr(values[name]), []).append(rank)
        if len(groups) <= 1:
            continue
        shown = sorted(groups.items(), key=lambda kv: kv[1][0])
        text = "; ".join(f"{v} on {_ranks(rs)}" for v, rs in shown[:_MAX_GROUPS])
        if len(shown) > _MAX_GROUPS:
            text += f"; and {len(shown) - _MAX_GROUPS} other values"
        lines.append(f"{name}: {text}")
    return lines


def verdict(contributions: list[dict], rank: int) -> Exception | None:
    """The exception rank `rank` raises after the exchange (None: every rank agrees and none failed). Every rank
    computes it from the same list, so all of them raise, and all of them name the same ranks."""
    errors = [(r, c["error"]) for r, c in enumerate(contributions) if c.get("error")]
    diffs = differences([c.get("values", {}) for c in contributions])
    failed = "; ".join(f"rank {r}: {kind}: {message}" for r, (kind, message) in errors)
    if diffs:
        return RankMismatchError(
            "the ranks of this Buffer's group must make the same Buffer(...) call with the same ep_rt / NVSHMEM "
            "settings (they decide the sizes and layout of collective allocations, and the NVSHMEM world), but "
            "these differ: "
            + " | ".join(diffs)
            + (f". Setup also failed on {failed}" if failed else "")
            + ". Nothing was allocated; fix the values and create the Buffer again on every rank."
            + "".join(_why(line) for line in diffs)
        )
    if not errors:
        return None
    if any(r == rank for r, _ in errors):
        return None  # the caller re-raises its own exception
    return PeerSetupError(
        f"rank {rank}: another rank failed to set up this Buffer, so no rank started the "
        f"collective allocations ({failed}); nothing was allocated here"
    )


def _why(difference: str) -> str:
    """Plain words for a difference whose cause the values alone do not tell."""
    if difference.startswith("NVSHMEM world:") and "initialise " in difference and "join the live " in difference:
        # A restarted (or new) process beside ranks that still hold the world an earlier Buffer started.
        return (
            " The ranks that would join a live NVSHMEM world still hold the one an earlier Buffer started, while the "
            "others have none (a restarted or new process): NVSHMEM starts once per process, and its teardown needs "
            "every peer it started with, so that world cannot take the new process. Restart every process of the "
            "group; or, while all of them are alive, destroy() every Buffer on every rank before making new ones. "
            "Buffers that need no NVSHMEM (high-throughput on one node) can still be made."
        )
    return ""


def _knob(read: Callable[[], object]) -> object:
    """A knob's parsed value, or a note of why it does not parse (the preparation raises that error itself)."""
    try:
        return read()
    except Exception as e:
        return f"invalid ({e})"


def buffer_values(args: Mapping, topology) -> dict:
    """What every rank of a Buffer must share before anything is allocated: the constructor arguments that decide
    sizes and modes, the node structure, and the ep_rt knobs that choose the transport or the cubin variant (the
    NVSHMEM variables follow from the preparation: nvshmem.Preparation.shared_values)."""
    values = {name: args[name] for name in sorted(args)}
    values["nodes (Topology)"] = f"{topology.num_nodes} of {topology.node_size}" + (
        " (emulated)" if topology.emulated else ""
    )
    values["EP_RT_REMOTE_TRANSPORT"] = _knob(env.remote_transport)
    values["EP_RT_NVSHMEM_DEBUG"] = _knob(env.nvshmem_debug)
    values["EP_RT_CHAOS_TRANSPORT"] = _knob(env.chaos_transport)
    return values


def exchange(group, values: Mapping, prepare: Callable[[], object] | None = None):
    """Collective over `group`: run `prepare()` (this rank's local preparation; it may raise), contribute `values`
    (plus, when prepare returns a (values, result) pair, its values) and the error, compare every rank's, and raise
    on every rank when they differ or any rank failed. Returns prepare's result."""
    from . import collective

    mine = dict(values)
    result, error = None, None
    try:
        if prepare is not None:
            extra, result = prepare()
            mine.update(extra)
    except Exception as e:  # shipped to the peers, re-raised below
        error = e
    contribution = {"values": mine, "error": None if error is None else (type(error).__name__, str(error))}
    table = collective.all_gather_object(group, contribution)
    problem = verdict(table, collective.rank(group))
    if problem is not None:
        raise problem from error
    if error is not None:
        raise error
    return result
