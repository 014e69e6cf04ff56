"""The device memory a Buffer allocates for given arguments, ep_rt's and DeepEP V1's (issue 22 item 2: memory no
larger than DeepEP's). Both allocate the caller's num_nvl_bytes and num_rdma_bytes; what each adds on top:

- ep_rt: the NVL buffer's control area (head/tail words, barrier, published prefixes; transport/nvl_layout.py), the
  control area after num_rdma_bytes in the symmetric buffer (internode: stream words and barrier; LL: 64-bit signal
  words for up to EP_RT_LL_MAX_SIGNALS experts and the buffer credits), and each op's small device state (LL: send
  slots per expert and the shrink mask; internode: workspace, scratch, consumed words).
- DeepEP V1 (csrc/deep_ep.cpp, Buffer's constructor): beside num_nvl_bytes its NVL allocation holds the barrier
  signals and the peers' pointer tables (NUM_MAX_NVL_PEERS ints and two pointer arrays), and every Buffer
  cudaMallocs a workspace of NUM_WORKSPACE_BYTES = 32 MiB (the LL kernels' per-expert counters among others).

Host-mapped words, CUDA contexts and NVSHMEM's own heap reservation (both libraries use NVSHMEM's default) are
left out of both. Pure arithmetic over the layouts the Buffer uses (tests/buffer/test_buffer_memory.py holds ep_rt's
total at or below DeepEP's on every layout up to 256 ranks; tests/gpu/test_buffer_memory_gpu.py checks the parts
against what a Buffer really allocates)."""

from __future__ import annotations

from . import buffer_plan
from .runtime import abi
from .transport import nvl_layout

DEEPEP_WORKSPACE_BYTES = 32 * 1024 * 1024  # NUM_WORKSPACE_BYTES in DeepEP V1's csrc/kernels/configs.cuh
DEEPEP_MAX_NVL_PEERS = 8


def deepep_device_bytes(num_nvl_bytes: int, num_rdma_bytes: int) -> dict:
    """DeepEP V1's device allocations per rank: {part: bytes} and "total"."""
    nvl_extra = DEEPEP_MAX_NVL_PEERS * 4 + 2 * DEEPEP_MAX_NVL_PEERS * 8  # barrier signals, two pointer tables
    parts = {
        "nvl": num_nvl_bytes + nvl_extra if num_nvl_bytes else 0,
        "rdma": num_rdma_bytes,
        "workspace": DEEPEP_WORKSPACE_BYTES,
    }
    return {**parts, "total": sum(parts.values())}


def shared_symmetric_layout(num_rdma_bytes: int, num_ranks: int, num_nodes: int) -> tuple[int, int]:
    """The symmetric buffer both modes share: (where the LL op's control area starts, right after the internode
    op's; the whole allocation)."""
    from .ops.internode import InternodeOp
    from .ops.low_latency import LowLatencyOp

    start = InternodeOp.symmetric_bytes(num_rdma_bytes, num_ranks, num_nodes)
    return start, LowLatencyOp.symmetric_bytes(num_rdma_bytes, num_ranks, control_start=start)


def symmetric_bytes(plan: buffer_plan.BufferPlan, num_rdma_bytes: int, num_ranks: int, num_nodes: int) -> int:
    """The symmetric allocations of a Buffer with this plan, as Buffer._symmetric makes them: one buffer both
    modes share, or the internode op's and the LL op's apart."""
    from .ops.internode import InternodeOp
    from .ops.low_latency import LowLatencyOp

    if plan.shared_symmetric:
        return shared_symmetric_layout(num_rdma_bytes, num_ranks, num_nodes)[1]
    total = InternodeOp.symmetric_bytes(num_rdma_bytes, num_ranks, num_nodes) if plan.ht == buffer_plan.INTERNODE else 0
    if plan.low_latency:
        total += LowLatencyOp.symmetric_bytes(num_rdma_bytes, num_ranks)
    return total


def op_state_bytes(plan: buffer_plan.BufferPlan, num_ranks: int, num_nodes: int, enable_shrink: bool) -> int:
    """The ops' own device tensors (LowLatencyOp and InternodeOp's constructors; the symmetric buffer's table of peer
    bases, transport/symmetric.py), chaos counters left out."""
    total = num_ranks * 8 if plan.cubins else 0  # one symmetric buffer's peer bases (int64 [R])
    if plan.low_latency:
        total += (abi.EP_RT_LL_WS_COUNTERS + abi.EP_RT_LL_MAX_SIGNALS) * 4 + (num_ranks * 4 if enable_shrink else 0)
    if plan.ht == buffer_plan.INTERNODE:
        total += abi.EP_RT_IN_WS_WORDS * 8 + abi.EP_RT_MAX_CHANNELS * (num_ranks + num_nodes) * 4
        total += 2 * abi.EP_RT_IN_MAX_NODES * abi.EP_RT_MAX_CHANNELS * abi.EP_RT_IN_STREAM_CHUNKS * 8
    return total


def ep_rt_device_bytes(
    plan: buffer_plan.BufferPlan,
    num_nvl_bytes: int,
    num_rdma_bytes: int,
    num_ranks: int,
    num_nodes: int,
    enable_shrink: bool = False,
) -> dict:
    """ep_rt's device allocations per rank for a Buffer with this plan: {part: bytes} and "total"."""
    parts = {
        "nvl": nvl_layout.CONTROL_BYTES + num_nvl_bytes if plan.nvl_buffer else 0,
        "symmetric": symmetric_bytes(plan, num_rdma_bytes, num_ranks, num_nodes),
        "op state": op_state_bytes(plan, num_ranks, num_nodes, enable_shrink),
    }
    return {**parts, "total": sum(parts.values())}
