"""What `python -m ep_rt doctor` looks at, behind one object: every method reads the system (files, libraries,
NVML, the CUDA driver, torch) and returns plain data or raises. The checks (doctor_checks) take it as an argument,
so the CPU tests give them a stand-in."""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import os
import platform
from pathlib import Path


class System:
    # ---- packages ------------------------------------------------------------------------------
    def python_version(self) -> str:
        return platform.python_version()

    def package_version(self, name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def torch_info(self) -> dict:
        import torch

        return {"version": torch.__version__, "cuda": torch.version.cuda}

    # ---- driver and GPUs -----------------------------------------------------------------------
    def nvml_driver_version(self) -> str:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()

    def cuda_driver_version(self) -> tuple[int, int]:
        """The CUDA version the installed driver supports, e.g. (13, 0); needs no GPU context."""
        from ..runtime import driver

        v = driver.driver_version()
        return v // 1000, (v % 1000) // 10

    def nvshmem_flavour(self) -> str | None:
        """cu12 / cu13: the distribution that installed the NVSHMEM host library, if one did."""
        from ..transport import nvshmem

        try:
            return nvshmem.host_flavour()
        except Exception:  # no NVSHMEM installed: nothing to tell
            return None

    def gpus(self) -> list[dict]:
        """Every GPU torch sees: name, arch, SMs, PCI bus id."""
        import torch

        from ..runtime import driver

        out = []
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            p = torch.cuda.get_device_properties(i)
            out.append(
                {
                    "index": i,
                    "name": p.name,
                    "arch": f"sm_{p.major}{p.minor}",
                    "sms": p.multi_processor_count,
                    "bus_id": driver.pci_bus_id(i),
                }
            )
        return out

    def gpudirect_rdma(self, index: int) -> dict:
        """The driver's GPUDirect RDMA attributes of GPU `index` (runtime.driver.gpudirect_rdma_attributes)."""
        from ..runtime import driver

        return driver.gpudirect_rdma_attributes(index)

    def host_memory(self, index: int) -> dict:
        """The driver's host-memory attributes of GPU `index` (runtime.driver.host_memory_attributes)."""
        from ..runtime import driver

        return driver.host_memory_attributes(index)

    def nvlink(self, bus_ids: list[str]) -> dict:
        """{"p2p": {(a, b): NVLink P2P ok?}, "links": {bus id: active NVLinks}} by NVML, for these GPUs."""
        import pynvml

        pynvml.nvmlInit()
        try:
            handles = {b: pynvml.nvmlDeviceGetHandleByPciBusId(b) for b in bus_ids}
            p2p = {
                (a, b): pynvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                == pynvml.NVML_P2P_STATUS_OK
                for a in bus_ids
                for b in bus_ids
                if a != b
            }
            links = {}
            for b, h in handles.items():
                active = 0
                for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                    try:
                        active += pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED
                    except pynvml.NVMLError:
                        break  # past this GPU's links
                links[b] = active
            return {"p2p": p2p, "links": links}
        finally:
            pynvml.nvmlShutdown()

    # ---- cubins and NVSHMEM --------------------------------------------------------------------
    def manifest(self) -> tuple[Path, dict]:
        from ..runtime import modules

        return modules.cubin_root(), modules.manifest()

    def verify_cubin(self, root: Path, entry: dict) -> None:
        from ..runtime import modules

        modules.read_verified(root, entry)

    def nvshmem_host_version(self) -> str:
        from ..transport import nvshmem

        return nvshmem.host_version()

    def nvshmem_lib_dir(self) -> Path:
        from ..transport import nvshmem

        return nvshmem.library_path().parent

    # ---- the machine ---------------------------------------------------------------------------
    def find_library(self, name: str) -> str | None:
        return ctypes.util.find_library(name)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text(errors="replace")
        except OSError:
            return None

    def kernel_release(self) -> str:
        return platform.release()

    def environ(self) -> dict:
        return dict(os.environ)
