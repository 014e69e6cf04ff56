"""Memory samples for soaks: torch's allocator, the device's free memory, this process's NVML-reported GPU memory
and its host RSS. A soak samples every so many rounds and checks there is no growth after the warm-up."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sample:
    round: int
    torch_allocated: int   # bytes held by torch's caching allocator for tensors
    device_used: int       # total - free on this device (every process on it)
    nvml_process: int      # this process's GPU memory as NVML reports it (0 if NVML cannot tell)
    host_rss: int          # resident set size of this process


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


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


def sample(round_: int) -> Sample:
    dev = torch.cuda.current_device()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info(dev)
    return Sample(round_, torch.cuda.memory_allocated(dev), total - free, _nvml_process(dev), _rss())


def growth(samples: list[Sample], warmup_fraction: float = 0.2) -> dict:
    """Largest rise of each measure over its value at the end of the warm-up (bytes; negative is a fall)."""
    start = samples[min(len(samples) - 1, int(len(samples) * warmup_fraction))]
    later = [s for s in samples if s.round >= start.round]
    return {name: max(getattr(s, name) for s in later) - getattr(start, name)
            for name in ("torch_allocated", "device_used", "nvml_process", "host_rss")}


# Allowed rises after the warm-up: allocator rounding and Python's heap wander a little; a leak of one buffer or
# one tensor per call grows without bound over thousands of rounds.
LIMITS = {"torch_allocated": 64 << 20, "device_used": 256 << 20, "nvml_process": 256 << 20, "host_rss": 256 << 20}


def leaks(samples: list[Sample]) -> list[str]:
    g = growth(samples)
    return [f"{k} grew by {v / 2**20:.1f} MiB after the warm-up (limit {LIMITS[k] / 2**20:.0f})"
            for k, v in g.items() if v > LIMITS[k]]
