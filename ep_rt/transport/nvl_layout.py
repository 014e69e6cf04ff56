"""Byte layout of a rank's NVL buffer, identical on every rank.

[control region | data region]. The control region holds the per-source notify slots, the
sequence-numbered flags, the error claim word and the call sequence numbers; the data region is reused by every call, laid
out per call as a structure of arrays whose row index is the token's final receive row.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime import abi

MAX_NVL_RANKS = abi.EP_RT_MAX_NVL_RANKS
MAX_CHANNELS = abi.EP_RT_MAX_CHANNELS
MAX_LOCAL_EXPERTS = abi.EP_RT_MAX_LOCAL_EXPERTS
MAX_TOPK = abi.EP_RT_MAX_TOPK
ALIGN = 128


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def _control_layout() -> tuple[dict, int]:
    offsets, cursor = {}, 0
    for name, nbytes in (
        ("notify_slots", MAX_NVL_RANKS * abi.EP_RT_NOTIFY_SLOT_BYTES),
        ("barrier_flags", MAX_NVL_RANKS * 8),
        ("dispatch_ready", MAX_NVL_RANKS * 8),
        ("combine_ready", MAX_NVL_RANKS * 8),
        ("dispatch_done", MAX_NVL_RANKS * MAX_CHANNELS * 8),
        ("combine_done", MAX_NVL_RANKS * MAX_CHANNELS * 8),
        ("error_claim", 4),
        ("call_seq", abi.EP_RT_CALL_KINDS * (8 + 4)),
    ):
        offsets[name] = cursor
        cursor = align(cursor + nbytes)
    return offsets, align(cursor, 4096)


CONTROL_OFFSETS, CONTROL_BYTES = _control_layout()


def fill_control(ctrl: abi.ControlLayout, data_bytes: int) -> None:
    for name, offset in CONTROL_OFFSETS.items():
        setattr(ctrl, name, offset)
    ctrl.data = CONTROL_BYTES
    ctrl.data_bytes = data_bytes


def _soa(data_bytes: int, widths: list[int]) -> tuple[list[int], int]:
    """Offsets of arrays of `widths` bytes per row, each 128-aligned, and how many rows fit."""
    row = sum(widths)
    capacity = max((data_bytes - ALIGN * len(widths)) // row, 0) if row else 0
    offsets, cursor = [], 0
    for w in widths:
        offsets.append(cursor)
        cursor = align(cursor + w * capacity)
    return offsets, capacity


@dataclass(frozen=True)
class DispatchRows:
    hidden_bytes: int
    num_scales: int
    num_topk: int

    def widths(self) -> list[int]:
        return [self.hidden_bytes, 4 * self.num_scales, 8 * self.num_topk, 4 * self.num_topk, 4]

    def fill(self, region: abi.DispatchRegion, data_bytes: int) -> int:
        (region.x, region.scales, region.topk_idx, region.topk_weights, region.src_idx), cap = _soa(
            data_bytes, self.widths()
        )
        region.capacity = cap
        return cap


@dataclass(frozen=True)
class CombineRows:
    hidden: int
    num_topk: int

    def widths(self) -> list[int]:
        return [2 * self.hidden, 4 * self.num_topk]

    def fill(self, region: abi.CombineRegion, data_bytes: int) -> int:
        (region.x, region.topk_weights), cap = _soa(data_bytes, self.widths())
        region.capacity = cap
        return cap


def nvl_bytes_for(hidden_bytes: int, rows: int) -> int:
    """num_nvl_bytes that hold `rows` received rows of `hidden_bytes` (FP8 scales, top-k up to 32) in
    dispatch, and the same rows sent back in combine (bf16 rows of at most hidden_bytes)."""
    dispatch = sum(DispatchRows(hidden_bytes, hidden_bytes // 128, MAX_TOPK).widths())
    combine = hidden_bytes + 4 * MAX_TOPK
    return align(max(dispatch, combine) * rows + ALIGN * 5)


@dataclass(frozen=True)
class Rounds:
    """How a call that does not fit the data region goes through it (kernels_src/include/ep_rt/params.h): round k
    carries every source's tokens [k * tokens_per_round, (k + 1) * tokens_per_round), so at most
    num_ranks * tokens_per_round rows reach any rank in a round, in dispatch and in combine alike."""

    tokens_per_round: int
    num_rounds: int

    def token_range(self, k: int, num_tokens: int) -> tuple[int, int]:
        begin = min(k * self.tokens_per_round, num_tokens)
        return begin, min(begin + self.tokens_per_round, num_tokens)


def rounds_for(capacity: int, combine_capacity: int, num_ranks: int, max_tokens: int) -> Rounds | None:
    """The rounds of a call whose largest rank has max_tokens tokens, for a data region of `capacity` dispatch
    rows and `combine_capacity` combine rows; None when not even one token per source fits a round."""
    per_round = min(capacity, combine_capacity) // num_ranks
    if per_round <= 0:
        return None
    return Rounds(per_round, max(-(-max_tokens // per_round), 1))
