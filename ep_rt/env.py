"""Every environment knob ep_rt reads, in one place, each read through a function (never cached),
all prefixed EP_RT_. The README lists them."""

from __future__ import annotations

import os


# Every EP_RT_ variable ep_rt reads: this module's, and EP_RT_DEEP_EP_ALIAS, which the startup hook
# (_ep_rt_deep_ep) reads itself. python -m ep_rt doctor flags EP_RT_ names that are not among them.
KNOBS = (
    "EP_RT_CUBIN_DIR",
    "EP_RT_CUBIN_FLAVOUR",
    "EP_RT_AGGRESSIVE_PTX",
    "EP_RT_CHAOS_TRANSPORT",
    "EP_RT_TMA",
    "EP_RT_LL_TWO_KERNELS",
    "EP_RT_LL_PACKED",
    "EP_RT_CONFIG_FILE",
    "EP_RT_TIMEOUT_S",
    "EP_RT_NET_TIMEOUT_S",
    "EP_RT_NVSHMEM_TIMEOUT_S",
    "EP_RT_CHECK_VALUES",
    "EP_RT_SKIP_TOPOLOGY_CHECK",
    "EP_RT_RANKS_PER_NODE",
    "EP_RT_TOPK_IDX_BITS",
    "EP_RT_NVSHMEM_DEBUG",
    "EP_RT_DEEP_EP_ALIAS",
    "EP_RT_REMOTE_TRANSPORT",
    "EP_RT_HCA_LIST_PER_LOCAL_RANK",
    "EP_RT_NVSHMEM_HOST_LIBRARY",
)


def _flag(name: str, default: bool, environ=None) -> bool:
    value = (os.environ if environ is None else environ).get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def cubin_dir() -> str | None:
    """EP_RT_CUBIN_DIR: a folder with manifest.json that overrides the shipped cubins."""
    return os.environ.get("EP_RT_CUBIN_DIR") or None


CUBIN_FLAVOURS = ("cu12", "cu13")


def cubin_flavour() -> str | None:
    """EP_RT_CUBIN_FLAVOUR=cu12|cu13: load the cubins built with CUDA 12 (NVRTC 12.9) or CUDA 13 (nvcc 13) instead
    of choosing from the driver version and the NVSHMEM host library. Unset or empty: choose."""
    value = os.environ.get("EP_RT_CUBIN_FLAVOUR", "").strip().lower()
    if not value:
        return None
    if value not in CUBIN_FLAVOURS:
        raise ValueError(f"EP_RT_CUBIN_FLAVOUR must be one of {', '.join(CUBIN_FLAVOURS)} (or unset), got {value!r}")
    return value


def ll_two_kernels() -> bool:
    """EP_RT_LL_TWO_KERNELS=1: eager low-latency calls launch their send and receive halves as two kernels (the
    receive a programmatic dependent launch), as a call with a receive hook does, instead of one kernel (an A/B
    knob; read when a low-latency Buffer is made)."""
    return _flag("EP_RT_LL_TWO_KERNELS", False)


def ll_packed() -> bool:
    """EP_RT_LL_PACKED=1: low-latency Buffers load the LL cubins' packed variant (receive areas sized by what can
    arrive, docs/LL_PACKED_DESIGN.md; sm_90 only) and get_low_latency_rdma_size_hint returns its smaller size.
    Read when a Buffer is made and when the hint is asked; set it the same on every rank."""
    return _flag("EP_RT_LL_PACKED", False)


def aggressive_ptx() -> bool:
    """EP_RT_AGGRESSIVE_PTX=1: use the cubin variant with non-coherent loads of peer-written memory."""
    return _flag("EP_RT_AGGRESSIVE_PTX", False)


def chaos_transport() -> bool:
    """EP_RT_CHAOS_TRANSPORT=1 (a test mode): load the "chaos" variant of the NVSHMEM-linked kernel families, whose
    network puts (to peers on other nodes) are delivered late, split and reordered at the sender's quiet, each signal
    after its own data (kernels_src/include/ep_rt/net.cuh, docs/CHAOS_TRANSPORT.md). On one host it does something
    only with EP_RT_RANKS_PER_NODE (emulated nodes). Families without network traffic ignore it."""
    return _flag("EP_RT_CHAOS_TRANSPORT", False)


def tma() -> bool:
    """EP_RT_TMA=1: load the "tma" variant of the families that have one (intranode, sm_90): the dispatch copies
    its received rows out through the copy engine (cp.async.bulk; kernels_src/include/ep_rt/tma.cuh). For A/B
    measurements (issue 23 item 5); families without one ignore it."""
    return _flag("EP_RT_TMA", False)


def config_file() -> str | None:
    """EP_RT_CONFIG_FILE: a JSON file of tuned Configs (python -m ep_rt tune) that Buffer.get_dispatch_config and
    get_combine_config return for the rank counts it holds."""
    return os.environ.get("EP_RT_CONFIG_FILE") or None


def timeout_s() -> float:
    """EP_RT_TIMEOUT_S: how long kernels and host waits wait for a peer before failing (default 100 s)."""
    value = float(os.environ.get("EP_RT_TIMEOUT_S", "100"))
    if value <= 0:
        raise ValueError(f"EP_RT_TIMEOUT_S must be positive, got {value}")
    return value


def net_timeout_s(timeout: float | None = None) -> float:
    """EP_RT_NET_TIMEOUT_S: how long the internode kernels wait for a peer (each of their waits depends on the
    network); default 3 x the NVLink timeout (`timeout`, else EP_RT_TIMEOUT_S)."""
    base = timeout_s() if timeout is None else float(timeout)
    value = float(os.environ.get("EP_RT_NET_TIMEOUT_S", str(3 * base)))
    if value <= 0:
        raise ValueError(f"EP_RT_NET_TIMEOUT_S must be positive, got {value}")
    return value


def nvshmem_timeout_s() -> float:
    """EP_RT_NVSHMEM_TIMEOUT_S: how long NVSHMEM's collective host calls (its start, a symmetric allocation, its
    barrier, free and finalize) may wait for the other PEs before ep_rt ends the process (default 600 s; 0: wait as
    long as NVSHMEM does, which has no deadline of its own)."""
    value = float(os.environ.get("EP_RT_NVSHMEM_TIMEOUT_S", "600"))
    if value < 0:
        raise ValueError(f"EP_RT_NVSHMEM_TIMEOUT_S must be 0 (no deadline) or positive, got {value}")
    return value


def check_values() -> bool:
    """EP_RT_CHECK_VALUES=0 skips the kernels' check of the topk_idx range (ops/layout.py; it needs no device sync:
    the check before a dispatch is one small kernel launch)."""
    return _flag("EP_RT_CHECK_VALUES", True)


def skip_topology_check() -> bool:
    """EP_RT_SKIP_TOPOLOGY_CHECK=1: do not require NVLink between the GPUs of one node."""
    return _flag("EP_RT_SKIP_TOPOLOGY_CHECK", False)


def ranks_per_node() -> int | None:
    """EP_RT_RANKS_PER_NODE=g: treat each block of g consecutive ranks of one host as a node (emulated nodes:
    traffic between them takes the inter-node path). Unset: the ranks of one host form a node."""
    value = os.environ.get("EP_RT_RANKS_PER_NODE")
    if value is None or value.strip() == "":
        return None
    try:
        g = int(value)
    except ValueError:
        raise ValueError(f"EP_RT_RANKS_PER_NODE must be a positive int, got {value!r}") from None
    if g <= 0:
        raise ValueError(f"EP_RT_RANKS_PER_NODE must be a positive int, got {value!r}")
    return g


def topk_idx_bits() -> int:
    """EP_RT_TOPK_IDX_BITS=32|64 (default 64): the width of ep_rt.topk_idx_t, the type of recv_topk_idx (DeepEP
    picks it at build time, TOPK_IDX_BITS). Read once, when ep_rt is imported."""
    value = (os.environ.get("EP_RT_TOPK_IDX_BITS") or "64").strip()
    if value not in ("32", "64"):
        raise ValueError(f"EP_RT_TOPK_IDX_BITS must be 32 or 64, got {value!r}")
    return int(value)


def nvshmem_debug(environ=None) -> bool:
    """EP_RT_NVSHMEM_DEBUG=1: keep DeepEP's NVSHMEM transport settings on one host (IBGDA tried, so its "init
    failed" messages show) and set NVSHMEM_DEBUG=WARN unless it is set."""
    return _flag("EP_RT_NVSHMEM_DEBUG", False, environ)


REMOTE_TRANSPORTS = ("ibgda", "ibrc", "ucx", "libfabric")


def remote_transport(environ=None) -> str | None:
    """EP_RT_REMOTE_TRANSPORT=ibgda|ibrc|ucx|libfabric: what NVSHMEM uses for peers NVLink does not reach (unset:
    IBGDA, as DeepEP, and on one host with NVLink no remote transport at all). transport.network_settings maps it
    onto NVSHMEM_IB_ENABLE_IBGDA and NVSHMEM_REMOTE_TRANSPORT."""
    value = (os.environ if environ is None else environ).get("EP_RT_REMOTE_TRANSPORT", "").strip().lower()
    if not value:
        return None
    if value not in REMOTE_TRANSPORTS:
        from .errors import NetworkSettingError

        raise NetworkSettingError(
            f"EP_RT_REMOTE_TRANSPORT must be one of {', '.join(REMOTE_TRANSPORTS)} (or unset), got {value!r}"
        )
    return value


def hca_list_per_local_rank(environ=None) -> str | None:
    """EP_RT_HCA_LIST_PER_LOCAL_RANK: the NIC of each local rank (comma-separated HCAs in local-rank order, or
    NIC lists separated by ';'), or "auto" (each GPU the closest NIC, distinct where possible); becomes this
    process's NVSHMEM_HCA_LIST (UCX: UCX_NET_DEVICES). Unset: NVSHMEM chooses."""
    value = (os.environ if environ is None else environ).get("EP_RT_HCA_LIST_PER_LOCAL_RANK", "").strip()
    return value or None


def nvshmem_host_library() -> str | None:
    """EP_RT_NVSHMEM_HOST_LIBRARY: the path of the libnvshmem_host.so.3 to load, instead of the one torch already
    loaded or the installed nvidia.nvshmem package's (e.g. a cu12 library beside a cu13 torch, to run the cu12
    cubins; its flavour is still told from the distribution that installed it, which must be importable)."""
    return os.environ.get("EP_RT_NVSHMEM_HOST_LIBRARY") or None
