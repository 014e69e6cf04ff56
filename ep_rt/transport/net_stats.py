"""The chaos build's cost mode (kernels_src/include/ep_rt/net.cuh): every network operation a module's kernels issue
is counted in the module's `ep_rt_net_stats`, and every quiet or fence of ep_rt's own is charged the time in
`ep_rt_net_sweep_ns`: what one sweep of every queue pair costs on IBGDA at the emulated size (an estimate, never
measured: docs/INTERNODE_DESIGN.md, "Performance model"). The real build has neither symbol: its operations are
what the model counts, and the chaos build's counts are how a GPU test holds the kernels to the model.
"""

from __future__ import annotations

import os

import torch

from ..errors import EpRtError
from .device_view import device_tensor

# The words of ep_rt_net_stats, in the order of net.cuh's EP_RT_NET_STAT_*.
STATS = ("put_signals", "signals", "quiets", "fences", "bytes", "charged_ns")
STAT_WORDS = 8
# One thread-scope sweep polls num_qps x (npes - 1) RC queue pairs and a DCI; the review behind issue 21 put
# ~360 queue pairs at 0.2-0.35 ms (testing/network_ops.py QP_POLL_US): the low end, per queue pair polled.
QP_POLL_NS = 200_000 / 360
DCIS = 1


def sweep_ns(num_qps: int, npes: int) -> int:
    """What the cost mode charges one quiet or fence in a world of `npes` PEs with `num_qps` queue pairs per peer."""
    return 0 if npes <= 1 else round((num_qps * (npes - 1) + DCIS) * QP_POLL_NS)


def is_chaos(entry: dict) -> bool:
    """A cubin of the test transport: the chaos variant, or the LL family's packed_chaos."""
    return entry.get("variant") in ("chaos", "packed_chaos")


class NetStats:
    """A chaos-variant module's counters, as a view of its device memory (reads and resets sync the device)."""

    def __init__(self, module, device: torch.device):
        if not is_chaos(module.entry):
            raise EpRtError(
                f"network operation counts exist in the chaos variant only (EP_RT_CHAOS_TRANSPORT=1); "
                f"this module is {module.entry['path']}"
            )
        ptr, size = module.global_address("ep_rt_net_stats")
        if size != STAT_WORDS * 8:
            raise EpRtError(f"{module.entry['path']}: ep_rt_net_stats has {size} bytes, expected {STAT_WORDS * 8}")
        self.words = device_tensor(ptr, (STAT_WORDS,), device, "<i8")
        sweep_ptr, _ = module.global_address("ep_rt_net_sweep_ns")
        self.sweep = device_tensor(sweep_ptr, (1,), device, "<i8")

    def set_sweep_ns(self, ns: int) -> None:
        self.sweep.fill_(int(ns))
        torch.cuda.synchronize(self.words.device)

    def read(self) -> dict:
        torch.cuda.synchronize(self.words.device)
        values = self.words.tolist()
        return {name: int(values[i]) for i, name in enumerate(STATS)}

    def reset(self) -> None:
        torch.cuda.synchronize(self.words.device)
        self.words.zero_()
        torch.cuda.synchronize(self.words.device)


def charged(module, device: torch.device, npes: int) -> "NetStats | None":
    """For a chaos-variant module: its counters, with each quiet charged a sweep of this world (num_qps from
    NVSHMEM_IBGDA_NUM_RC_PER_PE, as NVSHMEM reads it, else DeepEP's 24); None for any other module."""
    if not is_chaos(module.entry):
        return None
    stats = NetStats(module, device)
    stats.set_sweep_ns(sweep_ns(int(os.environ.get("NVSHMEM_IBGDA_NUM_RC_PER_PE") or 24), npes))
    return stats
