"""Network operations of ep_rt's internode high-throughput (HT) and low-latency (LL) calls, per call and per kernel,
for the kernel design of issue 21 (docs/INTERNODE_DESIGN.md, "Network operations per call"), and what their quiets
and fences cost on IBGDA. Pure Python (stdlib only), so the tables in the docs are generated and checked on the CPU.

The design counted here (R ranks, G per node, N = R / G nodes, C channels, T tokens per rank, K top-k, E experts):
  HT dispatch  notify: one put-with-signal of a slot to the rail peer on every other node (N - 1), which relays
               each of its node's ranks its part over NVLink; node peers and self by NVLink only.
               send: each (channel, other node) stream in min(count, EP_RT_IN_STREAM_CHUNKS = 8) put-with-signals
               (a bare signal when the range is empty), so forwarding overlaps the network.
               forward, receive: NVLink and local copies only.
  cached dispatch / combine: a handshake (one signal to the rail peer on every other node, then NVLink flags inside
               the node) instead of notify; combine's forward sends each (channel, other node) stream of partial
               sums in the same chunks; publish and reduce are local.
  LL dispatch  send: one put-with-signal per (token, top-k choice) whose expert is on another node, and one signal
               per (expert, other-node rank) announcing its count; receive: one credit signal per other-node rank.
  LL combine   send: one put-with-signal per row going back to another node, one count signal per (local expert,
               other-node rank); receive: one credit signal per other-node rank.
  Flavours: both use nvshmemx_putmem_signal_nbi (the cu12 one, built by NVRTC, links it through the LP64 stdint
  shim of tools/cubin_toolchains.py), so no quiet and no fence anywhere; the columns stay per flavour because until
  that shim cu12 made every put-with-signal a put, a quiet and a signal.
LL message counts are expectations under uniform routing (a top-k choice lands on another node with probability
(R - G) / R); HT counts are exact for streams of at least 8 records (the most chunks: every range that long).

Cost: on IBGDA a quiet (and a fence, when more than one QP exists) sweeps every RC queue pair to every other PE plus
the DCIs (NVSHMEM 3.4.5 ibgda_device.cuh, nvshmemi_ibgda_quiet / nvshmemi_ibgda_fence): num_qps x (npes - 1) + DCIs.
The cost per queue pair polled is an ESTIMATE, never measured: the review behind issue 21 put a thread-scope sweep of
~360 queue pairs at 0.2-0.35 ms, i.e. 0.56-0.97 us per queue pair (docs/INTERNODE_DESIGN.md, "Performance model").
A kernel whose issuing threads quiet concurrently pays at least one sweep on its critical path, at most all of them
(fully serialised); both bounds are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

FLAVOURS = ("cu13", "cu12")
# The issue-21 review's estimate (unmeasured): 0.2-0.35 ms per thread-scope sweep of ~360 queue pairs.
SWEEP_ESTIMATE_MS, SWEEP_ESTIMATE_QPS = (0.2, 0.35), 360
QP_POLL_US = tuple(ms * 1e3 / SWEEP_ESTIMATE_QPS for ms in SWEEP_ESTIMATE_MS)
DCIS = 1  # NVSHMEM_IBGDA_NUM_DCI's default: the DCIs a quiet sweeps besides the RCs
DEFAULT_QPS = 24  # Buffer(num_qps_per_rank=24): ep_rt's and DeepEP V1's default
CONFIG_CHANNELS = 10  # DeepEP's HT rule num_qps_per_rank == Config.num_sms / 2 with the default num_sms (20)
STREAM_CHUNKS = 8  # params.h EP_RT_IN_STREAM_CHUNKS: put-with-signals per (channel, node) stream, at most


# ---- queue pairs ------------------------------------------------------------------------------------------------


def rc_queue_pairs(num_qps: int, npes: int, nics: int = 1) -> int:
    """RC queue pairs one GPU holds on IBGDA in a world of `npes` PEs: num_qps per other PE and NIC (ibgda.cpp creates
    no loopback RC to itself)."""
    if num_qps < 1 or npes < 1 or nics < 1:
        raise ValueError("num_qps, npes and nics must be positive")
    return num_qps * (npes - 1) * nics


def world_pes(kind: str, ranks: int, ranks_per_node: int) -> int:
    """PEs of the NVSHMEM world a Buffer joins (transport.nvshmem_world): "ht" = internode high-throughput only, one
    rail of N PEs; "ll" = low_latency_mode (serves HT too), all R ranks."""
    if kind == "ht":
        return ranks // ranks_per_node
    if kind == "ll":
        return ranks
    raise ValueError(f"unknown Buffer kind {kind!r} (ht or ll)")


def sweep_qps(num_qps: int, npes: int, nics: int = 1) -> int:
    """Queue pairs one nvshmem_quiet (or fence) polls on IBGDA."""
    return rc_queue_pairs(num_qps, npes, nics) + DCIS if npes > 1 else 0


def sweep_us(num_qps: int, npes: int) -> tuple[float, float]:
    """(low, high) estimate of one thread-scope sweep, in microseconds."""
    q = sweep_qps(num_qps, npes)
    return q * QP_POLL_US[0], q * QP_POLL_US[1]


def qp_table_markdown(eps=(16, 64, 256), ranks_per_node: int = 8, qps=(CONFIG_CHANNELS, DEFAULT_QPS)) -> str:
    """The README's table: RC queue pairs per GPU (one NIC) for each kind of Buffer, with the sweep size."""
    head = (
        [f"EP (nodes x {ranks_per_node})"]
        + [f"HT-only Buffer, rail world (N PEs), {q} QPs" for q in qps]
        + [f"low_latency_mode Buffer, all R PEs, {q} QPs" for q in qps]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ep in eps:
        cells = [f"EP{ep} ({ep // ranks_per_node} x {ranks_per_node})"]
        for kind in ("ht", "ll"):
            for q in qps:
                cells.append(str(rc_queue_pairs(q, world_pes(kind, ep, ranks_per_node))))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- operation counts -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    ranks: int
    ranks_per_node: int = 8
    channels: int = 20  # ep_rt's channels = Config.num_sms (Buffer.num_sms, default 20)
    tokens: int = 4096
    topk: int = 8
    experts: int = 256
    ll_tokens: int = 128  # tokens per rank of an LL call (DeepEP's decoding shape)

    def __post_init__(self):
        R, G = self.ranks, self.ranks_per_node
        if G < 1 or R < 2 * G or R % G:
            raise ValueError(f"need at least 2 nodes of {G} ranks, got {R} ranks")
        if min(self.channels, self.tokens, self.topk, self.experts) < 1 or self.experts % R:
            raise ValueError(
                f"channels, tokens, topk, experts must be positive and experts ({self.experts}) a "
                f"multiple of the ranks ({R})"
            )

    @property
    def nodes(self) -> int:
        return self.ranks // self.ranks_per_node

    @property
    def other_node_ranks(self) -> int:
        return self.ranks - self.ranks_per_node


@dataclass(frozen=True)
class KernelOps:
    call: str
    kernel: str
    put_signals: float  # puts that carry a signal (data before its own signal)
    bare_signals: float  # signal operations without data
    world: str  # "rail" or "full": which world's queue pairs a sweep of this kernel polls (see sweeps)
    issuers: str  # who issues them (what a cu12 quiet would serialise)

    @property
    def puts(self) -> float:
        return self.put_signals

    @property
    def signals(self) -> float:
        return self.put_signals + self.bare_signals

    def quiets(self, flavour: str) -> float:
        """None in either flavour: both link NVSHMEM's put-with-signal (cu12 through the LP64 stdint shim of
        tools/cubin_toolchains.py; before it, cu12 made each one a put, a quiet and a signal)."""
        _check_flavour(flavour)
        return 0

    def fences(self, flavour: str) -> float:
        _check_flavour(flavour)
        return 0


def _check_flavour(flavour: str) -> None:
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")


def ht_ops(s: Shape, world: str = "rail", chunks_per_stream: int = STREAM_CHUNKS) -> list[KernelOps]:
    """Per-kernel network operations of one call of each HT kind, on one rank. `world`: "rail" for an HT-only Buffer,
    "full" for a low_latency_mode Buffer that serves HT calls too (same operations, bigger sweeps).
    `chunks_per_stream`: put-with-signals per (channel, other node) stream (the kernels: up to STREAM_CHUNKS, fewer
    for shorter streams; sub-chunks let forwarding overlap the network, see internode_model.pipeline)."""
    rails, streams = s.nodes - 1, s.channels * (s.nodes - 1) * chunks_per_stream
    k = lambda call, kernel, ps, bs, who: KernelOps(call, kernel, ps, bs, world, who)  # noqa: E731
    return [
        k("dispatch", "notify", rails, 0, "one slot per other node's rail peer"),
        k("dispatch", "send", streams, 0, "chunks of each (channel, other node) stream"),
        k("dispatch", "forward", 0, 0, "NVLink pushes"),
        k("dispatch", "receive", 0, 0, "local copies"),
        k("cached dispatch", "handshake", 0, rails, "one per other node's rail peer"),
        k("cached dispatch", "send", streams, 0, "chunks of each (channel, other node) stream"),
        k("cached dispatch", "forward", 0, 0, "NVLink pushes"),
        k("cached dispatch", "receive", 0, 0, "local copies"),
        k("combine", "handshake", 0, rails, "one per other node's rail peer"),
        k("combine", "publish", 0, 0, "local copies"),
        k("combine", "forward", streams, 0, "chunks of each (channel, other node) stream"),
        k("combine", "reduce", 0, 0, "local reads"),
    ]


def ll_messages(s: Shape) -> float:
    """Expected messages a rank sends to other nodes per LL dispatch (and rows it returns per LL combine)."""
    return s.tokens * s.topk * s.other_node_ranks / s.ranks


def ll_ops(s: Shape) -> list[KernelOps]:
    """Per-kernel network operations of one LL dispatch and one LL combine on one rank (expected message counts)."""
    m, remote = ll_messages(s), s.other_node_ranks
    counts = s.experts // s.ranks * remote  # remote experts (dispatch) = local experts x remote ranks (combine)
    return [
        KernelOps("LL dispatch", "send", m, counts, "full", "one per message, one count per remote expert"),
        KernelOps("LL dispatch", "receive", 0, remote, "full", "one credit per other-node rank"),
        KernelOps("LL combine", "send", m, counts, "full", "one per row, one count per (local expert, remote rank)"),
        KernelOps("LL combine", "receive", 0, remote, "full", "one credit per other-node rank"),
    ]


def calls(ops: list[KernelOps]) -> list[str]:
    out = []
    for o in ops:
        if o.call not in out:
            out.append(o.call)
    return out


def sweep_cost_us(ops: list[KernelOps], s: Shape, flavour: str, num_qps: int = DEFAULT_QPS) -> tuple[float, float]:
    """(low, high) critical-path quiet time of these kernels: low = one sweep per kernel that quiets at all (its
    issuers quiet concurrently), high = every quiet in sequence; each sweep at its world's size."""
    low = high = 0.0
    for o in ops:
        q = o.quiets(flavour) + o.fences(flavour)
        if not q:
            continue
        npes = s.ranks if o.world == "full" else s.nodes
        lo, hi = sweep_us(num_qps, npes)
        low += lo
        high += q * hi
    return low, high


# ---- the tables of docs/INTERNODE_DESIGN.md --------------------------------------------------------------------


def _n(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.1f}"


def _us(lo: float, hi: float) -> str:
    if hi == 0:
        return "0"
    fmt = lambda v: f"{v / 1e3:.2f} ms" if v >= 1e3 else f"{v:.0f} us"  # noqa: E731
    return f"{fmt(lo)} - {fmt(hi)}"


def ops_table_markdown(s: Shape, num_qps: int = DEFAULT_QPS) -> str:
    """Per call and per kernel at shape `s`: puts, signals, and quiets / fences of both flavours, with the cu12
    flavour's critical-path sweep time (estimate) in the rail world (HT-only Buffer) and the full world (LL)."""
    R, G, N = s.ranks, s.ranks_per_node, s.nodes
    rail_q, full_q = sweep_qps(num_qps, N), sweep_qps(num_qps, R)
    lines = [
        f"EP{R} ({N} nodes x {G}), C = {s.channels} channels, T = {s.tokens} (LL: {s.ll_tokens}), "
        f"K = {s.topk}, E = {s.experts}, {num_qps} QPs per peer: a sweep polls {rail_q} queue pairs in the "
        f"rail world of an HT-only Buffer, {full_q} in the world of all ranks.",
        "",
        "| call | kernel | puts | signals | quiets cu13 | fences cu13 | quiets cu12 | fences cu12 | "
        "cu12 sweep time on the critical path (estimate) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ll_shape = Shape(R, G, s.channels, s.ll_tokens, s.topk, s.experts, s.ll_tokens)
    groups = [(ht_ops(s, "rail"), s), (ll_ops(ll_shape), ll_shape)]
    for ops, shape in groups:
        for call in calls(ops):
            mine = [o for o in ops if o.call == call]
            for o in mine:
                lines.append(
                    f"| {call} | {o.kernel} | {_n(o.puts)} | {_n(o.signals)} | {_n(o.quiets('cu13'))} | "
                    f"{_n(o.fences('cu13'))} | {_n(o.quiets('cu12'))} | {_n(o.fences('cu12'))} | "
                    f"{_us(*sweep_cost_us([o], shape, 'cu12', num_qps))} |"
                )
            tot = lambda f: _n(sum(f(o) for o in mine))  # noqa: E731
            lines.append(
                f"| **{call}** | **per call** | **{tot(lambda o: o.puts)}** | **{tot(lambda o: o.signals)}**"
                f" | **{tot(lambda o: o.quiets('cu13'))}** | **{tot(lambda o: o.fences('cu13'))}** | "
                f"**{tot(lambda o: o.quiets('cu12'))}** | **{tot(lambda o: o.fences('cu12'))}** | "
                f"**{_us(*sweep_cost_us(mine, shape, 'cu12', num_qps))}** |"
            )
    full = sweep_cost_us([o for o in ht_ops(s, "full") if o.call == "dispatch"], s, "cu12", num_qps)
    lines += [
        "",
        f"An HT call of a low_latency_mode Buffer (world of all ranks) has the same operations; its cu12 "
        f"dispatch sweeps cost {_us(*full)}. LL counts are expectations under uniform routing.",
    ]
    return "\n".join(lines)


def per_call_markdown(eps=(16, 64), num_qps: int = DEFAULT_QPS, ranks_per_node: int = 8) -> str:
    """The README's summary: one row per (EP, call) with its network operations and both flavours' quiets and
    fences (the per-kernel split is in docs/INTERNODE_DESIGN.md)."""
    lines = [
        "| EP | call | puts (with signal) | signals | quiets + fences, cu13 | quiets + fences, cu12 |",
        "|---|---|---|---|---|---|",
    ]
    for ep in eps:
        s = Shape(ep, ranks_per_node)
        ll_shape = Shape(ep, ranks_per_node, s.channels, s.ll_tokens, s.topk, s.experts, s.ll_tokens)
        ops = ht_ops(s, "rail") + ll_ops(ll_shape)
        for call in calls(ops):
            mine = [o for o in ops if o.call == call]
            tot = lambda f: _n(sum(f(o) for o in mine))  # noqa: E731
            lines.append(
                f"| EP{ep} | {call} | {tot(lambda o: o.puts)} | {tot(lambda o: o.signals)} | "
                f"{tot(lambda o: o.quiets('cu13') + o.fences('cu13'))} | "
                f"{tot(lambda o: o.quiets('cu12') + o.fences('cu12'))} |"
            )
    return "\n".join(lines)


def design_tables_markdown(eps=(16, 64), num_qps: int = DEFAULT_QPS) -> str:
    """What docs/INTERNODE_DESIGN.md carries between its generated-table markers."""
    return "\n\n".join(ops_table_markdown(Shape(ep), num_qps) for ep in eps)
