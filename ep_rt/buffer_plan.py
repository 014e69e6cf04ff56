"""The mode rules of a Buffer, as a pure function of plain inputs: which high-throughput op it runs, whether it has
an NVL buffer, the low-latency mode and the NVSHMEM session (which world, which cubins, in which order), its
deadlines and its teardown. Buffer.__init__ executes the plan; nothing here touches a GPU, the group or the
environment, so every rule is tested on the CPU (tests/buffer/test_buffer_plan.py).

The rules are checked in two steps, where Buffer always checked them: check_arguments before anything touches CUDA,
and plan() inside the Buffer's preparation (transport.agreement.exchange: a rank whose rules fail fails every rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

INTRANODE, INTERNODE = "intranode", "internode"  # the high-throughput ops (Buffer's factory table is keyed by them)
LOW_LATENCY = "low_latency"
RAIL, FULL = "rail", "full"  # NVSHMEM worlds (transport.nvshmem_world)

_NOT_YET = (
    "ep_rt does not implement {what} yet (this release covers high-throughput dispatch and combine within and "
    "across nodes over a torch.distributed process group or an mpi4py communicator, and the low-latency mode)"
)


def not_yet(what: str) -> NotImplementedError:
    return NotImplementedError(_NOT_YET.format(what=what))


def check_arguments(num_nvl_bytes, num_rdma_bytes, low_latency_mode: bool, num_qps_per_rank, use_fabric: bool) -> None:
    """The constructor's arguments on their own (no topology yet), in the order Buffer checks them."""
    if use_fabric:
        raise not_yet("fabric (MNNVL) memory handles")
    for name, value in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes)):
        if not isinstance(value, int) or value < 0 or value % 128:
            raise ValueError(f"{name} must be a non-negative multiple of 128, got {value!r}")
    if low_latency_mode and num_rdma_bytes == 0:
        raise ValueError("low_latency_mode needs num_rdma_bytes > 0 (see get_low_latency_rdma_size_hint)")
    if low_latency_mode and (not isinstance(num_qps_per_rank, int) or num_qps_per_rank <= 0):
        raise ValueError(f"num_qps_per_rank must be a positive int, got {num_qps_per_rank!r}")


def timeout_of(timeout_s: Optional[float], default: Callable[[], float]) -> float:
    """The Buffer's deadline for a peer: timeout_s, else `default()` (env.timeout_s: EP_RT_TIMEOUT_S)."""
    timeout = default() if timeout_s is None else float(timeout_s)
    if timeout <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout}")
    return timeout


@dataclass(frozen=True)
class BufferPlan:
    """What a Buffer is made of, in the order Buffer builds it (transports first, then ops)."""

    ht: Optional[str]  # INTRANODE, INTERNODE, or None (a low-latency Buffer across nodes without NVL buffer)
    nvl_buffer: bool  # the node's NVL buffer, the layout op and the node barrier
    low_latency: bool
    shared_symmetric: bool  # internode HT and LL in one symmetric buffer (ep_rt.ops.mode_switch guards the switches)
    cubins: tuple  # NVSHMEM-linked families, in the order their cubins are chosen (INTERNODE first)
    nvshmem_world: Optional[str]  # RAIL, FULL, or None (no NVSHMEM session)
    nvshmem_allow_nvlink: bool  # NVSHMEM may use NVLink (DeepEP's NVSHMEM_DISABLE_P2P rule: LL mode only)
    timeout_s: float  # NVL kernels, host waits and the LL kernels
    internode_deadline: str  # "network": the internode op waits env.net_timeout_s(timeout_s) (EP_RT_NET_TIMEOUT_S)
    destroy: str  # "destroy()": freed by Buffer.destroy() only; "finalizer": when garbage-collected
    nvshmem_teardown_local: bool  # shrink mode: NVSHMEM's collective teardown is never risked (masks are per rank)

    @property
    def first_session_family(self) -> Optional[str]:
        """The cubin whose NVSHMEM version the session is prepared for (the first of `cubins`)."""
        return self.cubins[0] if self.cubins else None


def plan(
    num_ranks: int,
    num_nodes: int,
    topology_description: str,
    num_nvl_bytes: int,
    num_rdma_bytes: int,
    low_latency_mode: bool,
    allow_nvlink_for_low_latency_mode: bool,
    explicitly_destroy: bool,
    enable_shrink: bool,
    timeout_s: float,
    rail_world_supported: bool,
) -> BufferPlan:
    """The Buffer's plan, or the ValueError its arguments earn on this topology. rail_world_supported: the
    internode op's kernels can run in a world of their rail (InternodeOp.supports_rail_world)."""
    # Internode high-throughput mode: ranks on several nodes, with an RDMA buffer; with low_latency_mode too only
    # when an NVL buffer is given (DeepEP's LL-compatibility case: both modes then share one symmetric buffer, as
    # DeepEP's, and a barrier on the comm stream separates a call of one mode from the other's: ep_rt.ops.mode_switch).
    internode = num_nodes > 1 and num_rdma_bytes > 0 and (not low_latency_mode or num_nvl_bytes > 0)
    if num_nodes == 1 and num_rdma_bytes and not low_latency_mode:
        raise ValueError(
            f"num_rdma_bytes is for the low-latency mode and for ranks on several nodes; these "
            f"{num_ranks} ranks are on one node and low_latency_mode is off: pass "
            f"num_rdma_bytes=0 (nothing would use it)"
        )
    if num_nodes > 1 and not internode and not low_latency_mode:
        raise ValueError(
            f"the ranks span {topology_description}: high-throughput mode across nodes needs "
            f"num_rdma_bytes > 0 (see Config.get_rdma_buffer_size_hint)"
        )
    ht = INTRANODE if num_nodes == 1 else INTERNODE if internode else None
    cubins = ((INTERNODE,) if internode else ()) + ((LOW_LATENCY,) if low_latency_mode else ())
    # A high-throughput-only Buffer joins its rail's world (N PEs), once its kernels say they can run in one.
    world = None if not cubins else FULL if low_latency_mode or not rail_world_supported else RAIL
    return BufferPlan(
        ht=ht,
        nvl_buffer=num_nodes == 1 or internode,
        low_latency=low_latency_mode,
        shared_symmetric=internode and low_latency_mode,
        cubins=cubins,
        nvshmem_world=world,
        nvshmem_allow_nvlink=allow_nvlink_for_low_latency_mode if low_latency_mode else True,
        timeout_s=timeout_s,
        internode_deadline="network",
        destroy="destroy()" if explicitly_destroy else "finalizer",
        nvshmem_teardown_local=low_latency_mode and enable_shrink,
    )


def part_destroy_collective(
    slot: Union[str, tuple, None], collective: bool, nvshmem_collective: bool, slot_failed: Callable[[str], bool]
) -> bool:
    """Whether a transport part is destroyed collectively. collective: the teardown is (destroy(), every peer
    there); nvshmem_collective: also every NVSHMEM user passed its barrier (and no shrink mode). A part whose kernels
    failed is freed locally (its peers may be anywhere); the NVSHMEM session and the symmetric buffers follow the
    NVSHMEM users, since NVSHMEM's own teardown has no deadline. A tuple of slots: a part that several ops use (the
    symmetric buffer both modes share), freed collectively only if none of them failed."""
    if slot == "nvshmem":
        return collective and nvshmem_collective
    slots = slot if isinstance(slot, tuple) else (slot,)
    if any(s in (LOW_LATENCY, INTERNODE) for s in slots):
        # asked even when the teardown is local (a recoverable error re-arms there, as it always did)
        return not any([slot_failed(s) for s in slots]) and nvshmem_collective and collective
    return collective and (slot is None or not slot_failed(slot))
