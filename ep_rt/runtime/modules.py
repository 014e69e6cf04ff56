"""Finding, verifying and loading the ahead-of-time compiled cubins.

The manifest (cubins/manifest.json, written by tools/build_cubins.py) is the contract: a kernel
family is found by (family, flavour, arch, variant) as runtime/choice.py decides from the GPU, the
driver and EP_RT_CUBIN_FLAVOUR; its sha256 is verified before loading, and a missing entry is an
error that lists what exists. Lookup order: $EP_RT_CUBIN_DIR, the installed wheel's package data
(ep_rt/cubins), then the source checkout's cubins/.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .. import env
from ..errors import CubinNotFoundError, CudaDriverError
from . import choice, driver
from .manifest import ManifestError, load_manifest
from .manifest import kernel_block as _kernel_block

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # ep_rt/


def candidate_dirs() -> list[Path]:
    dirs = []
    override = env.cubin_dir()
    if override:
        dirs.append(Path(override))
    dirs += [_PACKAGE_DIR / "cubins", _PACKAGE_DIR.parent / "cubins"]
    return dirs


def cubin_root() -> Path:
    """The first folder in lookup order that holds a manifest."""
    for d in candidate_dirs():
        if (d / "manifest.json").is_file():
            return d
    raise CubinNotFoundError("no cubins/manifest.json found; looked in: " + ", ".join(map(str, candidate_dirs())))


@functools.lru_cache(maxsize=None)
def _read_manifest(path: str) -> dict:
    try:
        return load_manifest(path)
    except ManifestError as e:
        raise CubinNotFoundError(str(e)) from None


def manifest() -> dict:
    return _read_manifest(str(cubin_root() / "manifest.json"))


def kernel_block(entry: dict, name: str) -> int:
    """The block size (threads) of kernel `name` as the manifest entry of its cubin records it (build_cubins.py reads
    it from the compiled kernel's __launch_bounds__): every Launcher takes its block from here."""
    try:
        return _kernel_block(entry, name)
    except ManifestError as e:
        raise CubinNotFoundError(str(e)) from None


def choose_entry(
    manifest: dict,
    family: str,
    device_index: int,
    aggressive: bool,
    nvshmem_flavour: str | None = None,
    chaos: bool | None = None,
    tma: bool | None = None,
    packed: bool | None = None,
) -> dict:
    """The manifest entry of `family` for this device, this driver and EP_RT_CUBIN_FLAVOUR (runtime/choice.py);
    `nvshmem_flavour` (cu12 / cu13) is the NVSHMEM host library's, for NVSHMEM-linked families, which get their
    chaos variant when `chaos` (default: EP_RT_CHAOS_TRANSPORT) says so; a family with a tma variant gets it when `tma`
    (default: EP_RT_TMA) says so; a family with a packed variant (low_latency) gets it when `packed` (default:
    EP_RT_LL_PACKED) says so."""
    if chaos is None:
        chaos = env.chaos_transport()
    if tma is None:
        tma = env.tma()
    if packed is None:
        packed = env.ll_packed()
    return choice.choose_entry(
        manifest,
        family,
        driver.compute_capability(device_index),
        aggressive,
        driver.driver_version(),
        env.cubin_flavour(),
        nvshmem_flavour,
        chaos,
        tma,
        packed,
    )


def read_verified(root: Path, entry: dict) -> bytes:
    path = root / entry["path"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CubinNotFoundError(f"the manifest lists {path} but the file is missing; reinstall ep_rt") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise CubinNotFoundError(f"{path} is corrupt or stale: sha256 {digest} != manifest {entry['sha256']}")
    return data


@dataclass
class LoadedModule:
    entry: dict
    handle: object
    functions: dict = field(default_factory=dict)

    def function(self, name: str):
        if name not in self.functions:
            if name not in self.entry["kernels"]:
                raise CubinNotFoundError(
                    f"kernel {name!r} is not in {self.entry['path']} (it has {self.entry['kernels']})"
                )
            self.functions[name] = driver.module_function(self.handle, name)
        return self.functions[name]

    def global_address(self, name: str) -> tuple[int, int]:
        """(device address, bytes) of one of the module's __device__ variables (the chaos build's counters)."""
        return driver.module_global(self.handle, name)


def requested_dynamic_smem(module: "LoadedModule", kernel: str) -> int:
    """The dynamic shared memory (bytes) kernel `kernel` asks its launches for: the u32 `<kernel>_dynamic_smem`
    that its source declares beside a path that needs it (a kernel that finds less at run time takes its plain
    path), or 0 when the module has no such symbol, as for every shipped kernel so far."""
    name = f"{kernel}_dynamic_smem"
    try:
        ptr, size = module.global_address(name)
    except CudaDriverError as e:
        if "CUDA_ERROR_NOT_FOUND" in str(e):
            return 0
        raise
    if size != 4:
        raise CubinNotFoundError(f"{module.entry['path']}: {name} has {size} bytes, expected a u32 (4)")
    return int.from_bytes(driver.memcpy_dtoh(ptr, 4), "little")


_lock = threading.Lock()
_modules: dict[tuple[int, str, bool], LoadedModule] = {}


def arch_of(device_index: int) -> str:
    """The device's own arch name (sm_90, sm_103); the cubin chosen may be for a lower minor (choice.py)."""
    return choice.arch_name(driver.compute_capability(device_index))


def load_family(device_index: int, family: str, aggressive: bool | None = None) -> LoadedModule:
    """Load (once per device and variant) the cubin of a kernel family into the device's primary context."""
    if aggressive is None:
        aggressive = env.aggressive_ptx()
    key = (device_index, family, aggressive)
    with _lock:
        if key not in _modules:
            driver.ensure_context(device_index)
            root = cubin_root()
            entry = choose_entry(manifest(), family, device_index, aggressive)
            if entry.get("needs_nvshmem"):
                raise CubinNotFoundError(
                    f"{family!r} is NVSHMEM-linked: load it once per NVSHMEM session with "
                    f"load_entry and register it with NVSHMEM"
                )
            _modules[key] = LoadedModule(entry, driver.module_load(read_verified(root, entry)))
        return _modules[key]


def load_entry(device_index: int, entry: dict) -> LoadedModule:
    """Load one manifest entry without caching (NVSHMEM-linked families, the cubin self-test)."""
    driver.ensure_context(device_index)
    return LoadedModule(entry, driver.module_load(read_verified(cubin_root(), entry)))
