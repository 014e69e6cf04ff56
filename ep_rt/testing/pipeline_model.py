"""The stages of an internode high-throughput call in the issue-21 design and their overlap (docs/INTERNODE_DESIGN.md,
"Performance model"). Pure Python (no torch).

Dispatch = pack (records into staging) -> NIC -> forward (the rail forwarder pushes each record over NVLink into
the NVL buffers of its node's ranks) -> copy (each rank from its NVL buffer to its outputs). Combine = publish (rows
into the own NVL buffer) -> forward (read the node's rows over NVLink, sum, write the bf16 partials) -> NIC ->
reduce. Records of the own node skip pack and NIC (they start at once). With the stages running concurrently on
`chunks` chunks per (channel, other node) stream, each with its own signal, a call takes about the slowest stage
plus the fill and drain of the others (tandem_us simulates it); with one chunk per stream, a NIC that shares its
bandwidth fairly between the channels' queue pairs completes every channel near the end, so forwarding waits for
almost all of the network time. The kernels one after another take the sum (serial_us).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import network_ops
from .internode_model import Cluster, RoutingStats, bytes_per_token, routing_stats

# Per-SM copy rates: DeepEP V2's SM rule (V2:deep_ep/buffers/elastic.py: ~200 GB/s of reads, ~50 GB/s of writes per
# SM). Latencies are estimates (unmeasured): one GPU-initiated network message, one NVLink flag.
SM_READ_GBPS, SM_WRITE_GBPS = 200.0, 50.0
NET_LATENCY_US, NVL_LATENCY_US = 3.0, 1.0
DISPATCH_STATIONS = ("pack", "nic", "nvlink", "copy")
COMBINE_STATIONS = ("publish", "nvlink", "nic", "reduce")


def tandem_us(jobs: list[dict], stations) -> float:
    """Makespan of `jobs` through single-server `stations` visited in that order; a job is {station: busy time} and
    skips the stations it does not name; each station serves jobs in the order they reach it (work-conserving)."""
    ready = [0.0] * len(jobs)
    for st in stations:
        free = 0.0
        for t, i in sorted((ready[i], i) for i, job in enumerate(jobs) if st in job):
            free = ready[i] = max(t, free) + jobs[i][st]
    return max(ready, default=0.0)


@dataclass(frozen=True)
class Pipeline:
    """One HT call on one GPU as stages (total busy time of each, us). Data of the own node (a share `local` of the
    NVLink and copy work) never crosses the NIC, so it flows from the start; the rest waits for the network."""

    kind: str
    stations: tuple
    busy: dict  # station -> total busy time (us)
    remote_only: tuple  # stations only the remote share visits
    local: float  # own-node share of the other stations' work (p / n)
    latency_us: float  # notify or handshake, and the first signal: outside the pipeline
    rdma_metric_bytes: float

    def jobs(self, chunks: int) -> list[dict]:
        remote = {st: t * (1 if st in self.remote_only else 1 - self.local) / chunks for st, t in self.busy.items()}
        local = {st: t * self.local / chunks for st, t in self.busy.items() if st not in self.remote_only}
        return [dict(remote) for _ in range(chunks)] + [dict(local) for _ in range(chunks) if self.local > 0]

    def overlapped_us(self, chunks: int) -> float:
        """Stages running concurrently on `chunks` chunks per stream (each with its own signal): the slowest stage
        plus the fill and drain of the others (not their sum), plus the latency."""
        if chunks < 1:
            raise ValueError("chunks must be >= 1")
        return self.latency_us + tandem_us(self.jobs(chunks), self.stations)

    def serial_us(self) -> float:
        """The kernels one after another (what ep_rt ran before issue 21): the sum of the stages."""
        return self.latency_us + sum(self.busy.values())

    @property
    def slowest(self) -> str:
        return max(self.busy, key=self.busy.get)

    def rdma_gbps(self, us: float) -> float:
        return self.rdma_metric_bytes / us / 1e3


def pipeline(
    kind: str,
    cluster: Cluster,
    num_nodes: int,
    ranks_per_node: int = 8,
    num_tokens: int = 4096,
    hidden: int = 7168,
    num_topk: int = 8,
    num_experts: int = 256,
    channels: int = 20,
    stats: RoutingStats | None = None,
    record_overhead_bytes: float = 80.0,
) -> Pipeline:
    """The stages of one HT call of `kind` (dispatch_fp8, dispatch_bf16, combine_bf16) with the issue-21 design:
    dispatch = pack (records into staging) -> NIC -> forward (NVLink pushes into the node's NVL buffers) -> copy
    (each rank from its NVL buffer to its outputs); combine = publish (rows into the own NVL buffer) -> forward
    (read the node's rows over NVLink, sum, write partials) -> NIC -> reduce. SM-bound stages use `channels` blocks
    at SM_READ_GBPS / SM_WRITE_GBPS each."""
    st = stats or routing_stats(num_nodes, ranks_per_node, num_experts, num_topk)
    T, G = num_tokens, ranks_per_node
    r, n, p = st.ranks_per_token, st.nodes_per_token, st.own_node
    B = bytes_per_token(kind, hidden, num_topk)
    wire = B + record_overhead_bytes
    sm_w, sm_r = channels * SM_WRITE_GBPS * 1e3, channels * SM_READ_GBPS * 1e3  # bytes per us
    nic = T * (n - p) * wire / (cluster.nic_gbps * 1e3)
    over_nvl = T * r * (1 - 1 / G) * wire / (cluster.nvl_gbps * 1e3)
    if kind.startswith("dispatch"):
        busy = {
            "pack": T * (n - p) * wire / sm_w,
            "nic": nic,
            "nvlink": max(over_nvl, T * r * wire / sm_w),
            "copy": T * r * B / sm_w,
        }
        return Pipeline(
            kind, DISPATCH_STATIONS, busy, ("pack", "nic"), p / n, 2 * NET_LATENCY_US + NVL_LATENCY_US, T * n * B
        )
    busy = {
        "publish": T * r * B / sm_w,
        "nvlink": max(over_nvl, T * n * B / sm_w),
        "nic": nic,
        "reduce": max(T * n * B / sm_r, T * B / sm_w),
    }
    return Pipeline(kind, COMBINE_STATIONS, busy, ("nic",), p / n, 2 * NET_LATENCY_US, T * n * B)


def cu12_sweeps_us(
    kind: str, num_nodes: int, ranks_per_node: int = 8, chunks: int = 1, world: str = "rail", num_qps: int = 24
) -> float:
    """The cu12 flavour's quiet sweeps on the call's critical path (network_ops' lower bound: issuers quiet
    concurrently, one sweep per put-with-signal in sequence on each issuer: 1 for notify, `chunks` for send and
    combine forward). An estimate, like the sweep cost itself."""
    R = num_nodes * ranks_per_node
    if not any(o.quiets("cu12") for o in network_ops.ht_ops(network_ops.Shape(R, ranks_per_node))):
        return 0.0  # the cu12 flavour links put-with-signal now: it quiets no more than cu13 (never)
    lo, _ = network_ops.sweep_us(num_qps, R if world == "full" else num_nodes)
    return lo * ((1 + chunks) if kind.startswith("dispatch") else chunks)
