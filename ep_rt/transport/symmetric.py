"""A symmetric (NVSHMEM) buffer: the same offsets on every PE, NVLink-mapped bases of the peers NVSHMEM can reach
with stores (0 for the others, which take NVSHMEM puts). Used by the low-latency op, later by internode HT."""
from __future__ import annotations

import torch

from ..runtime import driver
from . import nvshmem
from .nvshmem import NvshmemSession


class SymmetricBuffer:
    def __init__(self, session: NvshmemSession, nbytes: int, num_ranks: int, device: torch.device):
        self.session = session
        self.nbytes = nbytes
        self.ptr = nvshmem.align(nbytes)
        driver.memset_d8(self.ptr, 0, nbytes)
        nvshmem.barrier_all()  # every PE has zeroed its copy before any peer writes into it
        self.peer_bases = torch.tensor([nvshmem.peer_ptr(self.ptr, r) for r in range(num_ranks)],
                                       dtype=torch.int64, device=device)
        self.nvlink_peers = int((self.peer_bases != 0).sum())

    def destroy(self, collective: bool) -> None:
        """nvshmem_free is collective: only when every peer is in teardown too (the Buffer first runs a barrier
        with a deadline that says so); otherwise the heap is left to process exit."""
        if not self.ptr:
            return
        ptr, self.ptr = self.ptr, 0
        if collective:
            nvshmem.free(ptr)
