"""NVSHMEM from pure Python: ctypes on the host library torch already loads (nvidia-nvshmem-cu12 or -cu13).

`nvshmem_init*` are inline header functions, so initialisation goes through the exported pieces:
rank 0 makes a unique id, the group broadcasts it, every rank fills an init-attribute struct with
`nvshmemx_set_attr_uniqueid_args`, sets the struct versions the inline helpers would set, and calls
`nvshmemx_hostlib_init_attr`. NVSHMEM-linked cubins must be registered with `nvshmemx_cumodule_init`
before their first launch. One initialisation per process, reference-counted across Buffers. Whether the host
library can run a cubin's device code is NVSHMEM's version rule (nvshmem_dist.compatibility_problem).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch.distributed as dist

from ..errors import EpRtError
from . import network_settings, nvshmem_dist

_UNIQUEID_BYTES, _ATTR_BYTES = 128, 144
_INIT_WITH_UNIQUEID = 1 << 3
# Offsets of the version fields in nvshmemx_init_attr_v1 (int version; void* mpi_comm; init_args {int version;
# uniqueid_args {int version; ...}}): attr.version, attr.args.version, attr.args.uid_args.version.
_ATTR_VERSION_FIELDS = ((0, (1 << 16) + 144), (16, (1 << 16) + 128), (24, (1 << 16) + 24))

_state = {"lib": None, "users": 0, "plan": None}


def library_path() -> Path:
    """The host library already in the process (torch's), else the one of the installed nvidia.nvshmem package."""
    loaded = nvshmem_dist.loaded_library()
    if loaded is not None:
        return loaded
    hint = nvshmem_dist.install_hint(nvshmem_dist.torch_flavour())
    try:
        import nvidia.nvshmem as pkg
    except ImportError:
        raise EpRtError(f"no NVSHMEM host library (the nvidia.nvshmem package is not installed): {hint}") from None
    base = Path(list(pkg.__path__)[0]) / "lib" / nvshmem_dist.HOST_LIBRARY
    if not base.is_file():
        raise EpRtError(f"NVSHMEM host library not found at {base}: {hint}")
    return base


def host_flavour() -> str | None:
    """cu12 / cu13: the distribution that installed the host library (None if none can be told)."""
    return nvshmem_dist.library_flavour(library_path())


def _lib():
    if _state["lib"] is None:
        lib = ctypes.CDLL(str(library_path()), mode=ctypes.RTLD_GLOBAL)
        lib.nvshmem_align.restype = ctypes.c_void_p
        lib.nvshmem_align.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
        lib.nvshmem_ptr.restype = ctypes.c_void_p
        lib.nvshmem_ptr.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.nvshmem_free.argtypes = [ctypes.c_void_p]
        lib.nvshmemx_cumodule_init.argtypes = [ctypes.c_void_p]
        lib.nvshmemx_cumodule_finalize.argtypes = [ctypes.c_void_p]
        _state["lib"] = lib
    return _state["lib"]


def host_version() -> str:
    major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _lib().nvshmemx_vendor_get_version_info(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    return f"{major.value}.{minor.value}.{patch.value}"


def set_environment(num_qps_per_rank: int, allow_nvlink: bool, allow_mnnvl: bool, single_host: bool,
                    topology=None) -> int:
    """DeepEP's NVSHMEM settings and the network settings (transport.network_settings: what each variable is, who
    wins, what is checked), written into os.environ; returns the QP depth. When every rank is on one host and NVLink
    is allowed, no remote transport is needed: none is asked for, IBGDA included (NVSHMEM would try it anyway and
    print "init failed for transport: IBGDA" on machines without InfiniBand). EP_RT_NVSHMEM_DEBUG=1 keeps DeepEP's
    settings there too, so those messages show again, and turns on NVSHMEM's warnings. `topology` (the Buffer's)
    places this process on its host for EP_RT_HCA_LIST_PER_LOCAL_RANK; without it LOCAL_RANK does."""
    return apply_plan(num_qps_per_rank, allow_nvlink, allow_mnnvl, single_host, topology).qp_depth


def apply_plan(num_qps_per_rank: int, allow_nvlink: bool, allow_mnnvl: bool, single_host: bool,
               topology=None) -> network_settings.Plan:
    place = network_settings.HostPlace.from_topology(topology) if topology is not None else None
    plan = network_settings.plan(num_qps_per_rank, allow_nvlink, allow_mnnvl, single_host, place=place)
    network_settings.apply(plan)
    _state["plan"] = plan
    return plan


def check_compatible(device_version: str, ibgda: bool) -> None:
    """Raise unless the host library can run device code linked against NVSHMEM `device_version`."""
    version = host_version()
    problem = nvshmem_dist.compatibility_problem(version, device_version, ibgda)
    if problem is None:
        return
    path = library_path()
    flavour = nvshmem_dist.library_flavour(path)
    package = nvshmem_dist.PACKAGES.get(flavour, "nvidia-nvshmem-cu12/-cu13")
    raise EpRtError(f"NVSHMEM host library {version} ({package}, {path}) cannot run the low-latency cubin, which is "
                    f"linked against NVSHMEM device library {device_version}: {problem}. Install "
                    f"'{package}{nvshmem_dist.host_range(device_version, ibgda)}' (the extras: "
                    f"{nvshmem_dist.install_hint(flavour)}).")


def init(group, device_version: str, ibgda: bool) -> None:
    """Initialise NVSHMEM over the process group (PE = group rank); no-op if this process already did."""
    if _state["users"] > 0:
        _state["users"] += 1
        return
    lib = _lib()
    check_compatible(device_version, ibgda)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    uid = ctypes.create_string_buffer(_UNIQUEID_BYTES)
    if rank == 0:
        ret = lib.nvshmemx_get_uniqueid(uid)
        if ret != 0:
            raise EpRtError(f"nvshmemx_get_uniqueid failed ({ret})")
    shared = [uid.raw if rank == 0 else None]
    dist.broadcast_object_list(shared, src=dist.get_global_rank(group, 0), group=group)
    uid = ctypes.create_string_buffer(shared[0], _UNIQUEID_BYTES)
    attr = ctypes.create_string_buffer(_ATTR_BYTES)
    ret = lib.nvshmemx_set_attr_uniqueid_args(rank, size, uid, attr)
    if ret != 0:
        raise EpRtError(f"nvshmemx_set_attr_uniqueid_args failed ({ret})")
    for offset, value in _ATTR_VERSION_FIELDS:
        ctypes.c_int.from_buffer(attr, offset).value = value
    ret = lib.nvshmemx_hostlib_init_attr(_INIT_WITH_UNIQUEID, attr)
    if ret != 0:
        raise EpRtError(f"NVSHMEM initialisation failed ({ret}); see NVSHMEM's messages above")
    _state["users"] = 1


def finalize() -> None:
    if _state["users"] == 0:
        return
    _state["users"] -= 1
    if _state["users"] == 0:
        _lib().nvshmemx_hostlib_finalize()


def align(nbytes: int) -> int:
    ptr = _lib().nvshmem_align(128, nbytes)
    if not ptr:
        raise EpRtError(f"nvshmem_align({nbytes}) failed: not enough symmetric memory")
    return ptr


def free(ptr: int) -> None:
    _lib().nvshmem_free(ctypes.c_void_p(ptr))


def peer_ptr(sym: int, pe: int) -> int:
    """The address of `sym` on PE `pe` mapped into this process (NVLink peers), or 0."""
    return _lib().nvshmem_ptr(ctypes.c_void_p(sym), pe) or 0


def barrier_all() -> None:
    _lib().nvshmem_barrier_all()


def register_module(module) -> None:
    ret = _lib().nvshmemx_cumodule_init(ctypes.c_void_p(int(module)))
    if ret != 0:
        raise EpRtError(f"nvshmemx_cumodule_init failed ({ret})")


def unregister_module(module) -> None:
    _lib().nvshmemx_cumodule_finalize(ctypes.c_void_p(int(module)))


class NvshmemSession:
    """This Buffer's use of the process's NVSHMEM world (one world for LL and internode HT, PE = group rank):
    DeepEP's environment, the reference-counted initialisation, and the NVSHMEM-linked modules it registered.
    destroy(collective) unregisters them and finalizes; without `collective` (a failed or abandoned Buffer, whose
    peers may never come) nothing collective runs and the world is left to process exit."""

    def __init__(self, group, device_version: str, num_qps_per_rank: int, allow_nvlink: bool,
                 allow_mnnvl: bool, single_host: bool, topology=None):
        self.plan = apply_plan(num_qps_per_rank, allow_nvlink, allow_mnnvl, single_host, topology)
        self.qp_depth = self.plan.qp_depth
        # The host library's version rule is stricter when IBGDA carries the peers NVLink does not reach.
        init(group, device_version, ibgda=self.plan.ibgda_peers)
        self.modules: list = []
        self.live = True

    def register(self, module) -> None:
        """Register a loaded NVSHMEM-linked module (runtime.modules.LoadedModule) before its first launch."""
        register_module(module.handle)
        self.modules.append(module)

    def destroy(self, collective: bool) -> None:
        from ..runtime import driver

        if not self.live:
            return
        self.live = False
        if not collective:
            return
        for m in self.modules:
            unregister_module(m.handle)
            driver.module_unload(m.handle)
        self.modules = []
        finalize()
