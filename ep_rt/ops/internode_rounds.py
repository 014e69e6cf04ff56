"""Internode calls larger than the buffers (issue 22 item 1): a dispatch whose streams or received rows do not fit
goes through the same buffers as ordinary internode calls on token ranges, each round carrying every rank's tokens
[start, end) of its range. Each round's rows are then put at their rows of one pass in the whole call's outputs, so
the outputs and the handle's DeepEP entries are those of one pass; the handle also keeps each round's handle, range
and rows (`rounds`), which its combine and a cached dispatch go through the same way.

How many tokens a round takes: as many as the last counts say fit (the whole call's maxima at first, then the last
round's), scaled by ROOM_USED, between the least that fits whatever the routing (internode_layout.rounds_for: a
stream of T records, R * T rows) and the tokens left. A round's notify finds its own maxima before any data moves: a
round that does not fit moves nothing (its data kernels skip) and is tried again with fewer tokens, down to that
least, which always fits. So a call whose routing spreads its rows takes about (its rows / the buffer's) rounds,
not the worst case's.

What each step rests on: every round is an ordinary internode call (its notify, send, forward and receive, with
their signals, flags and deadlines), so the rules of docs/INTERNODE_DESIGN.md hold per round, and consecutive
rounds are consecutive calls; so is a round tried again. The whole call's notify, the notify that finds the largest
token count and a round that does not fit are followed by the data kernels told to skip (InternodeOp._skip_data),
so no flag they released is left for a later call. Every rank takes the same decisions from the same global
numbers (the notifies' maxima, the largest token count), so every rank runs the same rounds. A call in rounds waits
for each round's counts on the host, so it cannot be captured in a CUDA graph; each row is copied once more (from
the round's outputs to the call's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import validate
from ..errors import BufferTooSmallError
from ..events import allocating_on
from ..handles import DispatchResult, HandleFacts, InternodeHandle, InternodeRounds, with_facts
from ..runtime import abi
from ..runtime.call_plans import copy_struct as _copy
from ..transport import internode_layout as lay_mod
from ..transport import nvl_layout


def round_rows(full_prefix, before, round_prefix, num_rows: int):
    """Where the rows of one round go in the whole call's outputs, and the source of each: full_prefix and
    round_prefix are inclusive prefix sums over sources of the rows in the whole call and in the round (received
    rows: recv_gbl_rank_prefix_sum, over source ranks; forwarded rows: recv_rdma_rank_prefix_sum, over source nodes),
    `before` each source's rows in the earlier rounds (updated in place). In one pass source s's rows are its tokens
    in order from full_prefix[s - 1]; the round's rows of s are the next ones after the earlier rounds'. Device ops
    only (no sync: num_rows, the round's row count, is known on the host). Returns (rows, sources), int64."""
    round_start, full_start = _exclusive(round_prefix), _exclusive(full_prefix)
    counts = round_prefix - round_start
    shift = (full_start + before - round_start).to(torch.int64)
    sources = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts, output_size=num_rows)
    before += counts
    return torch.arange(num_rows, device=counts.device) + shift[sources], sources


def shifted_nvl_heads(heads, sources, sent):
    """A round's send_nvl_head as one pass has it: each entry (a record's position among the records of its source
    for one rank of my node) plus the records of that source for that rank in the earlier rounds (`sent`, [source
    node, rank of my node], updated in place); -1 (not for that rank) stays."""
    to = heads >= 0
    out = torch.where(to, heads + sent[sources], heads)
    sent.index_add_(0, sources, to.to(sent.dtype))
    return out


def put_rows(out, at, rows) -> None:
    """out[at[i]] = rows[i]. Through a byte view for 1-byte floats: CUDA's index_copy_ has no FP8 kernel (the first GPU
    run of FP8 calls in rounds failed on it)."""
    if out.dtype.is_floating_point and out.element_size() == 1:
        out, rows = out.view(torch.uint8), rows.view(torch.uint8)
    out.index_copy_(0, at, rows)


def _exclusive(prefix):
    """An inclusive prefix sum made exclusive (each source's first row)."""
    return torch.cat((prefix.new_zeros(1), prefix[:-1]))


def _rows_of(t, lo: int, hi: int):
    return t[lo:hi] if t is not None else None


ROOM_USED = 0.9  # a round aims at this share of the buffers: counts grow a little unevenly from round to round


@dataclass(frozen=True)
class RoundDoesNotFit:
    """What InternodeOp.dispatch returns for a round whose notify found streams or rows beyond the buffers: it moved
    nothing, and these maxima size the retry (the same on every rank, so every rank retries alike)."""

    max_stream: int
    max_recv: int


def _caps(plan) -> tuple[int, int]:
    """(records a (rank -> node) stream may have, rows a rank may receive), dispatch and combine alike."""
    return min(plan.cap, plan.combine_cap), min(plan.records_rows, plan.combine_rows)


def round_tokens(tokens: int, max_stream: int, max_recv: int, caps, least: int, left: int) -> int:
    """The tokens of the next round: `tokens` tokens gave these maxima, so about tokens * cap / count fit (ROOM_USED
    of it), at least `least` (fits whatever the routing) and at most the `left` tokens."""
    stream_cap, recv_cap = caps
    share = min(stream_cap / max(max_stream, 1), recv_cap / max(max_recv, 1))
    return max(least, min(int(tokens * share * ROOM_USED), left))


def _least_round(op, plan, is_token_in_rank, num_channels: int, comm_stream) -> tuple[int, int]:
    """(tokens of a round that fits whatever the routing, the most tokens any rank has): the same on every rank.
    BufferTooSmallError when not even a token from each rank fits a round (every rank raises alike: the
    capacities are the same everywhere)."""
    R, N = op.num_ranks, op.N
    stream_cap, recv_cap = _caps(plan)
    if lay_mod.rounds_for(stream_cap, recv_cap, R, 0) is None:
        record = max(plan.record, plan.combine_record)
        if stream_cap < 1:
            raise BufferTooSmallError(
                f"rank {op.rank}: the RDMA buffer ({op.num_rdma_bytes} bytes) holds {stream_cap} records of a "
                f"(rank -> node) stream, less than one round (a token from each rank); create the Buffer with "
                f"num_rdma_bytes >= {lay_mod.rdma_bytes_for(record, N, 1)} (nothing was moved; the Buffer stays usable)"
            )
        need = nvl_layout.align(op.nvl_control["records"] + R * record)
        raise BufferTooSmallError(
            f"rank {op.rank}: the NVL buffer ({op.nvl.num_nvl_bytes} bytes) holds {recv_cap} rows, less than one "
            f"round of {R} rows (a token from each rank); create the Buffer with num_nvl_bytes >= {need} (nothing "
            f"was moved; the Buffer stays usable)"
        )
    largest = _largest_token_count(op, plan, is_token_in_rank, num_channels, comm_stream)
    return lay_mod.rounds_for(stream_cap, recv_cap, R, largest).tokens_per_round, largest


def _largest_token_count(op, plan, is_token_in_rank, C: int, comm_stream) -> int:
    """The most tokens any rank has in this call: a notify in which every token of every rank goes to every rank,
    whose longest (rank -> node) stream is that count, published to every rank's host alike; then its data kernels,
    told to skip."""
    T, R, N = is_token_in_rank.size(0), op.num_ranks, op.N
    dev = is_token_in_rank.device
    with allocating_on(comm_stream):  # this notify's outputs, read by nobody, used on the comm stream only
        everywhere = torch.ones(T, R, dtype=torch.bool, device=dev)
        scratch = {
            name: torch.empty(shape, dtype=torch.int32, device=dev)
            for name, shape in (
                ("rdma_cpm", (N, C)),
                ("gbl_cpm", (R, C)),
                ("recv_rdma_cpm", (N, C)),
                ("recv_rdma_prefix", (N,)),
                ("recv_gbl_cpm", (R, C)),
                ("recv_gbl_prefix", (R,)),
                ("send_rdma_head", (T, N)),
            )
        }
    p = op.kernels["notify"].params
    _copy(p, plan.params)
    p.x = p.x_scales = p.topk_idx = p.topk_weights = p.num_tokens_per_expert = 0
    p.is_token_in_rank = everywhere.data_ptr()
    for name, t in scratch.items():
        setattr(p, name, t.data_ptr())
    token = op._next_token()
    p.host_token, p.num_tokens, p.num_out_rows, p.num_fwd_rows = token, T, 0, 0
    op._launch("notify", C, comm_stream)
    op._wait_counters(token)
    largest = op.counters[abi.EP_RT_IN_HOST_MAX_STREAM]
    op._skip_data(p, C, comm_stream)
    return largest


def dispatch(
    op,
    plan,
    *,
    call_args,
    expert_alignment: int,
    num_channels: int,
    whole,
    send_rdma_head,
    num_recv: int,
    num_rdma_recv: int,
    maxima: tuple[int, int],
    num_worst_tokens: int,
    per_expert,
    alloc_stream,
    comm_stream,
) -> DispatchResult:
    """A dispatch in rounds, after the whole call's notify (whose counts and prefix matrices are `whole`, with
    send_rdma_head, its maxima `maxima`) and its skipped data kernels. Outputs of num_worst_tokens rows when given
    (rows past num_recv carry no expert), else num_recv."""
    x, x_scales, topk_idx, topk_weights, is_token_in_rank, num_tokens_per_expert = call_args
    least, largest = _least_round(op, plan, is_token_in_rank, num_channels, comm_stream)
    caps = _caps(plan)
    T, hidden = x.shape
    S = x_scales.size(1) if x_scales is not None else 0
    K = topk_idx.size(1) if topk_idx is not None else 0
    num_rows = num_worst_tokens or num_recv
    num_fwd = num_worst_tokens or num_rdma_recv
    dev = x.device
    with allocating_on(alloc_stream):
        recv_x = torch.empty(num_rows, hidden, dtype=x.dtype, device=dev)
        recv_x_scales = torch.empty(num_rows, S, dtype=x_scales.dtype, device=dev) if S else None
        recv_topk_idx = torch.empty(num_rows, K, dtype=validate.topk_idx_t, device=dev) if K else None
        recv_topk_weights = torch.empty(num_rows, K, dtype=torch.float32, device=dev) if K else None
        recv_src_meta = torch.empty(num_rows, 8, dtype=torch.uint8, device=dev)
        send_nvl_head = torch.full((num_fwd, op.G), -1, dtype=torch.int32, device=dev)  # (rows past the real: -1)
    recv_rdma_prefix, recv_gbl_prefix = whole[3], whole[5]
    handles, rows, starts = [], [], []
    with torch.cuda.stream(comm_stream):
        before = torch.zeros(op.num_ranks, dtype=torch.int32, device=dev)  # rows of each source rank so far
        forwarded = torch.zeros(op.N, dtype=torch.int32, device=dev)  # rows forwarded of each source node so far
        sent = torch.zeros(op.N, op.G, dtype=torch.int32, device=dev)  # of those, the records for each rank of mine
        start, tokens = 0, round_tokens(largest, *maxima, caps, least, largest)
        while not starts or start < largest:  # (a call with no tokens anywhere: one empty round)
            r = _one_round(op, call_args, start, tokens, T, expert_alignment, num_channels, comm_stream)
            if isinstance(r, RoundDoesNotFit):  # nothing moved: the same range with fewer tokens
                if tokens <= least:
                    raise RuntimeError(f"rank {op.rank}: a round of {tokens} tokens does not fit (an ep_rt bug)")
                tokens = min(tokens - 1, round_tokens(tokens, r.max_stream, r.max_recv, caps, least, tokens))
                continue
            at, _ = round_rows(recv_gbl_prefix, before, r.handle.recv_gbl_rank_prefix_sum, r.recv_x.size(0))
            heads = r.handle.send_nvl_head
            fwd_at, nodes = round_rows(recv_rdma_prefix, forwarded, r.handle.recv_rdma_rank_prefix_sum, heads.size(0))
            send_nvl_head.index_copy_(0, fwd_at, shifted_nvl_heads(heads, nodes, sent))
            put_rows(recv_x, at, r.recv_x)
            recv_src_meta.index_copy_(0, at, r.handle.recv_src_meta)
            for out, got in ((recv_x_scales, r.recv_x_scales), (recv_topk_idx, r.recv_topk_idx)):
                if out is not None:
                    put_rows(out, at, got)
            if recv_topk_weights is not None:
                recv_topk_weights.index_copy_(0, at, r.recv_topk_weights)
            handles.append(r.handle)
            rows.append(at)
            starts.append(start)
            # The next round from this one's counts: global numbers only (the maxima, the range's width), so that
            # every rank picks the same range.
            facts = r.handle.facts
            start += tokens
            left = max(largest - start, 1)
            tokens = round_tokens(tokens, facts.max_stream, facts.max_dispatch_rows, caps, least, left)
        if recv_topk_idx is not None and num_rows > num_recv:  # num_worst_tokens: rows past the real count
            recv_topk_idx[num_recv:] = -1
    handle = InternodeHandle(is_token_in_rank, *whole[:6], recv_src_meta, send_rdma_head, send_nvl_head)
    with_facts(handle, HandleFacts.of(handle, op.serial))
    handle.rounds = InternodeRounds(tuple(starts), tuple(handles), tuple(rows))
    tensors = [
        x,
        x_scales,
        topk_idx,
        topk_weights,
        num_tokens_per_expert,
        recv_x,
        recv_x_scales,
        recv_topk_idx,
        recv_topk_weights,
        *handle,
        *handle.rounds.tensors(),
    ]
    return DispatchResult(recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, per_expert, handle, tensors)


def _one_round(op, call_args, start: int, tokens: int, T: int, expert_alignment: int, C: int, comm_stream):
    """The dispatch of this rank's tokens [start, start + tokens) (clipped to its T), or RoundDoesNotFit."""
    x, x_scales, topk_idx, topk_weights, is_token_in_rank, num_tokens_per_expert = call_args
    lo, hi = min(start, T), min(start + tokens, T)
    return op.dispatch(
        x[lo:hi],
        _rows_of(x_scales, lo, hi),
        _rows_of(topk_idx, lo, hi),
        _rows_of(topk_weights, lo, hi),
        is_token_in_rank[lo:hi],
        num_tokens_per_expert,
        expert_alignment,
        0,
        C,
        comm_stream,
        comm_stream,
        in_round=True,
    )


def _each_round(handle):
    """(first token, end token, the round's handle, its rows in the whole call's outputs) of each round."""
    rounds = handle.rounds
    T = handle.is_token_in_rank.size(0)
    ends = rounds.starts[1:] + (T,)
    for start, end, h, at in zip(rounds.starts, ends, rounds.handles, rounds.rows):
        yield min(start, T), min(max(end, start), T), h, at


def cached_dispatch(op, x, x_scales, handle, alloc_stream, comm_stream):
    """A cached dispatch from a handle of a call in rounds: the same rounds, each from its round's handle."""
    num_rows, hidden = handle.recv_src_meta.size(0), x.size(1)
    S = x_scales.size(1) if x_scales is not None else 0
    with allocating_on(alloc_stream):
        recv_x = torch.empty(num_rows, hidden, dtype=x.dtype, device=x.device)
        recv_x_scales = torch.empty(num_rows, S, dtype=x_scales.dtype, device=x.device) if S else None
    with torch.cuda.stream(comm_stream):
        for lo, hi, h, at in _each_round(handle):
            rx, rs, _ = op.cached_dispatch(x[lo:hi], _rows_of(x_scales, lo, hi), h, comm_stream, comm_stream)
            put_rows(recv_x, at, rx)
            if recv_x_scales is not None:
                put_rows(recv_x_scales, at, rs)
    tensors = [x, x_scales, recv_x, recv_x_scales, *handle, *handle.rounds.tensors()]
    return recv_x, recv_x_scales, tensors


def combine(op, x, handle, topk_weights, bias0, bias1, alloc_stream, comm_stream):
    """A combine from a handle of a call in rounds: round k reduces tokens [lo, hi) from its rows of x (gathered in
    the round's order) straight into those tokens' rows of the outputs."""
    T, hidden = handle.is_token_in_rank.size(0), x.size(1)
    K = topk_weights.size(1) if topk_weights is not None else 0
    with allocating_on(alloc_stream):
        combined_x = torch.empty(T, hidden, dtype=torch.bfloat16, device=x.device)
        combined_w = torch.empty(T, K, dtype=torch.float32, device=x.device) if K else None
    with torch.cuda.stream(comm_stream):
        for lo, hi, h, at in _each_round(handle):
            op.combine_into(
                x.index_select(0, at),
                h,
                topk_weights.index_select(0, at) if topk_weights is not None else None,
                _rows_of(bias0, lo, hi),
                _rows_of(bias1, lo, hi),
                comm_stream,
                comm_stream,
                (combined_x[lo:hi], _rows_of(combined_w, lo, hi)),
            )
    tensors = [x, topk_weights, bias0, bias1, combined_x, combined_w, *handle, *handle.rounds.tensors()]
    return combined_x, combined_w, tensors
