"""The NVSHMEM environment of a Buffer that initialises NVSHMEM (low-latency mode; internode high-throughput):
DeepEP V1's settings and the network settings around them, each checked, with the rule for who wins when the
user set the variable too.

The rule: DeepEP V1 (deep_ep/buffer.py, Buffer.__init__) overwrites some NVSHMEM variables unconditionally and
leaves the rest to the user. ep_rt writes the same ones; a user value there must agree with what ep_rt writes (a
different one raises NetworkSettingError naming the variable and the Buffer argument or ep_rt knob that sets it,
where DeepEP would silently overwrite it). Where DeepEP leaves a variable alone, the user's value wins, after a
range check. ep_rt's own knobs (EP_RT_REMOTE_TRANSPORT, EP_RT_HCA_LIST_PER_LOCAL_RANK) add what DeepEP has no input
for; a user value of a variable such a knob sets must agree with it too. Values ep_rt itself wrote earlier (an
earlier Buffer, in this process or the one that started it) are not the user's: they are recorded (RECORD) and
rewritten freely.

| setting | variables | who decides |
|---|---|---|
| queue pairs | NVSHMEM_IBGDA_NUM_RC_PER_PE = num_qps_per_rank | DeepEP (the Buffer argument) |
| | NVSHMEM_IB_NUM_RC_PER_DEVICE (IBRC) | user (NVSHMEM's default 1 kept, see IBRC_RC_NOTE) |
| | NVSHMEM_QP_DEPTH (default 1024) | user |
| transport | NVSHMEM_IB_ENABLE_IBGDA, NVSHMEM_REMOTE_TRANSPORT, NVSHMEM_LIBFABRIC_PROVIDER | EP_RT_REMOTE_TRANSPORT (default ibgda, DeepEP's) |
| service level / traffic class | NVSHMEM_IB_SL (0..15), NVSHMEM_IB_TRAFFIC_CLASS (0..255); UCX_IB_SL / UCX_IB_TRAFFIC_CLASS under UCX | user (DeepEP's README: NVSHMEM_IB_SL) |
| NIC per GPU | NVSHMEM_HCA_LIST (IBGDA, IBRC) or UCX_NET_DEVICES (UCX) of this process | EP_RT_HCA_LIST_PER_LOCAL_RANK, else user |
| ordering | NVSHMEM_IB_ENABLE_RELAXED_ORDERING (NVSHMEM's default, true) | user (see ORDERING_NOTE) |
| the rest of DeepEP's | NVSHMEM_DISABLE_P2P, NVSHMEM_MAX_TEAMS, NVSHMEM_DISABLE_NVLS, NVSHMEM_CUMEM_GRANULARITY, NVSHMEM_DISABLE_MNNVL | DeepEP |

Adaptive routing: ep_rt's kernels never infer a chunk's arrival from a counter that reordered writes could break.
Internode high-throughput calls give every chunk its own signal word, raised by the put-with-signal that carries the
chunk (NVSHMEM_SIGNAL_ADD), and a reader waits until the word reaches the exact count it expects before it reads
the chunk (NVSHMEM orders a put's data before its own signal on every transport). A low-latency message to another
node is a put-with-signal that adds to its cell's arrival word, and the receiver waits for as many arrivals as the
cell's count signal announces (no quiet anywhere in the data path). Nothing depends on the order between two
messages, so adaptive routing, several queue pairs per peer, proxy transports and EFA's unordered delivery need no
setting.

Pure functions over a mapping (CPU-testable); transport.nvshmem applies the plan to os.environ before NVSHMEM is
initialised, and python -m ep_rt doctor prints effective_settings().
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .. import env
from ..errors import NetworkSettingError

# EP_RT_REMOTE_TRANSPORT values: what carries peers that NVLink does not reach.
TRANSPORTS = env.REMOTE_TRANSPORTS
NVSHMEM_REMOTE_TRANSPORTS = ("ibrc", "ucx", "libfabric", "ibdevx", "none")
LIBFABRIC_PROVIDERS = ("cxi", "efa", "verbs")
SL_RANGE, TRAFFIC_CLASS_RANGE = (0, 15), (0, 255)
DEFAULT_QP_DEPTH = 1024
CUMEM_GRANULARITY = 2**29

IBRC_RC_NOTE = (
    "NVSHMEM's default (1) kept: with more than one RC per device NVSHMEM 3.4.5's IBRC turns every fence "
    "into a quiet (ibrc.cpp), and each proxied put-with-signal carries a fence, so extra RCs would "
    "serialise ep_rt's chunks; num_qps_per_rank sets NVSHMEM_IBGDA_NUM_RC_PER_PE only"
)
ORDERING_NOTE = (
    "NVSHMEM's default (true) kept, as DeepEP V1 since its adaptive-routing fix: ep_rt reads a chunk only "
    "after that chunk's own signal word reached its exact count, never by payload bytes or a counter "
    "prefix, so relaxed PCIe ordering of payloads is safe; 0 is accepted"
)

_TRUE, _FALSE = ("1", "true", "yes", "y", "on", "t"), ("0", "false", "no", "n", "off", "f")

# What ep_rt wrote into os.environ, as JSON {variable: value}, kept in the environment itself so that processes
# started from this one (workers inherit the environment) do not take ep_rt's values for the user's.
RECORD = "_EP_RT_NVSHMEM_WRITTEN"


def _recorded(environ: Mapping) -> dict:
    try:
        found = json.loads(environ.get(RECORD) or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


@dataclass(frozen=True)
class Setting:
    value: str | None  # None: not set, NVSHMEM's own default applies
    source: str  # "DeepEP", "ep_rt", "user", "NVSHMEM default"
    note: str = ""


@dataclass
class Plan:
    """What a Buffer sets before NVSHMEM starts. `transport` is what carries peers NVLink does not reach (None:
    none is asked for: every rank on one host with NVLink); `ibgda_peers`: remote peers go through IBGDA (the
    host library version rule is stricter then)."""

    transport: str | None
    qp_depth: int
    assign: dict = field(default_factory=dict)  # variables to write into the environment
    settings: dict = field(default_factory=dict)  # every variable the plan governs: name -> Setting
    pinned_hca: str | None = None  # this process's NIC list when EP_RT_HCA_LIST_PER_LOCAL_RANK is set
    hca_per_local_rank: list = field(default_factory=list)

    @property
    def ibgda_peers(self) -> bool:
        return self.transport == "ibgda"

    def as_dict(self) -> dict:
        """{variable: {"value", "source", "note"}} in a fixed order (what doctor prints)."""
        return {k: {"value": s.value, "source": s.source, "note": s.note} for k, s in self.settings.items()}


# ---- value checks ----------------------------------------------------------------------------------------


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise NetworkSettingError(f"{name}={value!r} is not a boolean (use 1 or 0)")


def _int(name: str, value: str, lo: int | None = None, hi: int | None = None) -> int:
    try:
        n = int(value.strip(), 0)
    except ValueError:
        raise NetworkSettingError(f"{name}={value!r} is not an integer") from None
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise NetworkSettingError(f"{name}={value!r} is out of range ({span})")
    return n


def check_num_qps_per_rank(num_qps_per_rank) -> int:
    """DeepEP asserts num_qps_per_rank > 0 whenever it initialises NVSHMEM (internode or low-latency)."""
    if not isinstance(num_qps_per_rank, int) or isinstance(num_qps_per_rank, bool) or num_qps_per_rank <= 0:
        raise ValueError(f"num_qps_per_rank must be a positive int, got {num_qps_per_rank!r}")
    return num_qps_per_rank


def ht_qp_problem(num_qps_per_rank: int, num_sms: int) -> str | None:
    """DeepEP V1's rule for internode high-throughput calls (a device assert in its dispatch kernel,
    csrc/kernels/internode.cu: the RC count per PE equals the channel count, num_sms / 2, or is at least num_sms),
    as a message, or None when the pair is fine. Its low-latency rule (num_qps_per_rank >= local experts,
    internode_ll.cu) is not applied: ep_rt's kernels never address a queue pair, NVSHMEM maps CTAs onto
    NVSHMEM_IBGDA_NUM_RC_PER_PE queue pairs (NVSHMEM_IBGDA_RC_MAP_BY=cta) whatever their number."""
    channels = num_sms // 2
    if num_qps_per_rank == channels or num_qps_per_rank >= num_sms:
        return None
    return (
        f"num_qps_per_rank={num_qps_per_rank} must equal the channel count (Config.num_sms / 2 = {channels}) "
        f"or be at least Config.num_sms ({num_sms}) for internode high-throughput calls, as DeepEP V1 requires "
        f"(Buffer(num_qps_per_rank=...) sets NVSHMEM_IBGDA_NUM_RC_PER_PE)"
    )


def check_ht_num_qps(num_qps_per_rank: int, num_sms: int) -> None:
    """Raise ValueError (before any kernel) where DeepEP V1's internode kernels would trap."""
    problem = ht_qp_problem(num_qps_per_rank, num_sms)
    if problem:
        raise ValueError(problem)


# ---- NIC per GPU -------------------------------------------------------------------------------------------

_HCA = re.compile(r"^[A-Za-z0-9_.\-]+(:[1-9][0-9]*)?$")


def parse_hca_lists(value: str) -> list[str]:
    """EP_RT_HCA_LIST_PER_LOCAL_RANK (not "auto"): one NIC list per local rank, in local-rank order. Plain
    `mlx5_0:1,mlx5_1:1,...` gives one HCA (name[:port]) to each local rank; with ';' the parts are whole lists,
    `mlx5_0:1,mlx5_1:1;mlx5_2:1,mlx5_3:1` (several NICs for a rank). Exclusions (^) select nothing, so they are
    refused here (NVSHMEM_HCA_LIST takes them)."""
    name = "EP_RT_HCA_LIST_PER_LOCAL_RANK"
    parts = [p.strip() for p in (value.split(";") if ";" in value else value.split(","))]
    if not parts or any(not p for p in parts):
        raise NetworkSettingError(
            f"{name}={value!r}: an empty entry (one NIC list per local rank, e.g. mlx5_0:1,mlx5_1:1)"
        )
    for p in parts:
        for hca in p.split(","):
            if not _HCA.match(hca.strip()):
                raise NetworkSettingError(
                    f"{name}={value!r}: {hca.strip()!r} is not an HCA name with an optional "
                    f"port (mlx5_0 or mlx5_0:1; exclusions with ^ go in NVSHMEM_HCA_LIST)"
                )
    return [",".join(h.strip() for h in p.split(",")) for p in parts]


@dataclass(frozen=True)
class Nic:
    entry: str  # "mlx5_0:1": the device and its active port
    pci_path: str  # resolved sysfs path of the PCI function, e.g. /sys/devices/pci0000:00/.../0000:1a:00.0
    link_layer: str  # InfiniBand or Ethernet (RoCE)


def read_nics(listdir: Callable, read_text: Callable, realpath: Callable, sys_root: str = "/sys") -> list[Nic]:
    """The active ports of the RDMA devices under /sys/class/infiniband (first active port of each device)."""
    nics = []
    base = f"{sys_root}/class/infiniband"
    for dev in sorted(listdir(base)):
        for port in sorted(listdir(f"{base}/{dev}/ports"), key=lambda p: int(p) if p.isdigit() else 0):
            state = (read_text(f"{base}/{dev}/ports/{port}/state") or "").strip()
            if "ACTIVE" not in state.upper():
                continue
            layer = (read_text(f"{base}/{dev}/ports/{port}/link_layer") or "").strip() or "unknown"
            nics.append(Nic(f"{dev}:{port}", realpath(f"{base}/{dev}/device"), layer))
            break
    return nics


def normalise_bus_id(bus_id: str) -> str:
    """NVML / CUDA bus ids ("00000000:19:00.0", "0000:19:00.0") as sysfs names them ("0000:19:00.0")."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def gpu_pci_path(bus_id: str, realpath: Callable, sys_root: str = "/sys") -> str:
    return realpath(f"{sys_root}/bus/pci/devices/{normalise_bus_id(bus_id)}")


def _closeness(a: str, b: str) -> int:
    """Depth of the deepest common ancestor of two sysfs PCI paths (same switch > same root port > same root)."""
    n = 0
    for x, y in zip(a.strip("/").split("/"), b.strip("/").split("/")):
        if x != y:
            break
        n += 1
    return n


def pair_gpus_with_nics(gpu_paths: list[str], nics: list[Nic]) -> list[str]:
    """A NIC for each GPU: closest first, and distinct NICs while there are enough (hosts whose GPU pairs share a
    PCIe switch with two NICs would otherwise give both GPUs the first one: DeepEP PR #466, llm-d#397). Greedy over
    the (closeness, GPU order, NIC order) pairs; GPUs left when NICs run out reuse their closest NIC. Every process of
    a host computes the same answer from the same lists."""
    if not nics:
        raise NetworkSettingError(
            "EP_RT_HCA_LIST_PER_LOCAL_RANK=auto: no active RDMA port under "
            "/sys/class/infiniband; list the NICs explicitly or unset it"
        )
    pairs = sorted(
        ((-_closeness(g, n.pci_path), gi, ni) for gi, g in enumerate(gpu_paths) for ni, n in enumerate(nics))
    )
    chosen: dict[int, int] = {}
    used: set[int] = set()
    for _, gi, ni in pairs:
        if gi not in chosen and ni not in used:
            chosen[gi] = ni
            used.add(ni)
    for _, gi, ni in pairs:
        chosen.setdefault(gi, ni)
    return [nics[chosen[gi]].entry for gi in range(len(gpu_paths))]


@dataclass(frozen=True)
class HostPlace:
    """Where this process sits on its host: its index among the host's ranks (torchrun's LOCAL_RANK), its GPU's
    PCI bus id, and the bus ids of all the host's ranks' GPUs (for the auto pairing)."""

    local_index: int
    bus_id: str | None = None
    host_bus_ids: tuple = ()

    @classmethod
    def from_topology(cls, topo) -> "HostPlace":
        mine = topo.hosts[topo.rank]
        ranks = [r for r in range(topo.num_ranks) if topo.hosts[r] == mine]
        return cls(ranks.index(topo.rank), topo.bus_ids[topo.rank], tuple(topo.bus_ids[r] for r in ranks))


def _sysfs():
    def listdir(path):
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def read_text(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return None

    return listdir, read_text, os.path.realpath


def hca_assignment(
    value: str, place: HostPlace | None, environ: Mapping, sysfs=None, preview: bool = False
) -> tuple[str | None, list]:
    """(this process's NIC list, the per-local-rank lists) of EP_RT_HCA_LIST_PER_LOCAL_RANK. This process's is None
    only in a `preview` (doctor: no process to place); otherwise not knowing where it sits is an error."""
    name = "EP_RT_HCA_LIST_PER_LOCAL_RANK"
    if place is None and not preview and (value.strip().lower() == "auto" or not environ.get("LOCAL_RANK", "").strip()):
        raise NetworkSettingError(
            f"{name}={value}: cannot tell which local rank this process is (the Buffer passes "
            f"its topology; without it LOCAL_RANK, as torchrun sets it, places an explicit list)"
        )
    if value.strip().lower() == "auto":
        listdir, read_text, realpath = sysfs or _sysfs()
        nics = read_nics(listdir, read_text, realpath)
        gpus = sorted({normalise_bus_id(b) for b in (place.host_bus_ids if place else ())})
        if not gpus:
            if place is None:
                return None, []
            raise NetworkSettingError(f"{name}=auto needs this host's GPUs' PCI bus ids")
        entries = pair_gpus_with_nics([gpu_pci_path(b, realpath) for b in gpus], nics)
        by_gpu = dict(zip(gpus, entries))
        mine = by_gpu.get(normalise_bus_id(place.bus_id)) if place.bus_id else None
        return mine, [by_gpu[normalise_bus_id(b)] for b in place.host_bus_ids]
    lists = parse_hca_lists(value)
    index = place.local_index if place is not None else None
    if index is None and environ.get("LOCAL_RANK", "").strip():
        index = _int("LOCAL_RANK", environ["LOCAL_RANK"], 0)
    if index is None:
        return None, lists
    if index >= len(lists):
        raise NetworkSettingError(
            f"{name} lists {len(lists)} NIC entr{'y' if len(lists) == 1 else 'ies'}, but this "
            f"process is local rank {index} of its host: give one entry per local rank"
        )
    return lists[index], lists


# ---- the plan ------------------------------------------------------------------------------------------------


class _Builder:
    def __init__(self, environ: Mapping, written: Mapping):
        self.environ, self.written = environ, written
        self.assign: dict = {}
        self.settings: dict = {}

    def user(self, name: str) -> str | None:
        """The user's value of `name`: set, and not what ep_rt itself wrote there earlier in this process."""
        v = self.environ.get(name)
        if v is None or (name in self.written and self.written[name] == v):
            return None
        return v

    def force(
        self, name: str, value: str, source: str, how: str, fix: str = "", kind: str = "str", note: str = ""
    ) -> None:
        """`name` must be `value` (`how` says what sets it): a user value that means something else is a conflict;
        `fix` says how to get the user's value legitimately."""
        mine = self.user(name)
        if mine is not None and not _same(name, mine, value, kind):
            why = (
                "DeepEP would overwrite it silently; ep_rt refuses to guess"
                if source == "DeepEP"
                else "the two contradict each other"
            )
            raise NetworkSettingError(
                f"{name}={mine!r} is set in the environment, but {how} sets it to {value!r} "
                f"({why}): unset {name}" + (f", or {fix}" if fix else "")
            )
        if mine is None:
            self.assign[name] = value
        self.settings[name] = Setting(value if mine is None else mine, source, note)

    def default(self, name: str, value: str, source: str, note: str = "") -> str:
        """`name` defaults to `value`; the user's wins."""
        mine = self.user(name)
        if mine is None:
            self.assign[name] = value
            self.settings[name] = Setting(value, source, note)
            return value
        self.settings[name] = Setting(mine, "user", note)
        return mine

    def leave(self, name: str, note: str = "", check: Callable | None = None) -> str | None:
        """ep_rt does not write `name`: the user's value (checked) or NVSHMEM's default."""
        mine = self.user(name)
        if mine is not None and check is not None:
            check(name, mine)
        self.settings[name] = Setting(mine, "user" if mine is not None else "NVSHMEM default", note)
        return mine


def _same(name: str, a: str, b: str, kind: str) -> bool:
    if kind == "bool":
        return _bool(name, a) == _bool(name, b)
    if kind == "int":
        return _int(name, a) == int(b)
    return a.strip().lower() == b.strip().lower()


def plan(
    num_qps_per_rank: int,
    allow_nvlink: bool,
    allow_mnnvl: bool,
    single_host: bool,
    *,
    place: HostPlace | None = None,
    environ: Mapping | None = None,
    written: Mapping | None = None,
    sysfs=None,
    preview: bool = False,
) -> Plan:
    """The NVSHMEM environment for a Buffer (all of DeepEP's, the network settings, ep_rt's knobs), checked against
    what the user set. Raises NetworkSettingError (naming the variable) on a bad or conflicting value. `place`: where
    this process sits on its host (for EP_RT_HCA_LIST_PER_LOCAL_RANK); `preview`: no process to place (doctor)."""
    environ = os.environ if environ is None else environ
    written = _recorded(environ) if written is None else written
    check_num_qps_per_rank(num_qps_per_rank)
    b = _Builder(environ, written)
    debug = env.nvshmem_debug(environ)
    chosen = env.remote_transport(environ)  # EP_RT_REMOTE_TRANSPORT, None when unset
    local_only = single_host and allow_nvlink and chosen is None
    transport = None if local_only else (chosen or "ibgda")

    b.force(
        "NVSHMEM_DISABLE_P2P",
        "0" if allow_nvlink else "1",
        "DeepEP",
        f"Buffer(allow_nvlink_for_low_latency_mode={allow_nvlink})",
        f"pass allow_nvlink_for_low_latency_mode={not allow_nvlink}",
        "bool",
    )
    # -- transport
    if local_only:
        # One host, NVLink: no remote transport is needed, so none is asked for (NVSHMEM would try IBGDA and print
        # "init failed for transport: IBGDA" without InfiniBand). A user's 1 (DeepEP's value) brings IBGDA back,
        # as EP_RT_NVSHMEM_DEBUG=1 does.
        quiet = "one host with NVLink: no remote transport asked for (EP_RT_NVSHMEM_DEBUG=1 keeps DeepEP's)"
        b.default("NVSHMEM_IB_ENABLE_IBGDA", "1" if debug else "0", "ep_rt", quiet)
        _check_bool_var(b, "NVSHMEM_IB_ENABLE_IBGDA")
        b.default("NVSHMEM_REMOTE_TRANSPORT", "none", "ep_rt", quiet)
    else:
        how = f"EP_RT_REMOTE_TRANSPORT={chosen}" if chosen else "DeepEP's setting (IBGDA for remote peers)"
        fix = (
            "set EP_RT_REMOTE_TRANSPORT=ibgda|ibrc|ucx|libfabric to the transport you mean"
            if chosen
            else "choose another transport with EP_RT_REMOTE_TRANSPORT=ibrc|ucx|libfabric"
        )
        b.force(
            "NVSHMEM_IB_ENABLE_IBGDA",
            "1" if transport == "ibgda" else "0",
            "ep_rt" if chosen else "DeepEP",
            how,
            fix,
            "bool",
        )
        if transport == "ibgda":
            remote = b.leave("NVSHMEM_REMOTE_TRANSPORT", "NVSHMEM's proxy transport beside IBGDA (default ibrc)")
        else:
            remote = None
            b.force("NVSHMEM_REMOTE_TRANSPORT", transport, "ep_rt", how, fix)
        if remote is not None and remote.strip().lower() not in NVSHMEM_REMOTE_TRANSPORTS:
            raise NetworkSettingError(
                f"NVSHMEM_REMOTE_TRANSPORT={remote!r} is not one of "
                f"{', '.join(NVSHMEM_REMOTE_TRANSPORTS)} (NVSHMEM would load no transport)"
            )
    if transport == "libfabric":
        provider = b.leave("NVSHMEM_LIBFABRIC_PROVIDER", "efa for AWS EFA (NVSHMEM's default is cxi, Slingshot)")
        if provider is not None and provider.strip().lower() not in LIBFABRIC_PROVIDERS:
            raise NetworkSettingError(
                f"NVSHMEM_LIBFABRIC_PROVIDER={provider!r} is not one of {', '.join(LIBFABRIC_PROVIDERS)}"
            )
    if debug:
        b.default("NVSHMEM_DEBUG", "WARN", "ep_rt", "EP_RT_NVSHMEM_DEBUG=1")
    # -- queue pairs
    b.force(
        "NVSHMEM_IBGDA_NUM_RC_PER_PE",
        str(num_qps_per_rank),
        "DeepEP",
        f"Buffer(num_qps_per_rank={num_qps_per_rank})",
        "pass that number as Buffer(num_qps_per_rank=...)",
        "int",
        "RC queue pairs per peer PE (IBGDA)",
    )
    b.leave(
        "NVSHMEM_IB_NUM_RC_PER_DEVICE", IBRC_RC_NOTE if transport == "ibrc" else "IBRC only", lambda n, v: _int(n, v, 1)
    )
    depth = b.default(
        "NVSHMEM_QP_DEPTH",
        str(DEFAULT_QP_DEPTH),
        "DeepEP",
        "work requests per QP; low-latency calls need >= 2 * (num_max_dispatch_tokens_per_rank + 1)",
    )
    qp_depth = _int("NVSHMEM_QP_DEPTH", depth, 1)
    # -- the rest of DeepEP's
    b.force("NVSHMEM_MAX_TEAMS", "7", "DeepEP", "DeepEP's setting (less memory)", kind="int")
    b.force("NVSHMEM_DISABLE_NVLS", "1", "DeepEP", "DeepEP's setting (no NVLink SHARP)", kind="bool")
    b.force("NVSHMEM_CUMEM_GRANULARITY", str(CUMEM_GRANULARITY), "DeepEP", "DeepEP's setting", kind="int")
    if allow_mnnvl:
        b.leave("NVSHMEM_DISABLE_MNNVL", "Buffer(allow_mnnvl=True): NVSHMEM decides", lambda n, v: _bool(n, v))
    else:
        b.force("NVSHMEM_DISABLE_MNNVL", "1", "DeepEP", "Buffer(allow_mnnvl=False)", "pass allow_mnnvl=True", "bool")
    if local_only:
        b.default("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo", "ep_rt", "one host: the unique-id bootstrap over loopback")
    else:
        b.leave("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "the interface the hosts reach each other on")
    # -- service level / traffic class (DeepEP's README: NVSHMEM_IB_SL selects the virtual lane)
    sl = b.leave(
        "NVSHMEM_IB_SL",
        "InfiniBand service level -> virtual lane (RoCE: the priority); one for LL and HT",
        lambda n, v: _int(n, v, *SL_RANGE),
    )
    tc = b.leave(
        "NVSHMEM_IB_TRAFFIC_CLASS",
        "GRH traffic class (RoCE: DSCP = value >> 2)",
        lambda n, v: _int(n, v, *TRAFFIC_CLASS_RANGE),
    )
    if transport == "ucx":  # NVSHMEM's UCX transport reads UCX's own variables, not NVSHMEM_IB_*
        for ours, value, theirs in (
            ("NVSHMEM_IB_SL", sl, "UCX_IB_SL"),
            ("NVSHMEM_IB_TRAFFIC_CLASS", tc, "UCX_IB_TRAFFIC_CLASS"),
        ):
            if value is not None:
                b.force(
                    theirs,
                    str(int(value, 0)),
                    "ep_rt",
                    f"{ours}={value} (EP_RT_REMOTE_TRANSPORT=ucx)",
                    f"set {ours} to the value you mean",
                    "int",
                )
    b.leave("NVSHMEM_IB_ENABLE_RELAXED_ORDERING", ORDERING_NOTE, lambda n, v: _bool(n, v))
    # -- NIC per GPU
    pinned, per_rank = None, []
    knob = env.hca_list_per_local_rank(environ)
    if knob is not None:
        if local_only:
            b.settings["EP_RT_HCA_LIST_PER_LOCAL_RANK"] = Setting(knob, "user", "one host: no NIC used, not applied")
        else:
            if transport == "libfabric":
                raise NetworkSettingError(
                    "EP_RT_HCA_LIST_PER_LOCAL_RANK cannot pin NICs under libfabric: NVSHMEM's "
                    "libfabric transport picks its NIC itself (by distance, or "
                    "NVSHMEM_ENABLE_NIC_PE_MAPPING=1); unset it"
                )
            pinned, per_rank = hca_assignment(knob, place, environ, sysfs, preview)
            target = "UCX_NET_DEVICES" if transport == "ucx" else "NVSHMEM_HCA_LIST"
            others = ("UCX_NET_DEVICES",) if transport == "ucx" else ("NVSHMEM_HCA_LIST", "NVSHMEM_HCA_PE_MAPPING")
            for other in others:
                if b.user(other) is not None:
                    raise NetworkSettingError(
                        f"{other}={b.user(other)!r} and EP_RT_HCA_LIST_PER_LOCAL_RANK are both "
                        f"set; they choose the same thing (the NIC of each GPU): keep one"
                    )
            note = f"EP_RT_HCA_LIST_PER_LOCAL_RANK={knob}: " + (
                ", ".join(f"local rank {i}: {e}" for i, e in enumerate(per_rank)) or "per local rank"
            )
            if pinned is not None:
                b.assign[target] = pinned
            b.settings[target] = Setting(pinned, "ep_rt", note)
    else:
        hca_note = "NIC choice: NVSHMEM's (closest by PCI distance) unless set"
        for name in ("NVSHMEM_HCA_LIST", "NVSHMEM_HCA_PE_MAPPING", "NVSHMEM_ENABLE_NIC_PE_MAPPING"):
            b.leave(name, hca_note)
    return Plan(transport, qp_depth, b.assign, b.settings, pinned, per_rank)


def _check_bool_var(b: _Builder, name: str) -> None:
    v = b.user(name)
    if v is not None:
        _bool(name, v)


def apply(p: Plan, environ=None) -> None:
    """Write the plan into the environment (os.environ: NVSHMEM reads it at initialisation), recording what ep_rt
    wrote (RECORD) so a later Buffer, in this process or one it starts, does not take it for the user's."""
    environ = os.environ if environ is None else environ
    record = _recorded(environ)
    for k, v in p.assign.items():
        environ[k] = v
        record[k] = v
    environ[RECORD] = json.dumps(record, sort_keys=True)


# What every rank of a Buffer must set alike (transport.agreement compares it before NVSHMEM starts): every variable
# the plan governs except those that are rightly per process or per host (the NIC of each GPU, the bootstrap
# interface, logging), plus NVSHMEM's own heap settings, which decide where nvshmem_align places memory.
PER_PROCESS = (
    "NVSHMEM_HCA_LIST",
    "UCX_NET_DEVICES",
    "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME",
    "NVSHMEM_DEBUG",
    "EP_RT_HCA_LIST_PER_LOCAL_RANK",
)
HEAP_VARIABLES = ("NVSHMEM_SYMMETRIC_SIZE", "NVSHMEM_DISABLE_CUDA_VMM", "NVSHMEM_HEAP_KIND", "NVSHMEM_ENABLE_RAIL_OPT")


def shared_settings(p: Plan, environ: Mapping | None = None) -> dict:
    """{variable: value} of `p` and of HEAP_VARIABLES (None: unset) that must be the same on every rank."""
    environ = os.environ if environ is None else environ
    out = {k: s.value for k, s in p.settings.items() if k not in PER_PROCESS}
    out.update({k: environ.get(k) for k in HEAP_VARIABLES})
    out["remote transport"] = p.transport
    return out


def effective_settings(
    environ: Mapping | None = None,
    *,
    num_qps_per_rank: int = 24,
    allow_nvlink: bool = True,
    allow_mnnvl: bool = False,
    single_host: bool = False,
    place: HostPlace | None = None,
    sysfs=None,
) -> dict:
    """The settings an internode Buffer with DeepEP's defaults would run with here (python -m ep_rt doctor), as
    {"transport": ..., "qp_depth": ..., "hca_per_local_rank": [...], "variables": {name: {value, source, note}}}.
    Raises NetworkSettingError as Buffer would."""
    p = plan(
        num_qps_per_rank,
        allow_nvlink,
        allow_mnnvl,
        single_host,
        place=place,
        environ=environ,
        sysfs=sysfs,
        preview=True,
    )
    return {
        "transport": p.transport,
        "qp_depth": p.qp_depth,
        "hca_per_local_rank": list(p.hca_per_local_rank),
        "variables": p.as_dict(),
    }
