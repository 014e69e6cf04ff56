"""Tuned Config values by rank count: data rows, kept apart from code (DeepEP V1's static tables), and the default
rows for the shapes the tables lack.

The numbers are DeepEP V1's (deepseek-ai/DeepEP at 567632d, deep_ep/buffer.py, Buffer.get_dispatch_config and
Buffer.get_combine_config): intranode rows for 2, 4 and 8 ranks, internode rows for 16 to 160 ranks, i.e. 2 to 20
nodes of 8 GPUs. num_sms is not in the tables: it comes from Buffer.num_sms, as in DeepEP.

One node (1 to 8 ranks): DeepEP's row for 2, 4 and 8 ranks; 1, 3, 5, 6 and 7 ranks take the row of the next rank
count it has (1 -> 2, 3 -> 4, 5..7 -> 8). DeepEP's intranode kernels check no chunk size against the rank count
(only Config's own rules), so any of its rows is valid there.

Internode rows are looked up by node count (DeepEP's RDMA ranks, num_ranks / 8): its rings, and its combine's
checks on them, are per node (the node size: config.ranks_per_node, a Buffer's Topology for dispatch(config=None)).
So 2 nodes of 4 GPUs get DeepEP's 16-rank row. A node count DeepEP has no row for
takes the row of the nearest smaller node count it has (the largest, 20 nodes, beyond it), with the combine's
NVL receive size raised to satisfy DeepEP's internode combine checks for that node count (deep_ep.cpp,
internode.cu: a multiple of the node count, each node's share above the chunk sizes plus the forwarder warps).
ep_rt's kernels use num_sms only; the other sizes are kept so DeepEP code that builds or reads Configs behaves the
same.
"""

from __future__ import annotations

from typing import NamedTuple

NVL_PEERS = 8  # DeepEP's GPUs per node (NUM_MAX_NVL_PEERS): its tables assume it
COMBINE_FORWARDER_WARPS = 24  # DeepEP's internode combine forwarder warps (kNumCombineForwarderWarps)


class Row(NamedTuple):
    kind: str  # "dispatch" or "combine"
    num_ranks: int
    nvl_send: int  # num_max_nvl_chunked_send_tokens
    nvl_recv: int  # num_max_nvl_chunked_recv_tokens
    rdma_send: int  # num_max_rdma_chunked_send_tokens
    rdma_recv: int  # num_max_rdma_chunked_recv_tokens

    @property
    def num_nodes(self) -> int:
        return max(self.num_ranks // NVL_PEERS, 1)


ROWS = (
    # intranode (one node)
    Row("dispatch", 2, 24, 256, 6, 128),
    Row("dispatch", 4, 6, 256, 6, 128),
    Row("dispatch", 8, 6, 256, 6, 128),
    Row("combine", 2, 10, 256, 6, 128),
    Row("combine", 4, 9, 256, 6, 128),
    Row("combine", 8, 4, 256, 6, 128),
    # internode (num_ranks / 8 nodes)
    Row("dispatch", 16, 36, 288, 20, 128),
    Row("dispatch", 24, 32, 288, 8, 128),
    Row("dispatch", 32, 32, 288, 8, 128),
    Row("dispatch", 48, 32, 288, 8, 128),
    Row("dispatch", 64, 32, 288, 8, 128),
    Row("dispatch", 96, 20, 480, 12, 128),
    Row("dispatch", 128, 20, 560, 12, 128),
    Row("dispatch", 144, 32, 720, 12, 128),
    Row("dispatch", 160, 28, 720, 12, 128),
    Row("combine", 16, 4, 288, 12, 128),
    Row("combine", 24, 1, 288, 8, 128),
    Row("combine", 32, 1, 288, 8, 128),
    Row("combine", 48, 1, 288, 8, 128),
    Row("combine", 64, 1, 288, 8, 128),
    Row("combine", 96, 1, 480, 8, 128),
    Row("combine", 128, 1, 560, 8, 128),
    Row("combine", 144, 2, 720, 8, 128),
    Row("combine", 160, 2, 720, 8, 128),
)


def _check_kind(kind: str) -> None:
    if kind not in ("dispatch", "combine"):
        raise ValueError(f"kind must be 'dispatch' or 'combine', got {kind!r}")


def lookup(kind: str, num_ranks: int, num_nodes: int | None = None) -> Row:
    """The row for `kind` and `num_ranks` ranks on `num_nodes` nodes (module docstring: DeepEP's or the default).

    `num_nodes` None: DeepEP's reading, 8 GPUs per node (more than 8 ranks = num_ranks / 8 nodes; a count that is
    not whole nodes of 8 is a ValueError). With `num_nodes` (any GPUs per node, emulated nodes included) the row of
    that node count; one node holds at most 8 ranks."""
    _check_kind(kind)
    if not isinstance(num_ranks, int) or isinstance(num_ranks, bool) or num_ranks <= 0:
        raise ValueError(f"num_ranks must be a positive int, got {num_ranks!r}")
    if num_nodes is None:
        if num_ranks > NVL_PEERS and num_ranks % NVL_PEERS:
            raise ValueError(
                f"{num_ranks} ranks are not whole nodes of {NVL_PEERS} GPUs (DeepEP's tables assume 8 per "
                f"node); pass num_nodes, or config= explicitly"
            )
        num_nodes = max(num_ranks // NVL_PEERS, 1)
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes <= 0 or num_ranks % num_nodes:
        raise ValueError(f"num_nodes must be a positive int dividing num_ranks ({num_ranks}), got {num_nodes!r}")
    if num_nodes == 1:
        return intranode_row(kind, num_ranks)
    if num_ranks // num_nodes > NVL_PEERS:
        raise ValueError(
            f"{num_ranks} ranks on {num_nodes} nodes are {num_ranks // num_nodes} a node; a node holds at "
            f"most {NVL_PEERS}"
        )
    return internode_row(kind, num_nodes, num_ranks)


def intranode_row(kind: str, num_ranks: int) -> Row:
    """DeepEP's row for one node of `num_ranks` ranks, else that of the next rank count it has (module docstring),
    with num_ranks the caller's."""
    _check_kind(kind)
    if not 1 <= num_ranks <= NVL_PEERS:
        raise ValueError(f"one node holds 1..{NVL_PEERS} ranks, got {num_ranks}")
    rows = {r.num_ranks: r for r in ROWS if r.kind == kind and r.num_ranks <= NVL_PEERS}
    return rows[min(n for n in rows if n >= num_ranks)]._replace(num_ranks=num_ranks)


def internode_rows(kind: str) -> dict[int, Row]:
    """DeepEP's internode rows of `kind` by node count."""
    _check_kind(kind)
    return {r.num_nodes: r for r in ROWS if r.kind == kind and r.num_ranks > NVL_PEERS}


def internode_row(kind: str, num_nodes: int, num_ranks: int | None = None) -> Row:
    """DeepEP's row for `num_nodes` nodes, else the default (module docstring). The returned row's num_ranks is
    `num_ranks` when given (the caller's shape), else num_nodes * 8."""
    rows = internode_rows(kind)
    num_ranks = num_nodes * NVL_PEERS if num_ranks is None else num_ranks
    if num_nodes in rows:
        return rows[num_nodes]._replace(num_ranks=num_ranks)
    smaller = [n for n in rows if n < num_nodes]
    base = rows[max(smaller)] if smaller else rows[min(rows)]
    nvl_recv = base.nvl_recv
    if kind == "combine":
        nvl_recv = combine_nvl_recv(num_nodes, base.nvl_send, base.nvl_recv, base.rdma_send)
    return base._replace(num_ranks=num_ranks, nvl_recv=nvl_recv)


def _warps_per_forwarder(num_nodes: int) -> int:
    return max(COMBINE_FORWARDER_WARPS // num_nodes, 1)


def combine_nvl_recv(num_nodes: int, nvl_send: int, nvl_recv: int, rdma_send: int) -> int:
    """The smallest NVL receive size >= `nvl_recv` that DeepEP's internode combine accepts for `num_nodes`."""
    per_node = -(-nvl_recv // num_nodes)
    per_node = max(per_node, max(rdma_send, nvl_send + _warps_per_forwarder(num_nodes)) + 1)
    return per_node * num_nodes


def deepep_combine_problems(num_nodes: int, nvl_send: int, nvl_recv: int, rdma_send: int) -> list[str]:
    """DeepEP V1's host checks on an internode combine Config (deep_ep.cpp internode_combine and internode.cu's
    combine launcher), as messages; the node limit (at most 24: its forwarder warps) is not among them, ep_rt has
    none."""
    wpf = _warps_per_forwarder(num_nodes)
    out = []
    if nvl_recv % num_nodes:
        out.append(f"num_max_nvl_chunked_recv_tokens ({nvl_recv}) must be a multiple of the node count ({num_nodes})")
    share = nvl_recv // num_nodes
    if not share > max(rdma_send, nvl_send):
        out.append(
            f"num_max_nvl_chunked_recv_tokens / nodes ({share}) must exceed both send chunk sizes "
            f"({nvl_send}, {rdma_send})"
        )
    if share - wpf < nvl_send:
        out.append(
            f"num_max_nvl_chunked_recv_tokens / nodes - forwarder warps ({share} - {wpf}) must be >= "
            f"num_max_nvl_chunked_send_tokens ({nvl_send})"
        )
    if rdma_send < wpf:
        out.append(f"num_max_rdma_chunked_send_tokens ({rdma_send}) must be >= the forwarder warps per node ({wpf})")
    return out
