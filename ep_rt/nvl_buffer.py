"""A rank's NVL buffer and its peers' mappings: allocation, CUDA IPC exchange over the process
group, host-mapped counters and error record, host tokens, the device barrier, teardown.

Call sequence numbers live in the control region (device memory) and advance on the GPU, so calls can be
captured in CUDA graphs; the host only numbers the notify calls whose counts it waits for (host tokens).

Teardown order: device sync, barrier (no peer still writes into us), close peer mappings, free the
local buffer, free host memory.
"""
from __future__ import annotations

import ctypes
import time

import torch
import torch.distributed as dist

from . import _driver, buffer_layout, cubins, params
from .errors import EpRtError, error_from_record
from .launch import Launcher

_ERROR_BYTES = 128
_BARRIER_BLOCK = 32


class NvlBuffer:
    def __init__(self, group, num_nvl_bytes: int, device_index: int, timeout_s: float):
        self.group = group
        self.rank = dist.get_rank(group)
        self.num_ranks = dist.get_world_size(group)
        if not 1 <= self.num_ranks <= buffer_layout.MAX_NVL_RANKS:
            raise ValueError(f"an intranode buffer serves 1..{buffer_layout.MAX_NVL_RANKS} ranks; "
                             f"this group has {self.num_ranks}")
        self.device_index = device_index
        self.num_nvl_bytes = num_nvl_bytes
        self.timeout_ns = int(timeout_s * 1e9)
        self.timeout_s = timeout_s
        self.host_token = 0
        self.failed: EpRtError | None = None
        self.peer_ptrs = [0] * self.num_ranks
        self._opened: list[int] = []
        self.local_ptr = 0
        self.host_ptr = 0

        _driver.ensure_context(device_index)
        total = buffer_layout.CONTROL_BYTES + num_nvl_bytes
        self.local_ptr = _driver.mem_alloc(total)
        _driver.memset_d8(self.local_ptr, 0, total)
        host_bytes = _ERROR_BYTES + params.EP_RT_HOST_COUNTER_WORDS * 4
        self.host_ptr, self.host_dev_ptr = _driver.host_alloc_mapped(host_bytes)
        self.error = params.ErrorRecord.from_address(self.host_ptr)
        self.counters = (ctypes.c_int32 * params.EP_RT_HOST_COUNTER_WORDS).from_address(self.host_ptr + _ERROR_BYTES)
        self.error_dev_ptr = self.host_dev_ptr
        self.counters_dev_ptr = self.host_dev_ptr + _ERROR_BYTES
        self.ctrl = params.ControlLayout()
        buffer_layout.fill_control(self.ctrl, num_nvl_bytes)

        info = (_driver.ipc_get_handle(self.local_ptr), _driver.pci_bus_id(device_index))
        gathered = [None] * self.num_ranks
        dist.all_gather_object(gathered, info, group=group)
        self.bus_ids = [g[1] for g in gathered]
        if gathered[self.rank][0] != info[0]:
            raise EpRtError("IPC handle exchange returned a different handle for this rank")
        for r, (handle, _) in enumerate(gathered):
            if r == self.rank:
                self.peer_ptrs[r] = self.local_ptr
            else:
                self.peer_ptrs[r] = _driver.ipc_open_handle(handle)
                self._opened.append(self.peer_ptrs[r])

        module = cubins.load_family(device_index, "intranode")
        self._barrier = Launcher(module, "ep_rt_intranode_barrier", params.BarrierParams, block=_BARRIER_BLOCK)
        self.fill_common(self._barrier.params)

    # ---- per-call helpers -----------------------------------------------------------------------
    def fill_common(self, p) -> None:
        """Fields every intranode kernel shares: peers, error sink, control layout, rank, timeout."""
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
        if self.failed is None:
            self.failed = error_from_record(self.error)
        if self.failed is not None:
            raise self.failed

    def wait_host_counters(self, token: int, phase: str) -> None:
        """Spin until the notify kernel given `token` has published the host counters, with a timeout."""
        counter, want = self.counters, token
        # Later than the kernels' own deadline, so their error (which names the missing peer) comes first.
        deadline = time.monotonic() + 1.5 * self.timeout_s + 2.0
        spins = 0
        while True:
            if counter[params.EP_RT_HOST_TOKEN] == want:
                return
            spins += 1
            if spins % 256 == 0:
                self.raise_if_failed()
                if time.monotonic() > deadline:
                    self.failed = EpRtError(
                        f"rank {self.rank}: host timed out after {self.timeout_s:.1f} s in {phase}: the GPU never "
                        f"published the receive counts. A peer rank did not make the same call, or the GPU is "
                        f"stuck behind earlier work. The Buffer is unusable now; destroy it.")
                    raise self.failed

    def barrier(self, stream, synchronize: bool = True) -> None:
        self.raise_if_failed()
        self._barrier(1, stream)
        if synchronize:
            stream.synchronize()
            self.raise_if_failed()

    def data_tensor(self, peer: int | None = None) -> torch.Tensor:
        """The data region of my buffer (or a peer's mapping of theirs) as a uint8 tensor (no copy)."""
        ptr = self.peer_ptrs[self.rank if peer is None else peer] + buffer_layout.CONTROL_BYTES
        return _tensor_at(ptr, self.num_nvl_bytes, self.device_index)

    def destroy(self, stream) -> None:
        try:
            if self.failed is None:
                torch.cuda.synchronize(self.device_index)
                self.barrier(stream)
        finally:
            for ptr in self._opened:
                _driver.ipc_close_handle(ptr)
            self._opened = []
            if self.local_ptr:
                _driver.mem_free(self.local_ptr)
                self.local_ptr = 0
            if self.host_ptr:
                self.error = self.counters = None
                _driver.host_free(self.host_ptr)
                self.host_ptr = 0


class _CudaArray:
    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def _tensor_at(ptr: int, nbytes: int, device_index: int) -> torch.Tensor:
    return torch.as_tensor(_CudaArray(ptr, nbytes), device=torch.device("cuda", device_index))
