"""`Buffer.runtime`: the methods of DeepEP V1's C++ runtime (`deep_ep_cpp.Buffer`, bound in its csrc/deep_ep.cpp)
that Python code calls, answered from ep_rt's state with DeepEP's meaning.

DeepEP's "RDMA rank" is a node: rank // 8, with 8 ranks per NVLink domain. ep_rt's nodes come from its Topology
(by host, or EP_RT_RANKS_PER_NODE), which may hold fewer than 8 ranks, so every answer uses Topology's node size.
What ep_rt cannot answer truthfully raises NotImplementedError naming the method: DeepEP's sync step (ep_rt's
Buffer() has already exchanged everything) and the data-path calls, whose C++ argument lists (raw handle tensors,
EventHandles) ep_rt's Buffer methods of the same names replace.

Buffer.runtime makes a new one on each access and the Buffer keeps none, so there is no reference cycle: a Buffer
nobody holds is still released at once (implicit teardown), as before.
"""

from __future__ import annotations

from .errors import EpRtError
from .runtime import driver

# DeepEP's C++ methods that ep_rt does not answer, and why (each still exists, so hasattr() is True as in DeepEP).
NOT_ANSWERED = {
    "sync": "ep_rt's Buffer() exchanges the device ids, the IPC handles and the NVSHMEM unique id itself; the Buffer "
    "is ready when the constructor returns",
    "get_local_nvshmem_unique_id": "ep_rt's Buffer() initialises NVSHMEM itself (rank 0's unique id is broadcast over "
    "the process group); there is no separate unique-id step",
    "get_dispatch_layout": "call Buffer.get_dispatch_layout (DeepEP's Python API)",
    "intranode_dispatch": "call Buffer.dispatch (DeepEP's Python API); ep_rt has no C++-level argument list",
    "intranode_combine": "call Buffer.combine (DeepEP's Python API); ep_rt has no C++-level argument list",
    "internode_dispatch": "call Buffer.dispatch or Buffer.internode_dispatch (DeepEP's Python API)",
    "internode_combine": "call Buffer.combine or Buffer.internode_combine (DeepEP's Python API)",
    "low_latency_dispatch": "call Buffer.low_latency_dispatch (DeepEP's Python API)",
    "low_latency_combine": "call Buffer.low_latency_combine (DeepEP's Python API)",
    "get_next_low_latency_combine_buffer": "call Buffer.get_next_low_latency_combine_buffer(handle)",
}


def _not_answered(name: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(
            f"buffer.runtime.{name}() (DeepEP's C++ runtime) is not provided by ep_rt: {NOT_ANSWERED[name]}"
        )

    method.__name__ = name
    method.__doc__ = f"Not provided by ep_rt: {NOT_ANSWERED[name]}."
    return method


class DeepEPRuntime:
    """DeepEP's `Buffer.runtime` for an ep_rt Buffer."""

    __slots__ = ("_of",)

    def __init__(self, buffer):
        self._of = buffer

    def _buffer(self):
        return self._of

    def __repr__(self) -> str:
        return f"<ep_rt DeepEP runtime of a Buffer on {self._of.topology.describe()}>"

    # ---- state -----------------------------------------------------------------------------------
    def is_available(self) -> bool:
        """DeepEP: True once sync() ran, False after destroy(). ep_rt: True until the Buffer is destroyed."""
        return not self._of.destroyed

    def is_internode_available(self) -> bool:
        """Available, and the high-throughput calls run across nodes (the internode kernels)."""
        return self.is_available() and self._buffer().is_internode

    def get_num_rdma_ranks(self) -> int:
        """The number of nodes (DeepEP: max(1, num_ranks // 8))."""
        return self._buffer().topology.num_nodes

    def get_rdma_rank(self) -> int:
        """This rank's node index (DeepEP: rank // 8)."""
        return self._buffer().topology.node

    def get_root_rdma_rank(self, global_: bool) -> int:
        """DeepEP: with global_, the global rank of this rank's peer on node 0 (its local rank); else 0, the root's
        node index."""
        return self._buffer().topology.local_rank if global_ else 0

    def get_local_device_id(self) -> int:
        """The CUDA device index the Buffer was created on."""
        return self._buffer().device_index

    def get_local_ipc_handle(self) -> bytearray:
        """The CUDA IPC handle (64 bytes) of this rank's NVL buffer allocation; zeros without one, as DeepEP. Unlike
        DeepEP's, the mapping starts with ep_rt's control region (the data region follows it: nvl_layout)."""
        buffer = self._buffer()
        if buffer.destroyed:
            raise EpRtError("this Buffer has been destroyed")
        nvl = buffer._nvl
        if nvl is None:
            return bytearray(driver.IPC_HANDLE_BYTES)
        return bytearray(driver.ipc_get_handle(nvl.local_ptr))

    def get_local_buffer_tensor(self, dtype, offset: int = 0, use_rdma_buffer: bool = False):
        """DeepEP's C++ form (dtype, offset, use_rdma_buffer): a 1-D view from `offset` bytes on, which stops at the
        buffer's end (DeepEP's runs past it by `offset`)."""
        return self._buffer().get_local_buffer_tensor(dtype, None, offset, use_rdma_buffer)

    def get_comm_stream(self):
        return self._buffer().comm_stream

    def destroy(self) -> None:
        """As Buffer.destroy(): collective, only for Buffers made with explicitly_destroy=True."""
        self._buffer().destroy()

    # ---- low-latency helpers with DeepEP's own argument lists --------------------------------------
    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        self._buffer().clean_low_latency_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts)

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        self._buffer().low_latency_update_mask_buffer(rank_to_mask, mask)

    def low_latency_query_mask_buffer(self, mask_status) -> None:
        self._buffer().low_latency_query_mask_buffer(mask_status)

    def low_latency_clean_mask_buffer(self) -> None:
        self._buffer().low_latency_clean_mask_buffer()


for _name in NOT_ANSWERED:
    setattr(DeepEPRuntime, _name, _not_answered(_name))
del _name
