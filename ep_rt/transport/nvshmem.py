"""NVSHMEM from pure Python: ctypes on the host library torch already loads (nvidia-nvshmem-cu12 or -cu13).

`nvshmem_init*` are inline header functions, so initialisation goes through the exported pieces: the root of each
world (nvshmem_world: rank 0 for a world of all ranks, the ranks of node 0 for the rail worlds) makes a unique id, one
all_gather_object over the group shares them, every rank fills an init-attribute struct with
`nvshmemx_set_attr_uniqueid_args` (its PE and the world's size), sets the struct versions the inline helpers would
set, and calls `nvshmemx_hostlib_init_attr`. NVSHMEM-linked cubins must be registered with `nvshmemx_cumodule_init`
before their first launch. One initialisation per process, reference-counted across Buffers that can share it
(nvshmem_world.reuse). Whether the host library can run a cubin's device code is NVSHMEM's version rule
(nvshmem_dist.compatibility_problem). Everything that can fail locally runs in prepare(), before any collective.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from .. import env
from ..errors import EpRtError
from . import collective, network_settings, nvshmem_dist, nvshmem_world
from .nvshmem_deadline import CollectiveDeadline

_UNIQUEID_BYTES, _ATTR_BYTES = 128, 144
_INIT_WITH_UNIQUEID = 1 << 3
# Offsets of the version fields in nvshmemx_init_attr_v1 (int version; void* mpi_comm; init_args {int version;
# uniqueid_args {int version; ...}}): attr.version, attr.args.version, attr.args.uid_args.version.
_ATTR_VERSION_FIELDS = ((0, (1 << 16) + 144), (16, (1 << 16) + 128), (24, (1 << 16) + 24))

# users: Buffers sharing the process's one NVSHMEM world; world / identity: that world and (global ranks of the group
# that made it, node size), which a later Buffer must match (nvshmem_world.reuse).
_state = {"lib": None, "users": 0, "plan": None, "world": None, "identity": None, "rank": None}


def library_path() -> Path:
    """EP_RT_NVSHMEM_HOST_LIBRARY if set; else the host library already in the process (torch's); else the one of
    the installed nvidia.nvshmem package."""
    forced = env.nvshmem_host_library()
    if forced is not None:
        path = Path(forced)
        if not path.is_file():
            raise EpRtError(f"EP_RT_NVSHMEM_HOST_LIBRARY={forced!r} is not a file")
        return path
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


def set_environment(
    num_qps_per_rank: int, allow_nvlink: bool, allow_mnnvl: bool, single_host: bool, topology=None
) -> int:
    """DeepEP's NVSHMEM settings and the network settings (transport.network_settings: what each variable is, who
    wins, what is checked), written into os.environ; returns the QP depth. When every rank is on one host and NVLink
    is allowed, no remote transport is needed: none is asked for, IBGDA included (NVSHMEM would try it anyway and
    print "init failed for transport: IBGDA" on machines without InfiniBand). EP_RT_NVSHMEM_DEBUG=1 keeps DeepEP's
    settings there too, so those messages show again, and turns on NVSHMEM's warnings. `topology` (the Buffer's)
    places this process on its host for EP_RT_HCA_LIST_PER_LOCAL_RANK; without it LOCAL_RANK does."""
    return apply_plan(num_qps_per_rank, allow_nvlink, allow_mnnvl, single_host, topology).qp_depth


def apply_plan(
    num_qps_per_rank: int, allow_nvlink: bool, allow_mnnvl: bool, single_host: bool, topology=None
) -> network_settings.Plan:
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
    raise EpRtError(
        f"NVSHMEM host library {version} ({package}, {path}) cannot run the low-latency cubin, which is "
        f"linked against NVSHMEM device library {device_version}: {problem}. Install "
        f"'{package}{nvshmem_dist.host_range(device_version, ibgda)}' (the extras: "
        f"{nvshmem_dist.install_hint(flavour)})."
    )


def world_for(wanted: nvshmem_world.NvshmemWorld, identity: tuple, topology) -> nvshmem_world.NvshmemWorld:
    """The world a new Buffer uses: `wanted` when this process has none yet, else the live one if it can serve
    (nvshmem_world.reuse; raises EpRtError saying what is supported). Local: no collective."""
    if _state["users"] == 0:
        return wanted
    return nvshmem_world.reuse(_state["world"], _state["identity"], wanted, identity, topology)


def init(group, world: nvshmem_world.NvshmemWorld, identity: tuple, topology) -> nvshmem_world.NvshmemWorld:
    """Join `world` over the process group (collective: every rank of the group calls it, whatever world it joins);
    returns the world joined (the live one when this process already has one, see world_for). The unique ids come
    from one all_gather_object over the group, as DeepEP exchanges them: rank 0 makes the full world's, every rank
    of node 0 its rail's (nvshmem_world.root_ranks), and every rank takes its world root's."""
    if _state["users"] > 0:
        joined = world_for(world, identity, topology)
        _state["users"] += 1
        return joined
    lib = _lib()
    rank = collective.rank(group)
    mine = None
    if rank in nvshmem_world.root_ranks(world.kind, topology):
        uid = ctypes.create_string_buffer(_UNIQUEID_BYTES)
        ret = lib.nvshmemx_get_uniqueid(uid)
        mine = uid.raw if ret == 0 else ("error", f"nvshmemx_get_uniqueid failed ({ret}) on rank {rank}")
    shared = collective.all_gather_object(group, mine)  # a root's failure is seen by every rank, not only its own
    chosen = shared[world.root]
    if not isinstance(chosen, bytes):
        raise EpRtError(chosen[1] if isinstance(chosen, tuple) else f"rank {world.root} sent no NVSHMEM unique id")
    uid = ctypes.create_string_buffer(chosen, _UNIQUEID_BYTES)
    attr = ctypes.create_string_buffer(_ATTR_BYTES)
    ret = lib.nvshmemx_set_attr_uniqueid_args(world.my_pe, world.npes, uid, attr)
    if ret != 0:
        raise EpRtError(f"nvshmemx_set_attr_uniqueid_args failed ({ret})")
    for offset, value in _ATTR_VERSION_FIELDS:
        ctypes.c_int.from_buffer(attr, offset).value = value
    _state["rank"] = rank
    turns = nvshmem_world.start_turns(world.kind, topology)
    with _deadline("NVSHMEM's start (nvshmemx_hostlib_init_attr)"):
        if turns == 1:
            ret = lib.nvshmemx_hostlib_init_attr(_INIT_WITH_UNIQUEID, attr)
        else:  # one rail after the other (emulated nodes; see start_turns); every rank takes every turn's barrier
            for turn in range(turns):
                if turn == topology.local_rank:
                    ret = lib.nvshmemx_hostlib_init_attr(_INIT_WITH_UNIQUEID, attr)
                collective.barrier(group)
    if ret != 0:
        raise EpRtError(f"NVSHMEM initialisation failed ({ret}); see NVSHMEM's messages above")
    _state.update(users=1, world=world, identity=identity)
    return world


def finalize() -> None:
    if _state["users"] == 0:
        return
    _state["users"] -= 1
    if _state["users"] == 0:
        with _deadline("NVSHMEM's finalize"):
            _lib().nvshmemx_hostlib_finalize()
        _state.update(world=None, identity=None)


def _deadline(what: str) -> CollectiveDeadline:
    """The watchdog of one collective NVSHMEM host call (nvshmem_deadline: past EP_RT_NVSHMEM_TIMEOUT_S the process
    ends with a message instead of waiting forever for a peer that is gone)."""
    return CollectiveDeadline(what, _state["rank"])


def align(nbytes: int) -> int:
    with _deadline(f"a symmetric allocation of {nbytes} bytes (nvshmem_align, collective)"):
        ptr = _lib().nvshmem_align(128, nbytes)
    if not ptr:
        raise EpRtError(f"nvshmem_align({nbytes}) failed: not enough symmetric memory")
    return ptr


def free(ptr: int) -> None:
    with _deadline("nvshmem_free (collective)"):
        _lib().nvshmem_free(ctypes.c_void_p(ptr))


def peer_ptr(sym: int, pe: int) -> int:
    """The address of `sym` on PE `pe` mapped into this process (NVLink peers), or 0."""
    return _lib().nvshmem_ptr(ctypes.c_void_p(sym), pe) or 0


def barrier_all() -> None:
    with _deadline("nvshmem_barrier_all"):
        _lib().nvshmem_barrier_all()


def register_module(module) -> None:
    ret = _lib().nvshmemx_cumodule_init(ctypes.c_void_p(int(module)))
    if ret != 0:
        raise EpRtError(f"nvshmemx_cumodule_init failed ({ret})")


def unregister_module(module) -> None:
    _lib().nvshmemx_cumodule_finalize(ctypes.c_void_p(int(module)))


@dataclass(frozen=True)
class Preparation:
    """What a Buffer's NVSHMEM session will do, worked out locally before any collective (so that a failure here is
    shipped to every rank by transport.agreement instead of leaving the peers in NVSHMEM's bootstrap)."""

    plan: network_settings.Plan
    world: nvshmem_world.NvshmemWorld  # the world the session will use
    identity: tuple  # (global ranks of the group, node size)
    fresh: bool  # this process initialises NVSHMEM (no world is live)

    def shared_values(self) -> dict:
        """The values every rank must agree on (transport.agreement)."""
        values = {f"NVSHMEM setting {k}": v for k, v in network_settings.shared_settings(self.plan).items()}
        values["NVSHMEM world"] = (
            ("initialise " if self.fresh else "join the live ") + self.world.kind + f" world of {self.world.npes} PEs"
        )
        values["NVSHMEM host library"] = host_version()
        return values


def prepare(
    group,
    topology,
    wanted: nvshmem_world.NvshmemWorld,
    device_version: str,
    num_qps_per_rank: int,
    allow_nvlink: bool,
    allow_mnnvl: bool,
) -> Preparation:
    """Local (no collective; may raise): the environment plan (checked, not applied yet), the world to use, and
    NVSHMEM's version rule for the cubin linked against `device_version`."""
    place = network_settings.HostPlace.from_topology(topology)
    plan = network_settings.plan(num_qps_per_rank, allow_nvlink, allow_mnnvl, topology.single_host, place=place)
    identity = (tuple(collective.global_rank(group, r) for r in range(topology.num_ranks)), topology.node_size)
    world = world_for(wanted, identity, topology)
    check_compatible(device_version, plan.ibgda_peers)  # the rule is stricter where IBGDA carries remote peers
    return Preparation(plan, world, identity, _state["users"] == 0)


class NvshmemSession:
    """This Buffer's use of the process's NVSHMEM world (nvshmem_world: a rail world for high-throughput-only
    Buffers, all ranks with low_latency_mode): DeepEP's environment, the reference-counted initialisation, and the
    NVSHMEM-linked modules it registered. destroy(collective) unregisters them and finalizes; without `collective`
    (a failed or abandoned Buffer, whose peers may never come) nothing collective runs and the world is left to
    process exit.

    For the kernels: `world` (nvshmem_world.NvshmemWorld), and `pe_base`, `pe_stride` (ints): the PE of the rank with
    this rank's local index on node n is pe_base + n * pe_stride ((0, 1) in a rail world, (local index, G) in a
    full one).

    Its error_slot "nvshmem" is no ErrorRecords slot: the session is healthy only if every NVSHMEM user is
    (Buffer._release)."""

    error_slot = "nvshmem"

    def __init__(self, group, preparation: Preparation, topology):
        network_settings.apply(preparation.plan)
        _state["plan"] = self.plan = preparation.plan
        self.qp_depth = self.plan.qp_depth
        self.world = init(group, preparation.world, preparation.identity, topology)
        self.modules: list = []
        self.live = True

    @property
    def pe_base(self) -> int:
        return self.world.pe_base

    @property
    def pe_stride(self) -> int:
        return self.world.pe_stride

    def pe_of_rank(self, rank: int) -> int | None:
        """PE of group rank `rank` in this world, None where it is not a PE (node peers in a rail world)."""
        return self.world.pe_of_rank(rank)

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
