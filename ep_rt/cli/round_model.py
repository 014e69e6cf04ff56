"""How many rounds a high-throughput call takes in a buffer of given sizes (issue 22 item 4's cost, ahead of a
measurement; README "Buffer sizes against DeepEP's"). The counts of DeepEP V1's test routing
(internode_model.routing_stats: top-k of E experts, E = 256 rounded down to a multiple of the ranks, as DeepEP's
tests pick it, top-min(N, 4) node groups) are set against the row and stream capacities the ops compute for a BF16
call, whose combine is the larger of the two. A count is taken as its mean plus SIGMAS binomial standard
deviations, the spread a largest rank or stream may reach; the rounds are then what the ops would choose (across
nodes rounds sized from the counts, a try that does not fit counted as a round; on one node the least rounds).
A model of the routing, not a measurement: skewed routing takes more rounds (at most what rounds_for gives for the
worst case)."""

from __future__ import annotations

import math

from ..ops.internode_rounds import round_tokens
from ..runtime import abi
from ..testing.internode_model import routing_stats
from ..transport import internode_layout, nvl_layout

SIGMAS = 4


def _high(trials: int, p: float) -> float:
    """A binomial count's mean plus SIGMAS standard deviations (at most every trial)."""
    return min(trials * p + SIGMAS * math.sqrt(trials * p * (1 - p)), trials)


def rounds(
    num_nvl_bytes: int,
    num_rdma_bytes: int,
    num_ranks: int,
    ranks_per_node: int,
    hidden: int,
    num_tokens: int,
    num_topk: int = 8,
    num_experts: int = 256,
    samples: int = 4096,
) -> int:
    """Rounds of a BF16 dispatch (and its combine) of num_tokens tokens per rank with DeepEP's test routing."""
    R, G, T, K = num_ranks, ranks_per_node, num_tokens, num_topk
    N = R // G
    E = max(num_experts // R, 1) * R
    stats = routing_stats(N, G, E, K, num_tokens=samples)
    recv = _high(R * T, stats.ranks_per_token / R)  # rows a rank receives: each of R * T tokens reaches it at rate r/R
    if N == 1:
        dispatch = nvl_layout.DispatchRows(2 * hidden, 0, K).fill(abi.DispatchRegion(), num_nvl_bytes)
        combine = nvl_layout.CombineRows(hidden, K).fill(abi.CombineRegion(), num_nvl_bytes)
        if recv <= min(dispatch, combine):
            return 1
        plan = nvl_layout.rounds_for(dispatch, combine, R, T)
    else:
        stream = _high(T, stats.nodes_per_token / N)  # a (rank -> node) stream: a token reaches a node at rate n/N
        records = num_nvl_bytes - internode_layout.nvl_control_offsets(R, N)["records"]
        sizes = (
            internode_layout.dispatch_record_bytes(2 * hidden, 0, K),
            internode_layout.combine_record_bytes(hidden, K),
        )
        stream_cap = min(internode_layout.capacity(num_rdma_bytes, N, b) for b in sizes)
        recv_cap = min(records // b for b in sizes)
        if stream <= stream_cap and recv <= recv_cap:
            return 1
        least = internode_layout.rounds_for(stream_cap, recv_cap, R, T)
        if least is None:
            raise ValueError(f"{num_nvl_bytes} NVL / {num_rdma_bytes} RDMA bytes hold less than one round of {R} ranks")
        return _internode_rounds(T, stats, R, N, (stream_cap, recv_cap), least.tokens_per_round)
    if plan is None:
        raise ValueError(f"{num_nvl_bytes} NVL / {num_rdma_bytes} RDMA bytes hold less than one round of {R} ranks")
    return plan.num_rounds


def _internode_rounds(T: int, stats, R: int, N: int, caps, least: int) -> int:
    """The rounds ops/internode_rounds.py takes when every round's counts are those of the model (a round of t
    tokens: streams of _high(t, n/N), _high(R t, r/R) rows a rank), tries that do not fit counted as rounds."""

    def counts(t):  # (never more than every token: a stream of t, R t rows)
        return min(_high(t, stats.nodes_per_token / N), t), min(_high(R * t, stats.ranks_per_token / R), R * t)

    start, tokens, n = 0, round_tokens(T, *counts(T), caps, least, T), 0
    while start < T:
        n += 1
        stream, recv = counts(tokens)
        if stream > caps[0] or recv > caps[1]:
            tokens = min(tokens - 1, round_tokens(tokens, stream, recv, caps, least, tokens))
            continue
        start += tokens
        tokens = round_tokens(tokens, stream, recv, caps, least, max(T - start, 1))
    return n
