"""Performance model of internode high-throughput dispatch / combine: the link bounds (docs/INTERNODE_DESIGN.md,
"Performance model"; pipeline_model adds the stages of the design and their overlap, network_ops the network
operations and their sweeps).

Pure Python (no torch): routing statistics from a seeded Monte Carlo of DeepEP V1's test routing, the byte
formulas, and the bound t = max(NIC time, NVLink time) + notify, with DeepEP's printed "RDMA" and "NVL"
bandwidth metrics, and the published numbers placed on the model. ``python -m ep_rt model`` prints them.

Model (per GPU, per direction; T tokens per rank, B bytes per token, G ranks per node):
  r = distinct destination ranks per token, n = distinct destination nodes per token, p = probability that the
  token's own node is one of them (all from ``routing_stats``);
  NIC bytes  D_nic = T * (n - p) * B          (one copy per remote node: the own node needs no NIC)
  NVL bytes  D_nvl = T * r * (1 - 1/G) * B    (the forwarder delivers 1/G of the copies to itself)
  kernel time = max(D_nic / BW_nic, D_nvl / BW_nvl); whole call = kernel time + notify.
  DeepEP's metrics divide by the kernel time: "RDMA" = T * n * B / t (it counts the own node too),
  "NVL" = T * r * B / t (V1:tests/test_internode.py prints both).
  B: FP8 dispatch H * (1 + 4/128) (DeepEP's accounting: data + one f32 scale per 128 channels), BF16 2H;
  combine moves BF16 rows (2H, + 4K with top-k weights) the same way back.
Bandwidths are in GB/s = 1e9 bytes/s, times in microseconds.
"""

from __future__ import annotations

import functools
import heapq
import random
from dataclasses import dataclass


# ----------------------------------------------------------------------------------------
# Routing statistics
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoutingStats:
    ranks_per_token: float  # r: mean distinct destination ranks of a token
    nodes_per_token: float  # n: mean distinct destination nodes of a token
    own_node: float  # p: probability that a token's own node is a destination

    @property
    def remote_nodes_per_token(self) -> float:
        return self.nodes_per_token - self.own_node


# The routing table of docs/INTERNODE_DESIGN.md "Performance model" (R = N x 8, E = 256, top-8, top-min(N, 4)
# groups; derived by this Monte Carlo with 8192 tokens), for use as inputs.
TABLE_5_1 = {
    2: RoutingStats(6.51, 1.991, 0.995),
    4: RoutingStats(7.27, 3.610, 0.903),
    8: RoutingStats(7.46, 3.983, 0.506),
    16: RoutingStats(7.63, 4.000, 0.250),
}


def routing_stats(
    num_nodes: int,
    ranks_per_node: int = 8,
    num_experts: int = 256,
    num_topk: int = 8,
    num_topk_groups: int | None = None,
    num_tokens: int = 8192,
    seed: int = 0,
) -> RoutingStats:
    """Monte Carlo of DeepEP V1's test routing (V1:tests/test_internode.py, num_topk_groups = min(N, 4)).

    Per token: every expert gets an iid score; experts form num_nodes groups of E/N consecutive experts (a
    group = the experts of one node); the num_topk_groups groups with the largest maximum score are kept and
    the token takes the num_topk experts of largest score among them. Expert e lives on rank e // (E/R) and
    node e // (E/N). DeepEP draws |randn| + 1; only the order of the scores matters, so uniform scores give the
    same routing distribution. Tokens are iid and the routing is symmetric in the nodes, so the chance that a
    token's own node is hit is exactly n / N; that value is used (it has no sampling noise of its own).
    """
    return _routing_stats(num_nodes, ranks_per_node, num_experts, num_topk, num_topk_groups, num_tokens, seed)


@functools.lru_cache(maxsize=None)
def _routing_stats(num_nodes, ranks_per_node, num_experts, num_topk, num_topk_groups, num_tokens, seed):
    R = num_nodes * ranks_per_node
    if num_nodes < 1 or ranks_per_node < 1 or num_experts % R != 0:
        raise ValueError(f"need num_experts ({num_experts}) divisible by num_ranks ({R})")
    groups = min(num_nodes, 4) if num_topk_groups is None else num_topk_groups
    per_node, per_rank = num_experts // num_nodes, num_experts // R
    if not 1 <= groups <= num_nodes or num_topk > groups * per_node:
        raise ValueError(f"cannot pick {num_topk} experts from {groups} of {num_nodes} groups of {per_node}")
    rng = random.Random(seed)
    ranks_total = nodes_total = 0
    for _ in range(num_tokens):
        scores = [rng.random() for _ in range(num_experts)]
        group_max = [max(scores[g * per_node : (g + 1) * per_node]) for g in range(num_nodes)]
        kept = heapq.nlargest(groups, range(num_nodes), key=group_max.__getitem__)
        candidates = [e for g in kept for e in range(g * per_node, (g + 1) * per_node)]
        experts = heapq.nlargest(num_topk, candidates, key=scores.__getitem__)
        ranks_total += len({e // per_rank for e in experts})
        nodes_total += len({e // per_node for e in experts})
    n = nodes_total / num_tokens
    return RoutingStats(ranks_total / num_tokens, n, n / num_nodes)


# ----------------------------------------------------------------------------------------
# Prediction: the link bounds
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cluster:
    name: str
    nic_gbps: float  # achievable NIC bandwidth per GPU and direction
    nvl_gbps: float  # NVLink bandwidth per GPU and direction


H800 = Cluster("H800 + CX7 400G", nic_gbps=46.0, nvl_gbps=160.0)
H200 = Cluster("H200 + CX7 400G", nic_gbps=46.0, nvl_gbps=370.0)
CLUSTERS = {"H800": H800, "H200": H200}


@dataclass(frozen=True)
class Prediction:
    kind: str  # "dispatch_fp8", "dispatch_bf16", "combine_bf16"
    bytes_per_token: float
    nic_bytes: float  # D_nic
    nvl_bytes: float  # D_nvl
    nic_us: float
    nvl_us: float
    notify_us: float
    rdma_metric_bytes: float  # T * n * B: what DeepEP's "RDMA" figure divides by the time
    nvl_metric_bytes: float  # T * r * B: what its "NVL" figure divides

    @property
    def kernel_us(self) -> float:
        return max(self.nic_us, self.nvl_us)

    @property
    def total_us(self) -> float:
        return self.kernel_us + self.notify_us

    @property
    def bound(self) -> str:
        return "NIC" if self.nic_us >= self.nvl_us else "NVLink"

    @property
    def rdma_gbps(self) -> float:
        """DeepEP's printed "RDMA" GB/s at the predicted kernel time."""
        return self.rdma_metric_bytes / self.kernel_us / 1e3

    @property
    def nvl_gbps(self) -> float:
        """DeepEP's printed "NVL" GB/s at the predicted kernel time."""
        return self.nvl_metric_bytes / self.kernel_us / 1e3


def bytes_per_token(kind: str, hidden: int, num_topk: int = 8, with_weights: bool = False) -> float:
    """B of one token: FP8 dispatch H * (1 + 4/128), BF16 dispatch 2H, BF16 combine 2H (+ 4K with weights)."""
    if kind == "dispatch_fp8":
        return hidden * (1 + 4 / 128)
    if kind == "dispatch_bf16":
        return 2.0 * hidden
    if kind == "combine_bf16":
        return 2.0 * hidden + (4.0 * num_topk if with_weights else 0.0)
    raise ValueError(f"unknown kind {kind!r}")


KINDS = ("dispatch_fp8", "dispatch_bf16", "combine_bf16")


def predict(
    nic_gbps: float,
    nvl_gbps: float,
    num_nodes: int,
    ranks_per_node: int = 8,
    num_tokens: int = 4096,
    hidden: int = 7168,
    num_topk: int = 8,
    num_experts: int = 256,
    notify_us: float = 0.0,
    stats: RoutingStats | None = None,
    combine_with_weights: bool = False,
    record_overhead_bytes: float = 0.0,
) -> dict:
    """{kind: Prediction} for dispatch FP8, dispatch BF16 and combine BF16 on one GPU of the cluster.

    stats: routing statistics (default: ``routing_stats`` for this shape). record_overhead_bytes: extra wire
    bytes per token copy (ep_rt's records add ~80 B: row, scales, top-k, weights, source token, node mask); it enters the link times, not DeepEP's
    metrics, which count B only.
    """
    if nic_gbps <= 0 or nvl_gbps <= 0:
        raise ValueError("bandwidths must be positive")
    st = stats or routing_stats(num_nodes, ranks_per_node, num_experts, num_topk)
    G = ranks_per_node
    out = {}
    for kind in KINDS:
        B = bytes_per_token(kind, hidden, num_topk, combine_with_weights)
        wire = B + record_overhead_bytes
        nic_bytes = num_tokens * st.remote_nodes_per_token * wire
        nvl_bytes = num_tokens * st.ranks_per_token * (1 - 1 / G) * wire
        out[kind] = Prediction(
            kind,
            B,
            nic_bytes,
            nvl_bytes,
            nic_bytes / nic_gbps / 1e3,
            nvl_bytes / nvl_gbps / 1e3,
            notify_us,
            num_tokens * st.nodes_per_token * B,
            num_tokens * st.ranks_per_token * B,
        )
    return out


def rdma_metric_ceiling(nic_gbps: float, nvl_gbps: float, stats: RoutingStats, ranks_per_node: int = 8) -> float:
    """The largest "RDMA" GB/s the links allow: min(BW_nic * n / (n - p), BW_nvl * n / (r (1 - 1/G)))."""
    nic = nic_gbps * stats.nodes_per_token / stats.remote_nodes_per_token
    share = stats.ranks_per_token * (1 - 1 / ranks_per_node)
    return min(nic, nvl_gbps * stats.nodes_per_token / share) if share > 0 else nic


# ----------------------------------------------------------------------------------------
# Published numbers placed on the model (sources: V1 = deepseek-ai/DeepEP at 567632d, V1@ebfe47e = its first
# commit, V2 = DeepEP V2 README, DeepEP#N = its GitHub issue N, UCCL: = uccl-project/uccl)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Published:
    who: str
    cluster: Cluster
    num_nodes: int
    kind: str
    rdma_gbps: float  # DeepEP's "RDMA" metric as published
    source: str
    num_tokens: int = 4096
    ranks_per_node: int = 8


EFA_P5EN = Cluster("H200 + 2x 200G EFA (p5en)", nic_gbps=50.0, nvl_gbps=370.0)
PUBLISHED = (
    Published("DeepEP V1", H800, 2, "dispatch_fp8", 43, "V1:README.md"),
    Published("DeepEP V1", H800, 2, "combine_bf16", 43, "V1:README.md"),
    Published("DeepEP V1", H800, 4, "dispatch_fp8", 58, "V1:README.md"),
    Published("DeepEP V1", H800, 4, "combine_bf16", 57, "V1:README.md"),
    Published("DeepEP V1", H800, 8, "dispatch_fp8", 51, "V1:README.md"),
    Published("DeepEP V1", H800, 8, "combine_bf16", 50, "V1:README.md"),
    Published("DeepEP V1 Feb-2025 (IBRC)", H800, 2, "dispatch_fp8", 43, "V1@ebfe47e:README.md"),
    Published("DeepEP V1 Feb-2025 (IBRC)", H800, 4, "dispatch_fp8", 44, "V1@ebfe47e:README.md"),
    Published("DeepEP V1 Feb-2025 (IBRC)", H800, 8, "dispatch_fp8", 46, "V1@ebfe47e:README.md"),
    Published("DeepEP V1 Feb-2025 (IBRC)", H800, 2, "combine_bf16", 43, "V1@ebfe47e:README.md"),
    Published("DeepEP V1 Feb-2025 (IBRC)", H800, 4, "combine_bf16", 47, "V1@ebfe47e:README.md"),
    Published("DeepEP V1 Feb-2025 (IBRC)", H800, 8, "combine_bf16", 45, "V1@ebfe47e:README.md"),
    Published("DeepEP V1 (user)", H200, 2, "dispatch_fp8", 38.2, "DeepEP#493"),
    Published("DeepEP V1 (user)", H200, 2, "dispatch_bf16", 40.9, "DeepEP#493"),
    Published("DeepEP V1 (user)", H200, 2, "combine_bf16", 44.4, "DeepEP#493"),
    Published("DeepEP V1 (user)", H200, 4, "dispatch_fp8", 13.2, "DeepEP#493"),
    Published("DeepEP V1 (user)", H200, 4, "combine_bf16", 12.5, "DeepEP#493"),
    # V2's README names the GPU only as SM90 (with CX7) and reports "logical bandwidth" that counts local traffic, as
    # V1's RDMA metric does; placed on the H200 cluster (with H800's NVLink the model caps EP16 near 56 GB/s).
    Published("DeepEP V2 (8K tokens, top-8 without groups)", H200, 2, "dispatch_fp8", 90, "V2:README.md", 8192),
    Published("DeepEP V2 (8K tokens, top-8 without groups)", H200, 4, "dispatch_fp8", 61, "V2:README.md", 8192),
    Published("DeepEP V2 (8K tokens, top-8 without groups)", H200, 2, "combine_bf16", 81, "V2:README.md", 8192),
    Published("DeepEP V2 (8K tokens, top-8 without groups)", H200, 4, "combine_bf16", 61, "V2:README.md", 8192),
    Published("UCCL-EP", EFA_P5EN, 2, "dispatch_fp8", 50, "UCCL:ep/README.md"),
    Published("UCCL-EP", EFA_P5EN, 4, "dispatch_fp8", 54, "UCCL:ep/README.md"),
    Published("UCCL-EP", EFA_P5EN, 2, "combine_bf16", 18, "UCCL:ep/README.md"),
)


@dataclass(frozen=True)
class Placement:
    published: Published
    implied_us: float  # the kernel time the published metric implies: T * n * B / metric
    nic_gbps: float  # NIC bytes / that time
    nvl_gbps: float  # NVLink bytes (the forwarded share) / that time
    nic_fraction: float  # of the cluster's NIC bandwidth
    nvl_fraction: float  # of its NVLink bandwidth
    bound_us: float  # the model's kernel time on that cluster

    @property
    def reading(self) -> str:
        """Which link the number is closest to saturating, or neither (protocol-bound below 60 %)."""
        top = max(self.nic_fraction, self.nvl_fraction)
        if top < 0.6:
            return f"protocol-bound ({top:.0%} of the busiest link)"
        link = "NIC" if self.nic_fraction >= self.nvl_fraction else "NVLink"
        return f"{link}-bound ({top:.0%})"


def place(
    pub: Published, stats: RoutingStats | None = None, hidden: int = 7168, num_topk: int = 8, num_experts: int = 256
) -> Placement:
    """The time, link loads and reading a published "RDMA" figure implies under the model."""
    st = stats or routing_stats(pub.num_nodes, pub.ranks_per_node, num_experts, num_topk)
    p = predict(
        pub.cluster.nic_gbps,
        pub.cluster.nvl_gbps,
        pub.num_nodes,
        pub.ranks_per_node,
        pub.num_tokens,
        hidden,
        num_topk,
        num_experts,
        stats=st,
    )[pub.kind]
    t = p.rdma_metric_bytes / pub.rdma_gbps / 1e3
    nic, nvl = p.nic_bytes / t / 1e3, p.nvl_bytes / t / 1e3
    return Placement(pub, t, nic, nvl, nic / pub.cluster.nic_gbps, nvl / pub.cluster.nvl_gbps, p.kernel_us)
