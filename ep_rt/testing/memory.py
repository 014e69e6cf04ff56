"""Memory samples for soaks: torch's allocator, ep_rt's own device and pinned host allocations, this process's host
RSS, and (reported, checked only when the process has the GPU to itself) the device's used memory and NVML's count
for the process. A soak samples every so many rounds and checks there is no growth after the warm-up.

Device-wide used memory is no leak measure when ranks share a GPU: it counts the other processes, and torch's
caching allocator reserves segments it does not give back; torch_allocated and ep_rt's counters are per process."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sample:
    round: int
    torch_allocated: int  # bytes held by torch's caching allocator for tensors
    device_used: int  # total - free on this device (every process on it)
    nvml_process: int  # this process's GPU memory as NVML reports it (0 if NVML cannot tell)
    host_rss: int  # resident set size of this process
    ep_rt_device: int = 0  # device memory ep_rt allocated through runtime.driver and holds
    ep_rt_host: int = 0  # pinned host memory ep_rt allocated and holds
    open_fds: int = 0  # this process's open file descriptors
    cuda_events: int = 0  # torch.cuda.Event objects alive in this process


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: not counted
        return 0


def cuda_events() -> int:
    """torch.cuda.Event objects alive (the garbage collector tracks them; a scan takes tens of milliseconds)."""
    import gc
    import warnings

    event = torch.cuda.Event
    with warnings.catch_warnings():  # (isinstance wakes deprecated lazy objects, which warn)
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, event))


def _nvml_process(device_index: int) -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            bus = torch.cuda.get_device_properties(device_index).pci_bus_id
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == os.getpid():
                    return int(p.usedGpuMemory or 0)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML without process accounting (containers): the other samples still count
        return 0
    return 0


def sample(round_: int, counts: bool = False) -> Sample:
    """counts: also count open file descriptors and live CUDA events (the event scan walks every Python object)."""
    dev = torch.cuda.current_device()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info(dev)
    from ..runtime import driver

    live = driver.live_bytes()
    return Sample(
        round_,
        torch.cuda.memory_allocated(dev),
        total - free,
        _nvml_process(dev),
        _rss(),
        live["device"],
        live["host"],
        open_fds() if counts else 0,
        cuda_events() if counts else 0,
    )


PER_PROCESS = ("torch_allocated", "ep_rt_device", "ep_rt_host", "host_rss", "open_fds", "cuda_events")
DEVICE_WIDE = ("device_used", "nvml_process")


def growth(samples: list[Sample], warmup_fraction: float = 0.2) -> dict:
    """Largest rise of each measure over its value at the end of the warm-up (bytes; negative is a fall)."""
    start = samples[min(len(samples) - 1, int(len(samples) * warmup_fraction))]
    later = [s for s in samples if s.round >= start.round]
    return {name: max(getattr(s, name) for s in later) - getattr(start, name) for name in PER_PROCESS + DEVICE_WIDE}


# Allowed rises after the warm-up: allocator rounding and Python's heap wander a little; a leak of one buffer or
# one tensor per call grows without bound over thousands of rounds.
LIMITS = {
    "torch_allocated": 64 << 20,
    "ep_rt_device": 0,
    "ep_rt_host": 0,
    "host_rss": 256 << 20,
    "device_used": 256 << 20,
    "nvml_process": 256 << 20,
    "open_fds": 0,
    "cuda_events": 0,
}


def leaks(samples: list[Sample], gpu_shared: bool | None = None, limits: dict | None = None) -> list[str]:
    """Measures that grew past their limit (LIMITS, or the caller's `limits` where given); device-wide ones only
    when this process has its GPU to itself."""
    if gpu_shared is None:
        import torch.distributed as dist

        gpu_shared = dist.is_initialized() and dist.get_world_size() > torch.cuda.device_count()
    names = PER_PROCESS if gpu_shared else PER_PROCESS + DEVICE_WIDE
    g, limit = growth(samples), {**LIMITS, **(limits or {})}
    return [
        f"{k} grew by {g[k]} after the warm-up (limit {limit[k]})"
        if k in COUNTS
        else f"{k} grew by {g[k] / 2**20:.1f} MiB after the warm-up (limit {limit[k] / 2**20:.0f})"
        for k in names
        if g[k] > limit[k]
    ]


COUNTS = ("open_fds", "cuda_events")  # numbers, not bytes
