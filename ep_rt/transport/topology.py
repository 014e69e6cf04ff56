"""Who is where: one Topology per Buffer, built once from one exchange over the process group.

A node is a set of ranks that reach each other over NVLink (CUDA IPC): by default the ranks of one host.
EP_RT_RANKS_PER_NODE=g overrides that: each block of g consecutive ranks of one host is treated as a node,
which is how inter-node code runs on emulated nodes (their traffic then takes the inter-node path). Ranks of a
node are contiguous and every node has the same size, as in DeepEP (a clear error otherwise).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from .. import env
from ..errors import RankMismatchError, TopologyError


@dataclass(frozen=True)
class Topology:
    rank: int
    num_ranks: int
    hosts: tuple  # host name of every rank
    bus_ids: tuple  # PCI bus id of every rank's GPU
    node_size: int  # ranks per node (G)
    emulated: bool  # nodes come from EP_RT_RANKS_PER_NODE, not from hosts

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def gather(cls, group, bus_id: str) -> "Topology":
        """Collective over `group`: every rank's host, GPU and EP_RT_RANKS_PER_NODE, then the node structure. The
        knob is compared before it is parsed, so ranks that set it differently all raise RankMismatchError (instead
        of some raising while the others wait in the Buffer's next collective)."""
        import os

        from . import collective

        me = (socket.gethostname(), bus_id, os.environ.get("EP_RT_RANKS_PER_NODE", "").strip())
        table = collective.all_gather_object(group, me)
        return cls.from_gathered(collective.rank(group), table)

    @classmethod
    def from_gathered(cls, rank: int, table: list) -> "Topology":
        """The Topology from every rank's (host, bus id, EP_RT_RANKS_PER_NODE as set); the same on every rank."""
        from .agreement import differences

        diffs = differences([{"EP_RT_RANKS_PER_NODE": t[2] or "(unset)"} for t in table])
        if diffs:
            raise RankMismatchError(
                f"EP_RT_RANKS_PER_NODE must be set alike on every rank (it decides the nodes, "
                f"hence every buffer's layout), but it is {diffs[0].split(': ', 1)[1]}"
            )
        return cls.from_table(rank, [t[0] for t in table], [t[1] for t in table], env.ranks_per_node())

    @classmethod
    def from_table(cls, rank: int, hosts: list, bus_ids: list, ranks_per_node: int | None = None) -> "Topology":
        R = len(hosts)
        if ranks_per_node is not None:
            g = ranks_per_node
            if g <= 0 or R % g:
                raise TopologyError(f"EP_RT_RANKS_PER_NODE={g} must divide the number of ranks ({R})")
            for n in range(R // g):
                block = set(hosts[n * g : (n + 1) * g])
                if len(block) > 1:
                    raise TopologyError(
                        f"EP_RT_RANKS_PER_NODE={g}: emulated node {n} (ranks {n * g}..{n * g + g - 1})"
                        f" spans hosts {sorted(block)}; an emulated node must lie on one host"
                    )
            return cls(rank, R, tuple(hosts), tuple(bus_ids), g, emulated=True)
        runs = []  # (host, first rank, count) of each contiguous run of one host
        for r, h in enumerate(hosts):
            if runs and runs[-1][0] == h:
                runs[-1][2] += 1
            else:
                runs.append([h, r, 1])
        names = [h for h, _, _ in runs]
        if len(set(names)) != len(names):
            raise TopologyError(
                "the ranks of a host must be contiguous (ranks 8n..8n+7 on one node, as DeepEP "
                f"requires); this group interleaves hosts: {_describe(runs)}"
            )
        sizes = {c for _, _, c in runs}
        if len(sizes) != 1:
            raise TopologyError(
                "every node must have the same number of ranks (ep_rt and DeepEP index peers by "
                f"local rank); this group has {_describe(runs)}"
            )
        return cls(rank, R, tuple(hosts), tuple(bus_ids), sizes.pop(), emulated=False)

    # ---- derived --------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.num_ranks // self.node_size

    @property
    def node(self) -> int:
        return self.rank // self.node_size

    @property
    def local_rank(self) -> int:
        return self.rank % self.node_size

    @property
    def local_ranks(self) -> range:
        """Global ranks of this rank's node."""
        return range(self.node * self.node_size, (self.node + 1) * self.node_size)

    def node_of(self, rank: int) -> int:
        return rank // self.node_size

    @property
    def single_host(self) -> bool:
        return len(set(self.hosts)) == 1

    def describe(self) -> str:
        kind = "emulated (EP_RT_RANKS_PER_NODE)" if self.emulated else "by host"
        return f"{self.num_ranks} ranks, {self.num_nodes} node(s) of {self.node_size} ({kind})"

    # ---- checks ---------------------------------------------------------------------------------
    def require_nvlink(self, group) -> None:
        """Collective: every pair of distinct GPUs within each node must be NVLink peers. Each rank checks its
        own node with NVML (it sees only its host's GPUs); every rank raises if any rank found a problem, so no
        rank is left waiting in a later collective."""
        from . import collective

        problems = [] if env.skip_topology_check() else nvlink_problems([self.bus_ids[r] for r in self.local_ranks])
        found = collective.all_gather_object(group, problems)
        union = sorted({p for ps in found for p in ps})
        if union:
            raise TopologyError(
                "the GPUs of one node are not connected by NVLink, which ep_rt's intranode kernels need: "
                + "; ".join(union)
                + ". Set EP_RT_SKIP_TOPOLOGY_CHECK=1 to try anyway (PCIe P2P, slow)."
            )


def _describe(runs) -> str:
    return ", ".join(f"{h}: ranks {first}..{first + n - 1}" for h, first, n in runs)


def nvlink_problems(bus_ids: list[str]) -> list[str]:
    """Pairs of distinct GPUs (by PCI bus id) that NVML does not report as NVLink-connected."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = {b: pynvml.nvmlDeviceGetHandleByPciBusId(b) for b in sorted(set(bus_ids))}
        problems = []
        ids = sorted(handles)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                status = pynvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if status != pynvml.NVML_P2P_STATUS_OK:
                    problems.append(f"{a} <-> {b} (NVML P2P NVLink status {status})")
        return problems
    finally:
        pynvml.nvmlShutdown()


def require_nvlink(bus_ids: list[str]) -> None:
    """Local form of the check (one host's GPUs), for tools that have no process group."""
    problems = nvlink_problems(bus_ids)
    if problems:
        raise TopologyError(
            "the GPUs of these ranks are not connected by NVLink, which ep_rt's intranode kernels need: "
            + "; ".join(problems)
            + ". Set EP_RT_SKIP_TOPOLOGY_CHECK=1 to try anyway (PCIe P2P, slow)."
        )
