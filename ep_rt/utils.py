"""deep_ep.utils's public names, for code that imports them from there: EventHandle and EventOverlap
(ep_rt.events), and check_nvlink_connections with DeepEP's meaning, built on ep_rt's Topology."""

from __future__ import annotations

import torch

from .errors import TopologyError
from .events import EventHandle, EventOverlap
from .runtime import driver
from .transport.topology import Topology, nvlink_problems

__all__ = ["EventHandle", "EventOverlap", "check_nvlink_connections"]


def check_nvlink_connections(group) -> None:
    """Collective over `group`, as DeepEP's: only PCIe GPUs are checked (SXM parts such as H100/H200 SXM always
    have NVLink between all GPUs of a node, so nothing is done for them). PCIe GPUs have NVLink bridges between
    pairs at most, so the group may have at most 2 ranks, and every pair of GPUs of this host in the group must be
    NVLink peers (NVML, by PCI bus id). Raises TopologyError where DeepEP asserts. ep_rt's Buffer runs its own,
    stricter check (every node, every GPU kind)."""
    if "PCIE" not in torch.cuda.get_device_name():
        return
    import torch.distributed as dist

    if dist.get_world_size(group) > 2:
        raise TopologyError(
            f"PCIe GPUs have NVLink between pairs at most, so a group of PCIe GPUs may have at most 2 "
            f"ranks; this one has {dist.get_world_size(group)}"
        )
    topo = Topology.gather(group, driver.pci_bus_id(torch.cuda.current_device()))
    mine = [b for h, b in zip(topo.hosts, topo.bus_ids) if h == topo.hosts[topo.rank]]
    problems = nvlink_problems(mine)
    if problems:
        raise TopologyError("these PCIe GPUs are not connected by NVLink: " + "; ".join(problems))
