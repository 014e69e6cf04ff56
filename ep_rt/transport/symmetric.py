"""A symmetric (NVSHMEM) buffer: the same offsets on every PE of the session's world, and the NVLink-mapped bases of
the ranks NVSHMEM can reach with stores (0 for the others, which take NVSHMEM operations, and for ranks that are not
PEs of the world at all: the node peers in a rail world). Used by the low-latency and internode HT ops."""

from __future__ import annotations

import torch

from ..runtime import driver
from . import nvshmem
from .nvshmem import NvshmemSession


class SymmetricBuffer:
    """A transport part: `error_slot` is the slot of the op that uses it (low_latency or internode), whose failure
    means the peers may be anywhere, so that destroy(collective) never frees collectively then."""

    def __init__(
        self, session: NvshmemSession, nbytes: int, num_ranks: int, device: torch.device, error_slot: str | None = None
    ):
        self.session = session
        self.error_slot = error_slot
        self.nbytes = nbytes
        self.ptr = nvshmem.align(nbytes)  # collective: every rank's inputs were compared first (transport.agreement)
        driver.memset_d8(self.ptr, 0, nbytes)
        # cuMemsetD8 may return before the bytes are zero: finish it before the barrier lets any peer write here.
        driver.ctx_synchronize()
        nvshmem.barrier_all()
        pes = [session.pe_of_rank(r) for r in range(num_ranks)]
        self.peer_bases = torch.tensor(
            [nvshmem.peer_ptr(self.ptr, pe) if pe is not None else 0 for pe in pes], dtype=torch.int64, device=device
        )
        self.nvlink_peers = int((self.peer_bases != 0).sum())

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
