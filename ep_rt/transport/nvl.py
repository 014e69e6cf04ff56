"""A rank's NVL buffer and its node's mappings of it: allocation, CUDA IPC exchange, host-mapped counters, host
tokens, the device barrier over the node, teardown.

The buffer serves the ranks of one node (Topology.local_ranks): handles are exchanged over the whole process
group (one all-gather, no new process groups), and each rank opens only those of its own node. Kernels see the
node: `rank` is the local rank and `peer_buffers` are indexed by local rank. Call sequence numbers live in the
control region (device memory) and advance on the GPU, so calls can be captured in CUDA graphs; the host only
numbers the notify calls whose counts it waits for (host tokens).

Teardown order: device sync, node barrier (no peer still writes into us), close peer mappings, free the local
buffer, free host memory.
"""

from __future__ import annotations

import ctypes

import torch

from ..errors import EpRtError
from ..runtime import abi, driver, modules
from ..runtime.launch import Launcher
from . import collective, nvl_layout
from .error_record import ErrorRecords
from .device_view import device_tensor
from .host_wait import settle_after_interrupt, wait_for_token
from .topology import Topology

SLOT = "nvl"  # this buffer's slot in the ErrorRecords


class NvlBuffer:
    """A transport part (as every part a Buffer owns): `error_slot` names its ErrorRecords slot from construction,
    and destroy(collective) frees it (the node barrier of a collective teardown runs on `teardown_stream`, by
    default the current stream then)."""

    error_slot = SLOT

    def __init__(
        self,
        group,
        topology: Topology,
        num_nvl_bytes: int,
        device_index: int,
        timeout_s: float,
        errors: ErrorRecords,
        teardown_stream=None,
    ):
        G = topology.node_size
        if not 1 <= G <= nvl_layout.MAX_NVL_RANKS:
            raise ValueError(f"an NVL buffer serves 1..{nvl_layout.MAX_NVL_RANKS} ranks of a node; this node has {G}")
        self.topology = topology
        self.rank, self.num_ranks = topology.local_rank, G  # as the kernels see them
        self.device_index = device_index
        self.num_nvl_bytes = num_nvl_bytes
        self.timeout_s = timeout_s
        self.timeout_ns = int(timeout_s * 1e9)
        self.errors = errors
        self.teardown_stream = teardown_stream
        self.host_token = 0
        self.peer_ptrs = [0] * G
        self._opened: list[int] = []
        self.local_ptr = self.host_ptr = 0

        driver.ensure_context(device_index)
        total = nvl_layout.CONTROL_BYTES + num_nvl_bytes
        self.local_ptr = driver.mem_alloc(total)
        driver.memset_d8(self.local_ptr, 0, total)
        driver.ctx_synchronize()  # zero before the handle goes out: peers write here after the node barrier
        self.host_ptr, host_dev_ptr = driver.host_alloc_mapped(abi.EP_RT_HOST_COUNTER_WORDS * 4)
        self.counters = (ctypes.c_int32 * abi.EP_RT_HOST_COUNTER_WORDS).from_address(self.host_ptr)
        self.counters_dev_ptr = host_dev_ptr
        self.error_dev_ptr = errors.device_ptr(SLOT)
        self.ctrl = abi.ControlLayout()
        nvl_layout.fill_control(self.ctrl, num_nvl_bytes)
        errors.on_rearm(SLOT, self._reset_error_claim)

        handle = driver.ipc_get_handle(self.local_ptr)
        gathered = collective.all_gather_object(group, handle)
        if gathered[topology.rank] != handle:
            raise EpRtError("IPC handle exchange returned a different handle for this rank")
        for local, r in enumerate(topology.local_ranks):
            if r == topology.rank:
                self.peer_ptrs[local] = self.local_ptr
            else:
                self.peer_ptrs[local] = driver.ipc_open_handle(gathered[r])
                self._opened.append(self.peer_ptrs[local])

        module = modules.load_family(device_index, "intranode")
        self._barrier = Launcher(module, "ep_rt_intranode_barrier", abi.BarrierParams)
        self.fill_common(self._barrier.params)

    # ---- per-call helpers -----------------------------------------------------------------------
    def fill_common(self, p) -> None:
        """Fields every NVL kernel shares: peers, error sink, control layout, local rank, timeout."""
        for r, ptr in enumerate(self.peer_ptrs):
            p.peer_buffers[r] = ptr
        p.error = self.error_dev_ptr
        ctypes.memmove(ctypes.addressof(p.ctrl), ctypes.addressof(self.ctrl), ctypes.sizeof(self.ctrl))
        p.rank, p.num_ranks, p.timeout_ns = self.rank, self.num_ranks, self.timeout_ns

    def next_host_token(self) -> int:
        """Token under which the next notify publishes its counts to the host (never 0, which means "don't")."""
        self.host_token = self.host_token % 0x7FFFFFFF + 1
        return self.host_token

    def raise_if_failed(self) -> None:
        self.errors.raise_if_failed(SLOT)

    def _reset_error_claim(self) -> None:
        driver.memset_d8(self.local_ptr + nvl_layout.CONTROL_OFFSETS["error_claim"], 0, 4)
        torch.cuda.synchronize(self.device_index)

    @property
    def failed(self):
        return self.errors.check(SLOT)

    def wait_host_counters(self, token: int, phase: str) -> None:
        """Spin until the notify kernel given `token` has published the host counters, with a timeout."""
        wait_for_token(
            self.counters,
            abi.EP_RT_HOST_TOKEN,
            token,
            self.timeout_s,
            self.errors,
            SLOT,
            f"rank {self.topology.rank}",
            phase,
        )

    def barrier(self, stream, synchronize: bool = True) -> None:
        self.raise_if_failed()
        self._barrier(1, stream)
        if synchronize:
            stream.synchronize()
            self.raise_if_failed()

    def data_tensor(self, peer: int | None = None) -> torch.Tensor:
        """The data region of my buffer (or a node peer's mapping of theirs, by local rank) as uint8 (no copy)."""
        ptr = self.peer_ptrs[self.rank if peer is None else peer] + nvl_layout.CONTROL_BYTES
        return _tensor_at(ptr, self.num_nvl_bytes, self.device_index)

    def destroy(self, collective: bool, stream=None) -> None:
        """collective: a node barrier (with a deadline) first, so no peer still writes into us, then close the peer
        mappings and free. Otherwise (a failed call, a finalizer) peers may still write into this buffer, and
        freeing memory another process maps is undefined behaviour for that process: the mappings of the peers are
        closed, but this buffer stays allocated until the process exits (a fresh Buffer allocates its own)."""
        freed = False
        stream = stream if stream is not None else self.teardown_stream
        try:
            if collective and self.failed is None and self.local_ptr:
                self.barrier(stream if stream is not None else torch.cuda.current_stream(self.device_index))
                freed = True
        except BaseException as e:
            if not isinstance(e, Exception):  # interrupted in the barrier's wait: its kernel ends before the frees
                settle_after_interrupt(self.device_index)
            raise
        finally:
            for ptr in self._opened:
                driver.ipc_close_handle(ptr)
            self._opened = []
            if self.local_ptr and freed:
                driver.mem_free(self.local_ptr)
            elif self.local_ptr:
                _abandoned.append(self.local_ptr)
            self.local_ptr = 0
            if self.host_ptr:
                self.counters = None
                driver.host_free(self.host_ptr)
                self.host_ptr = 0


_abandoned: list[int] = []  # NVL buffers left to process exit (see NvlBuffer.destroy)


def _tensor_at(ptr: int, nbytes: int, device_index: int) -> torch.Tensor:
    return device_tensor(ptr, (nbytes,), torch.device("cuda", device_index))
