"""NVLink check with NVML: every pair of distinct GPUs used by the ranks of one node must be NVLink peers."""
from __future__ import annotations

from .errors import TopologyError


def nvlink_problems(bus_ids: list[str]) -> list[str]:
    """Pairs of distinct GPUs (by PCI bus id) that NVML does not report as NVLink-connected."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = {b: pynvml.nvmlDeviceGetHandleByPciBusId(b) for b in sorted(set(bus_ids))}
        problems = []
        ids = sorted(handles)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                status = pynvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if status != pynvml.NVML_P2P_STATUS_OK:
                    problems.append(f"{a} <-> {b} (NVML P2P NVLink status {status})")
        return problems
    finally:
        pynvml.nvmlShutdown()


def require_nvlink(bus_ids_by_rank: list[str]) -> None:
    problems = nvlink_problems(bus_ids_by_rank)
    if problems:
        raise TopologyError(
            "the GPUs of these ranks are not connected by NVLink, which ep_rt's intranode kernels need: "
            + "; ".join(problems) + ". Set EP_RT_SKIP_TOPOLOGY_CHECK=1 to try anyway (PCIe P2P, slow).")
