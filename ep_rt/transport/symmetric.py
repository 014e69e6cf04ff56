"""A symmetric (NVSHMEM) buffer: the same offsets on every PE of the session's world, and the NVLink-mapped bases of
the ranks NVSHMEM can reach with stores (0 for the others, which take NVSHMEM operations, and for ranks that are not
PEs of the world at all: the node peers in a rail world). Used by the low-latency and internode HT ops."""

from __future__ import annotations

from ..runtime import driver
from . import nvshmem
from .nvshmem import NvshmemSession


class SymmetricBuffer:
    """A transport part: `error_slot` is the slot of the op that uses it (low_latency or internode), whose failure
    means the peers may be anywhere, so that destroy(collective) never frees collectively then."""

    def __init__(self, session: NvshmemSession, nbytes: int, num_ranks: int, error_slot: str | None = None):
        self.session = session
        self.error_slot = error_slot
        self.nbytes = nbytes
        self.ptr = nvshmem.align(nbytes)  # collective: every rank's inputs were compared first (transport.agreement)
        driver.memset_d8(self.ptr, 0, nbytes)
        # cuMemsetD8 may return before the bytes are zero: finish it before the barrier lets any peer write here.
        driver.ctx_synchronize()
        nvshmem.barrier_all()
        pes = [session.pe_of_rank(r) for r in range(num_ranks)]
        # Per rank, the buffer's address mapped here by NVSHMEM (NVLink peers), else 0 (ll_peer_bases below).
        self.mapped_bases = [nvshmem.peer_ptr(self.ptr, pe) if pe is not None else 0 for pe in pes]

    @property
    def pe_base(self) -> int:
        """With pe_stride: the PE of the rank with this rank's local index on node n is pe_base + n * pe_stride."""
        return self.session.pe_base

    @property
    def pe_stride(self) -> int:
        return self.session.pe_stride

    def destroy(self, collective: bool) -> None:
        """nvshmem_free is collective: only when every peer is in teardown too (the Buffer first runs a barrier
        with a deadline that says so); otherwise the heap is left to process exit."""
        if not self.ptr:
            return
        ptr, self.ptr = self.ptr, 0
        if collective:
            nvshmem.free(ptr)


def ll_peer_bases(mapped: list, topology, own_base: int) -> tuple[list, list]:
    """The low-latency kernels' base per rank (NVLink stores where non-zero, NVSHMEM operations where 0) from what
    nvshmem_ptr mapped, and the ranks of this node it left unmapped.

    - This rank is always its own buffer, whatever nvshmem_ptr says (with NVSHMEM_DISABLE_P2P too, as DeepEP's
      kernels special-case themselves): an NVSHMEM operation to oneself may go through the NIC (NETWORK.md §4).
    - Emulated nodes (EP_RT_RANKS_PER_NODE): ranks of other nodes take the NVSHMEM path, as on a cluster, although
      NVSHMEM could map them here. (On a real cluster nvshmem_ptr is already 0 for them, unless MNNVL maps them, and
      then NVLink stores are what DeepEP uses too.)
    - A rank of this node that NVSHMEM did not map (P2P disabled or unavailable) is reached through NVSHMEM's
      remote transport: correct, but through the NIC. The caller says so when NVLink was allowed."""
    bases = [int(b) for b in mapped]
    if len(bases) != topology.num_ranks:
        raise ValueError(f"{len(bases)} mapped bases for {topology.num_ranks} ranks")
    bases[topology.rank] = int(own_base)
    unmapped = []
    for r in range(topology.num_ranks):
        if topology.node_of(r) != topology.node:
            if topology.emulated:
                bases[r] = 0
        elif bases[r] == 0:
            unmapped.append(r)
    return bases, unmapped


def unmapped_node_peers_warning(rank: int, unmapped: list) -> str:
    """What a user reads when NVSHMEM mapped some ranks of this rank's node for NVLink stores and not others."""
    return (
        f"ep_rt: rank {rank}: NVSHMEM gave no NVLink mapping of the low-latency buffer of rank(s) "
        f"{', '.join(map(str, unmapped))} on this node (P2P unavailable between these GPUs, or NVSHMEM_DISABLE_P2P "
        f"set outside ep_rt), so low-latency traffic to them goes through NVSHMEM's remote transport (the NIC): "
        f"correct, but slower than NVLink. Pass allow_nvlink_for_low_latency_mode=False to mean that, or check "
        f"`python -m ep_rt doctor` for this node's NVLink."
    )
