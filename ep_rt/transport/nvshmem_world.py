"""Which NVSHMEM world a Buffer joins, and how its kernels name the PE of a node (issue 21 item 6).

On IBGDA every PE of a world holds NVSHMEM_IBGDA_NUM_RC_PER_PE RC queue pairs to every other PE (NVSHMEM 3.4.5,
ibgda.cpp: no loopback RC), and a quiet or a fence sweeps all of them: num_qps x (npes - 1) per GPU. The
high-throughput kernels talk over the network only to their rail peers (the rank with the same local index on each
node), so DeepEP V1 initialises NVSHMEM for them over each rail alone (N PEs); its low-latency mode needs every
rank (R PEs). ep_rt chooses the same way:

- "rail" world, a Buffer for internode high-throughput calls only (low_latency_mode off): the N ranks of one local
  index, PE = node index. Node peers are not PEs of it: nvshmem_ptr maps none of them, so the high-throughput path
  reaches them through the NVL buffer only.
- "full" world, a Buffer with low_latency_mode (it may serve internode high-throughput calls too): all R ranks,
  PE = group rank.

The kernels name the rail peer on node n as PE `pe_base + n * pe_stride`: (0, 1) in a rail world, (local index, G) in
a full world (NvshmemWorld.pe_of_node). Pure data and functions: CPU-testable, no NVSHMEM needed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EpRtError

RAIL, FULL = "rail", "full"


@dataclass(frozen=True)
class NvshmemWorld:
    kind: str  # RAIL or FULL
    members: tuple  # group ranks of the PEs, in PE order
    my_pe: int  # this rank's PE
    pe_base: int  # PE of node n's rail peer = pe_base + n * pe_stride
    pe_stride: int
    root: int  # group rank whose NVSHMEM unique id starts this world (its PE 0)
    node_size: int  # G of the topology the world was made for

    @property
    def npes(self) -> int:
        return len(self.members)

    def pe_of_node(self, node: int) -> int:
        """PE of the rank of node `node` that has this rank's local index (the rail peer there)."""
        return self.pe_base + node * self.pe_stride

    def pe_of_rank(self, rank: int) -> int | None:
        """PE of group rank `rank`, or None if that rank is not a PE of this world (a node peer in a rail world)."""
        try:
            return self.members.index(rank)
        except ValueError:
            return None

    def describe(self) -> str:
        if self.kind == FULL:
            return f"a world of all {self.npes} ranks"
        local = self.members[0] % self.node_size
        return (
            f"a rail world of {self.npes} PEs (the ranks with local index {local} on each of {self.npes} nodes "
            f"of {self.node_size}: group ranks {', '.join(map(str, self.members))})"
        )


def full_world(topology) -> NvshmemWorld:
    R, G = topology.num_ranks, topology.node_size
    return NvshmemWorld(FULL, tuple(range(R)), topology.rank, topology.local_rank, G, 0, G)


def rail_world(topology) -> NvshmemWorld:
    G, local = topology.node_size, topology.local_rank
    members = tuple(n * G + local for n in range(topology.num_nodes))
    return NvshmemWorld(RAIL, members, topology.node, 0, 1, local, G)


def choose(topology, low_latency_mode: bool, rail_supported: bool = True) -> NvshmemWorld:
    """The world a Buffer initialises: full with low_latency_mode (LL reaches every rank), else the rail world
    (internode high-throughput only). `rail_supported=False` keeps the full world for high-throughput kernels that
    still address node peers through NVSHMEM."""
    if low_latency_mode or not rail_supported:
        return full_world(topology)
    return rail_world(topology)


def root_ranks(world_kind: str, topology) -> range:
    """Group ranks that make a unique id for the exchange (DeepEP's: rank 0 for the full world, every rank of node 0
    for the rail worlds, one per rail); every rank then takes the id of its world's root from the all-gather."""
    return range(1) if world_kind == FULL else range(topology.node_size)


def start_turns(world_kind: str, topology) -> int:
    """In how many turns the worlds of a Buffer start NVSHMEM: 1 (all at once), or one turn per rail when two PEs of
    one rail world share a GPU (emulated nodes: several ranks on one GPU). NVSHMEM 3.4.5 then takes its path for
    several PEs per GPU, whose host shared memory is named by the PE only (init.cu, "mps_shm_<PE>": unlinked and
    re-created by each world's PE 0), so rail worlds starting at once on one host swap files, and a PE opens
    another's empty event handle ("mapping of buffer object failed", attempts 20261202T035128Z and T040509Z). On
    real nodes a rail has one PE per host, and this is 1."""
    if world_kind != RAIL:
        return 1
    places = [(topology.hosts[r], topology.bus_ids[r], r % topology.node_size) for r in range(topology.num_ranks)]
    return topology.node_size if len(set(places)) < len(places) else 1


def reuse(live: NvshmemWorld, live_identity: tuple, wanted: NvshmemWorld, identity: tuple, topology) -> NvshmemWorld:
    """NVSHMEM is initialised once per process. The world a new Buffer uses when one is already live: the same one
    (same kind over the same global ranks and node size), or, for a high-throughput-only Buffer, a live full world
    over the same ranks (its PEs of node n's rail peer are n * G + local). Anything else raises EpRtError saying what
    is supported. `identity` = (global ranks of the Buffer's group, node size)."""
    if live_identity == identity and live.kind == wanted.kind:
        return live
    if live_identity == identity and live.kind == FULL and wanted.kind == RAIL:
        return full_world(topology)
    raise EpRtError(
        f"NVSHMEM is initialised once per process, and this process already belongs to {live.describe()} (global "
        f"ranks {_span(live_identity[0])}, made by an earlier Buffer); this Buffer needs {wanted.describe()} over "
        f"global ranks {_span(identity[0])}. Supported: several Buffers over the same ranks and node size, and a "
        f"high-throughput-only Buffer beside a low_latency_mode one (it uses that world). For other ranks, or a "
        f"low-latency Buffer after a high-throughput-only one, destroy every earlier Buffer first with destroy() "
        f"(explicitly_destroy=True), which finalizes NVSHMEM (a Buffer released by garbage collection leaves the "
        f"world until the process exits); or create the low_latency_mode Buffer first: it serves both kinds of call."
    )


def _span(ranks) -> str:
    ranks = list(ranks)
    if ranks and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ", ".join(map(str, ranks))
