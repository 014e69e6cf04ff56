"""The network settings of an NVSHMEM Buffer (ep_rt.transport.network_settings): DeepEP's variables and who wins,
the transport knob, queue pairs (DeepEP's rules), service level / traffic class, NIC per local rank (explicit and
auto from a stand-in sysfs), what doctor prints; and the signalling contract of the internode kernels."""

import os
import re

import pytest

from ep_rt.errors import EpRtError, NetworkSettingError
from ep_rt.transport import network_settings as ns
from ep_rt.transport import nvshmem
from ep_rt.transport.topology import Topology

from ..repo import REPO as ROOT


# What DeepEP V1's Buffer.__init__ writes for an internode (or low-latency) Buffer with its defaults
# (deep_ep/buffer.py at 567632d): the reference for ep_rt's plan off one host.
DEEPEP = {
    "NVSHMEM_DISABLE_P2P": "0",
    "NVSHMEM_IB_ENABLE_IBGDA": "1",
    "NVSHMEM_IBGDA_NUM_RC_PER_PE": "24",
    "NVSHMEM_QP_DEPTH": "1024",
    "NVSHMEM_MAX_TEAMS": "7",
    "NVSHMEM_DISABLE_NVLS": "1",
    "NVSHMEM_CUMEM_GRANULARITY": str(2**29),
    "NVSHMEM_DISABLE_MNNVL": "1",
}


def plan(environ=None, qps=24, allow_nvlink=True, allow_mnnvl=False, single_host=False, **kw):
    return ns.plan(qps, allow_nvlink, allow_mnnvl, single_host, environ=environ or {}, written={}, **kw)


@pytest.fixture
def clean_env():
    """os.environ without any variable the plan governs (nor ep_rt's record of its writes), restored afterwards
    as it was: what set_environment writes must not leak into later tests or the processes they start."""
    saved = dict(os.environ)
    for k in list(os.environ):
        if k.startswith(("NVSHMEM_", "EP_RT_", "UCX_")) or k in ("LOCAL_RANK", ns.RECORD):
            del os.environ[k]
    yield
    os.environ.clear()
    os.environ.update(saved)


# ---- DeepEP's variables ----------------------------------------------------------------------------------


def test_off_one_host_the_plan_is_deepeps():
    p = plan()
    assert p.assign == DEEPEP and p.transport == "ibgda" and p.ibgda_peers and p.qp_depth == 1024
    assert plan(qps=8).assign["NVSHMEM_IBGDA_NUM_RC_PER_PE"] == "8"
    assert plan(allow_nvlink=False).assign["NVSHMEM_DISABLE_P2P"] == "1"
    assert "NVSHMEM_DISABLE_MNNVL" not in plan(allow_mnnvl=True).assign


def test_one_host_with_nvlink_asks_for_no_remote_transport():
    p = plan(single_host=True)
    assert p.transport is None and not p.ibgda_peers
    assert p.assign["NVSHMEM_IB_ENABLE_IBGDA"] == "0" and p.assign["NVSHMEM_REMOTE_TRANSPORT"] == "none"
    assert p.assign["NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"] == "lo"
    # DeepEP's value set by the user (or EP_RT_NVSHMEM_DEBUG=1) brings IBGDA back, and nothing is overwritten
    assert "NVSHMEM_IB_ENABLE_IBGDA" not in plan({"NVSHMEM_IB_ENABLE_IBGDA": "1"}, single_host=True).assign
    assert plan({"EP_RT_NVSHMEM_DEBUG": "1"}, single_host=True).assign["NVSHMEM_IB_ENABLE_IBGDA"] == "1"
    # one host without NVLink (allow_nvlink_for_low_latency_mode=False): every peer over the network, as DeepEP
    assert plan(single_host=True, allow_nvlink=False).transport == "ibgda"


@pytest.mark.parametrize(
    "name,value,names_also",
    [
        ("NVSHMEM_IBGDA_NUM_RC_PER_PE", "4", "num_qps_per_rank"),
        ("NVSHMEM_DISABLE_P2P", "1", "allow_nvlink_for_low_latency_mode"),
        ("NVSHMEM_IB_ENABLE_IBGDA", "0", "EP_RT_REMOTE_TRANSPORT"),
        ("NVSHMEM_MAX_TEAMS", "8", "DeepEP"),
        ("NVSHMEM_DISABLE_NVLS", "0", "DeepEP"),
        ("NVSHMEM_CUMEM_GRANULARITY", "1073741824", "DeepEP"),
        ("NVSHMEM_DISABLE_MNNVL", "0", "allow_mnnvl"),
    ],
)
def test_a_user_value_where_deepep_overwrites_is_a_conflict(name, value, names_also):
    with pytest.raises(NetworkSettingError, match=name) as e:
        plan({name: value})
    assert names_also in str(e.value) and isinstance(e.value, EpRtError) and isinstance(e.value, ValueError)


def test_a_user_value_that_means_the_same_is_kept():
    p = plan({"NVSHMEM_DISABLE_NVLS": "true", "NVSHMEM_IBGDA_NUM_RC_PER_PE": " 24", "NVSHMEM_IB_ENABLE_IBGDA": "y"})
    assert not {"NVSHMEM_DISABLE_NVLS", "NVSHMEM_IBGDA_NUM_RC_PER_PE", "NVSHMEM_IB_ENABLE_IBGDA"} & set(p.assign)
    assert p.settings["NVSHMEM_DISABLE_NVLS"].value == "true"


def test_where_deepep_lets_the_user_choose_the_users_value_wins():
    p = plan(
        {
            "NVSHMEM_QP_DEPTH": "2048",
            "NVSHMEM_IB_SL": "3",
            "NVSHMEM_IB_TRAFFIC_CLASS": "106",
            "NVSHMEM_IB_ENABLE_RELAXED_ORDERING": "0",
            "NVSHMEM_IB_NUM_RC_PER_DEVICE": "2",
            "NVSHMEM_HCA_LIST": "^mlx5_4",
            "NVSHMEM_REMOTE_TRANSPORT": "ucx",
        }
    )
    assert p.qp_depth == 2048 and "NVSHMEM_QP_DEPTH" not in p.assign
    for k in ("NVSHMEM_IB_SL", "NVSHMEM_IB_TRAFFIC_CLASS", "NVSHMEM_IB_ENABLE_RELAXED_ORDERING", "NVSHMEM_HCA_LIST"):
        assert k not in p.assign and p.settings[k].source == "user"
    assert p.transport == "ibgda"  # DeepEP keeps IBGDA; NVSHMEM_REMOTE_TRANSPORT is its proxy transport beside it


@pytest.mark.parametrize(
    "name,value",
    [
        ("NVSHMEM_IB_SL", "16"),
        ("NVSHMEM_IB_SL", "-1"),
        ("NVSHMEM_IB_SL", "high"),
        ("NVSHMEM_IB_TRAFFIC_CLASS", "256"),
        ("NVSHMEM_IB_TRAFFIC_CLASS", "x"),
        ("NVSHMEM_QP_DEPTH", "0"),
        ("NVSHMEM_QP_DEPTH", "lots"),
        ("NVSHMEM_IB_NUM_RC_PER_DEVICE", "0"),
        ("NVSHMEM_IB_ENABLE_RELAXED_ORDERING", "maybe"),
        ("NVSHMEM_REMOTE_TRANSPORT", "tcp"),
        ("EP_RT_REMOTE_TRANSPORT", "efa"),
    ],
)
def test_values_out_of_range_are_refused_naming_the_variable(name, value):
    with pytest.raises(NetworkSettingError, match=name):
        plan({name: value})


def test_the_edges_of_the_ranges_are_valid():
    p = plan({"NVSHMEM_IB_SL": "15", "NVSHMEM_IB_TRAFFIC_CLASS": "255"})
    assert p.settings["NVSHMEM_IB_SL"].value == "15"
    plan({"NVSHMEM_IB_SL": "0", "NVSHMEM_IB_TRAFFIC_CLASS": "0x68"})


# ---- the transport knob ------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["ibrc", "ucx", "libfabric"])
def test_remote_transport_knob(transport):
    p = plan({"EP_RT_REMOTE_TRANSPORT": transport})
    assert p.transport == transport and not p.ibgda_peers
    assert p.assign["NVSHMEM_IB_ENABLE_IBGDA"] == "0" and p.assign["NVSHMEM_REMOTE_TRANSPORT"] == transport
    # the knob also wins over the one-host shortcut: the user asked for that transport
    assert plan({"EP_RT_REMOTE_TRANSPORT": transport}, single_host=True).transport == transport


def test_the_knob_and_a_contradicting_nvshmem_variable_are_a_conflict():
    with pytest.raises(NetworkSettingError, match="NVSHMEM_REMOTE_TRANSPORT.*EP_RT_REMOTE_TRANSPORT=ibrc"):
        plan({"EP_RT_REMOTE_TRANSPORT": "ibrc", "NVSHMEM_REMOTE_TRANSPORT": "ucx"})
    with pytest.raises(NetworkSettingError, match="NVSHMEM_IB_ENABLE_IBGDA"):
        plan({"EP_RT_REMOTE_TRANSPORT": "ucx", "NVSHMEM_IB_ENABLE_IBGDA": "1"})
    assert plan({"EP_RT_REMOTE_TRANSPORT": "IBGDA"}).assign["NVSHMEM_IB_ENABLE_IBGDA"] == "1"


def test_ucx_reads_its_own_service_level_and_traffic_class():
    p = plan({"EP_RT_REMOTE_TRANSPORT": "ucx", "NVSHMEM_IB_SL": "2", "NVSHMEM_IB_TRAFFIC_CLASS": "0x68"})
    assert p.assign["UCX_IB_SL"] == "2" and p.assign["UCX_IB_TRAFFIC_CLASS"] == "104"
    with pytest.raises(NetworkSettingError, match="UCX_IB_SL"):
        plan({"EP_RT_REMOTE_TRANSPORT": "ucx", "NVSHMEM_IB_SL": "2", "UCX_IB_SL": "5"})
    assert "UCX_IB_SL" not in plan({"NVSHMEM_IB_SL": "2"}).assign  # IBGDA reads NVSHMEM_IB_SL itself


def test_libfabric_provider_is_checked():
    assert plan({"EP_RT_REMOTE_TRANSPORT": "libfabric", "NVSHMEM_LIBFABRIC_PROVIDER": "efa"}).transport == "libfabric"
    with pytest.raises(NetworkSettingError, match="NVSHMEM_LIBFABRIC_PROVIDER"):
        plan({"EP_RT_REMOTE_TRANSPORT": "libfabric", "NVSHMEM_LIBFABRIC_PROVIDER": "tcp"})


# ---- queue pairs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, True, "24", 2.0])
def test_num_qps_per_rank_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="num_qps_per_rank"):
        ns.check_num_qps_per_rank(bad)
    with pytest.raises(ValueError, match="num_qps_per_rank"):
        plan(qps=bad)


@pytest.mark.parametrize(
    "qps,num_sms,ok",
    [
        (24, 24, True),  # >= num_sms
        (12, 24, True),  # == channels (num_sms / 2)
        (24, 20, True),  # DeepEP's defaults: num_qps_per_rank=24, Buffer.num_sms=20
        (16, 24, False),  # neither
        (24, 32, False),  # DeepEP's default num_qps_per_rank with 32 SMs traps in DeepEP
        (16, 32, True),
    ],
)
def test_deepeps_internode_queue_pair_rule(qps, num_sms, ok):
    assert (ns.ht_qp_problem(qps, num_sms) is None) == ok
    if ok:
        ns.check_ht_num_qps(qps, num_sms)
    else:
        with pytest.raises(ValueError, match=rf"num_qps_per_rank={qps}.*Config.num_sms / 2 = {num_sms // 2}"):
            ns.check_ht_num_qps(qps, num_sms)


def test_ibrc_keeps_one_rc_per_device_and_says_why():
    p = plan({"EP_RT_REMOTE_TRANSPORT": "ibrc"})
    assert "NVSHMEM_IB_NUM_RC_PER_DEVICE" not in p.assign
    assert "fence" in p.settings["NVSHMEM_IB_NUM_RC_PER_DEVICE"].note


# ---- ep_rt's own earlier writes, through os.environ ------------------------------------------------------


def test_what_ep_rt_wrote_earlier_is_not_the_users(clean_env):
    assert nvshmem.set_environment(24, True, False, single_host=False) == 1024
    assert os.environ["NVSHMEM_IBGDA_NUM_RC_PER_PE"] == "24"
    nvshmem.set_environment(12, True, False, single_host=False)  # a later Buffer asks for other queue pairs
    assert os.environ["NVSHMEM_IBGDA_NUM_RC_PER_PE"] == "12"
    nvshmem.set_environment(12, True, False, single_host=True)  # and one host after a network Buffer
    assert os.environ["NVSHMEM_IB_ENABLE_IBGDA"] == "0"


def test_the_record_passes_to_processes_started_later(clean_env):
    nvshmem.set_environment(24, True, False, single_host=False)
    inherited = dict(os.environ)  # what a worker started now would see
    assert ns.plan(12, True, False, False, environ=inherited).assign["NVSHMEM_IBGDA_NUM_RC_PER_PE"] == "12"
    inherited["NVSHMEM_IBGDA_NUM_RC_PER_PE"] = "6"  # changed after ep_rt wrote it: the user's
    with pytest.raises(NetworkSettingError, match="NVSHMEM_IBGDA_NUM_RC_PER_PE='6'"):
        ns.plan(12, True, False, False, environ=inherited)
    assert ns.plan(24, True, False, False, environ={ns.RECORD: "not json", "NVSHMEM_MAX_TEAMS": "7"}).qp_depth == 1024


def test_a_users_value_in_os_environ_is_checked(clean_env):
    os.environ["NVSHMEM_IBGDA_NUM_RC_PER_PE"] = "8"
    with pytest.raises(NetworkSettingError, match="NVSHMEM_IBGDA_NUM_RC_PER_PE='8'"):
        nvshmem.set_environment(24, True, False, single_host=False)
    assert nvshmem.set_environment(8, True, False, single_host=False) == 1024


# ---- NIC per local rank --------------------------------------------------------------------------------------


def test_explicit_nic_per_local_rank():
    knob = {"EP_RT_HCA_LIST_PER_LOCAL_RANK": "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"}
    p = plan(knob, place=ns.HostPlace(2))
    assert p.assign["NVSHMEM_HCA_LIST"] == "mlx5_2:1" and p.pinned_hca == "mlx5_2:1"
    assert p.hca_per_local_rank == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    several = {"EP_RT_HCA_LIST_PER_LOCAL_RANK": "mlx5_0:1,mlx5_1:1; mlx5_2:1,mlx5_3"}
    assert plan(several, place=ns.HostPlace(1)).assign["NVSHMEM_HCA_LIST"] == "mlx5_2:1,mlx5_3"
    ucx = plan({**knob, "EP_RT_REMOTE_TRANSPORT": "ucx"}, place=ns.HostPlace(0))
    assert ucx.assign["UCX_NET_DEVICES"] == "mlx5_0:1" and "NVSHMEM_HCA_LIST" not in ucx.assign
    # without a place, torchrun's LOCAL_RANK says which entry is this process's; without either nothing is written
    assert plan({**knob, "LOCAL_RANK": "3"}).assign["NVSHMEM_HCA_LIST"] == "mlx5_3:1"
    with pytest.raises(NetworkSettingError, match="cannot tell which local rank"):
        plan(knob)
    with pytest.raises(NetworkSettingError, match="cannot tell which local rank"):
        plan({"EP_RT_HCA_LIST_PER_LOCAL_RANK": "auto", "LOCAL_RANK": "0"})  # auto needs the GPUs: the topology
    preview = plan(knob, preview=True)  # doctor: the list per local rank, nothing written
    assert "NVSHMEM_HCA_LIST" not in preview.assign and preview.hca_per_local_rank[3] == "mlx5_3:1"
    # one host: no NIC is used, nothing is written
    assert "NVSHMEM_HCA_LIST" not in plan(knob, place=ns.HostPlace(0), single_host=True).assign


@pytest.mark.parametrize(
    "environ,match",
    [
        (
            {"EP_RT_HCA_LIST_PER_LOCAL_RANK": "mlx5_0:1,mlx5_1:1"},
            "lists 2 NIC entries, but this process is local rank 2",
        ),
        ({"EP_RT_HCA_LIST_PER_LOCAL_RANK": "^mlx5_0"}, "exclusions"),
        ({"EP_RT_HCA_LIST_PER_LOCAL_RANK": "mlx5_0:0,mlx5_1:1,mlx5_2:1"}, "not an HCA name"),
        ({"EP_RT_HCA_LIST_PER_LOCAL_RANK": "mlx5_0,,mlx5_2"}, "an empty entry"),
        (
            {"EP_RT_HCA_LIST_PER_LOCAL_RANK": "a,b,c", "NVSHMEM_HCA_LIST": "mlx5_0"},
            "NVSHMEM_HCA_LIST='mlx5_0' and EP_RT_HCA",
        ),
        ({"EP_RT_HCA_LIST_PER_LOCAL_RANK": "a,b,c", "NVSHMEM_HCA_PE_MAPPING": "mlx5_0:1:2"}, "NVSHMEM_HCA_PE_MAPPING"),
        (
            {"EP_RT_HCA_LIST_PER_LOCAL_RANK": "a,b,c", "EP_RT_REMOTE_TRANSPORT": "ucx", "UCX_NET_DEVICES": "mlx5_0:1"},
            "UCX_NET_DEVICES",
        ),
        ({"EP_RT_HCA_LIST_PER_LOCAL_RANK": "a,b,c", "EP_RT_REMOTE_TRANSPORT": "libfabric"}, "libfabric"),
    ],
)
def test_bad_nic_lists(environ, match):
    with pytest.raises(NetworkSettingError, match=match):
        plan(environ, place=ns.HostPlace(2))


class FakeSysfs:
    """A stand-in /sys: PCI trees as paths, RDMA devices with ports (state, link layer)."""

    def __init__(self, gpus: dict, nics: dict):
        self.real = {f"/sys/bus/pci/devices/{bus}": path for bus, path in gpus.items()}
        self.dirs, self.texts = {"/sys/class/infiniband": list(nics)}, {}
        for name, (path, state) in nics.items():
            self.real[f"/sys/class/infiniband/{name}/device"] = path
            self.dirs[f"/sys/class/infiniband/{name}/ports"] = ["1"]
            self.texts[f"/sys/class/infiniband/{name}/ports/1/state"] = state
            self.texts[f"/sys/class/infiniband/{name}/ports/1/link_layer"] = "InfiniBand\n"

    def triple(self):
        return (lambda p: self.dirs.get(p, []), self.texts.get, lambda p: self.real.get(p, p))


PCI = "/sys/devices/pci0000:{r}/0000:{r}:01.0/0000:{s}:00.0/0000:{s}:{d}.0"


def _dev(root, switch, dev, fn="0000:{b}:00.0"):
    return PCI.format(r=root, s=switch, d=dev) + "/" + fn


def test_auto_gives_gpus_sharing_a_switch_distinct_nics():
    # GCP A3 Ultra style: GPU pairs and NIC pairs behind one PCIe switch; NVSHMEM's distance choice gives both GPUs
    # the first NIC of their switch (DeepEP PR #466)
    gpus = {
        "0000:19:00.0": _dev("00", "11", "00", "0000:19:00.0"),
        "0000:1a:00.0": _dev("00", "11", "01", "0000:1a:00.0"),
        "0000:99:00.0": _dev("80", "91", "00", "0000:99:00.0"),
        "0000:9a:00.0": _dev("80", "91", "01", "0000:9a:00.0"),
    }
    nics = {
        "mlx5_0": (_dev("00", "11", "02", "0000:1b:00.0"), "4: ACTIVE"),
        "mlx5_1": (_dev("00", "11", "03", "0000:1c:00.0"), "4: ACTIVE"),
        "mlx5_2": (_dev("80", "91", "02", "0000:9b:00.0"), "4: ACTIVE"),
        "mlx5_3": (_dev("80", "91", "03", "0000:9c:00.0"), "4: ACTIVE"),
        "mlx5_4": ("/sys/devices/pci0000:00/0000:00:1c.0/0000:05:00.0", "1: DOWN"),
    }  # management port, down
    sysfs = FakeSysfs(gpus, nics).triple()
    host = ("00000000:19:00.0", "00000000:1A:00.0", "00000000:99:00.0", "00000000:9A:00.0")  # NVML spelling
    knob = {"EP_RT_HCA_LIST_PER_LOCAL_RANK": "auto"}
    got = [plan(knob, place=ns.HostPlace(i, host[i], host), sysfs=sysfs).assign["NVSHMEM_HCA_LIST"] for i in range(4)]
    assert got == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    p = plan(knob, place=ns.HostPlace(0, host[0], host), sysfs=sysfs)
    assert p.hca_per_local_rank == got
    # two ranks sharing a GPU share its NIC; more GPUs than NICs reuse the closest
    shared = (host[0], host[0], host[2])
    assert [
        plan(knob, place=ns.HostPlace(i, shared[i], shared), sysfs=sysfs).assign["NVSHMEM_HCA_LIST"] for i in range(3)
    ] == ["mlx5_0:1", "mlx5_0:1", "mlx5_2:1"]
    one_nic = FakeSysfs(gpus, {"mlx5_2": nics["mlx5_2"]}).triple()
    assert plan(knob, place=ns.HostPlace(1, host[1], host), sysfs=one_nic).assign["NVSHMEM_HCA_LIST"] == "mlx5_2:1"
    with pytest.raises(NetworkSettingError, match="no active RDMA port"):
        plan(knob, place=ns.HostPlace(0, host[0], host), sysfs=FakeSysfs(gpus, {"mlx5_4": nics["mlx5_4"]}).triple())


def test_pairing_prefers_the_closest_nic():
    gpus = [_dev("00", "11", "00"), _dev("80", "91", "00")]
    nics = [
        ns.Nic("far:1", _dev("80", "91", "05"), "InfiniBand"),
        ns.Nic("near:1", _dev("00", "11", "05"), "InfiniBand"),
    ]
    assert ns.pair_gpus_with_nics(gpus, nics) == ["near:1", "far:1"]
    assert ns.normalise_bus_id("00000000:1A:00.0") == ns.normalise_bus_id("0000:1a:00.0") == "0000:1a:00.0"


def test_host_place_from_the_topology():
    topo = Topology.from_table(5, ["a"] * 4 + ["b"] * 4, [f"0000:{i:02x}:00.0" for i in range(8)])
    place = ns.HostPlace.from_topology(topo)
    assert place.local_index == 1 and place.bus_id == "0000:05:00.0"
    assert place.host_bus_ids == tuple(f"0000:{i:02x}:00.0" for i in range(4, 8))
    # emulated nodes on one host: the index is among the host's ranks, not the emulated node's
    emulated = Topology.from_table(5, ["a"] * 8, [f"0000:{i:02x}:00.0" for i in range(8)], ranks_per_node=2)
    assert ns.HostPlace.from_topology(emulated).local_index == 5


# ---- what doctor prints ------------------------------------------------------------------------------


def test_effective_settings_is_a_plain_dict():
    found = ns.effective_settings({"NVSHMEM_IB_SL": "1"})
    assert found["transport"] == "ibgda" and found["qp_depth"] == 1024
    v = found["variables"]
    assert v["NVSHMEM_IB_SL"] == {"value": "1", "source": "user", "note": v["NVSHMEM_IB_SL"]["note"]}
    assert v["NVSHMEM_IBGDA_NUM_RC_PER_PE"]["value"] == "24" and v["NVSHMEM_IBGDA_NUM_RC_PER_PE"]["source"] == "DeepEP"
    assert v["NVSHMEM_IB_ENABLE_RELAXED_ORDERING"]["value"] is None
    assert "exact count" in v["NVSHMEM_IB_ENABLE_RELAXED_ORDERING"]["note"]
    with pytest.raises(NetworkSettingError):
        ns.effective_settings({"NVSHMEM_MAX_TEAMS": "3"})


# ---- the internode kernels' signalling contract ----------------------------------------------------------

FORBIDDEN = {
    # (net.cuh defines net_signal_set for the low-latency kernels' once-per-buffer-use words; internode.cu's words are
    # all ADD counters: tests/transport/test_network_rules.py)
    "SET signals (a SET signal can overtake; readers wait for exact ADD counts)": r"\b(NVSHMEM_SIGNAL_SET|net_signal_set)\b",
    "fetching atomics": r"\bnvshmemx?_\w*atomic_(fetch\w*|compare_swap|swap)\b",
    "NVSHMEM barriers / collectives inside kernels": r"\bnvshmemx?_\w*(barrier|_sync|sync_all|alltoall|broadcast|"
    r"fcollect|reduce)\w*\s*\(",
    "DeepEP's private IBGDA calls": r"\b(nvshmemi_ibgda_\w+|ibgda_get_state)\b",
}


def _code(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


@pytest.mark.parametrize("source", ["internode.cu", "include/ep_rt/net.cuh"])
@pytest.mark.parametrize("what", sorted(FORBIDDEN))
def test_internode_kernels_use_only_adaptive_routing_safe_signalling(what, source):
    """INTERNODE.md 4.3: data + per-chunk SIGNAL_ADD words and signal ops; nothing whose correctness depends on
    the order between messages. The internode kernels and the network primitives they call."""
    path = ROOT / "kernels_src" / source
    assert path.is_file(), f"kernels_src/{source} is part of the repository and must be there"
    if what.startswith("SET signals") and source.endswith("net.cuh"):
        # the only SETs: net_signal_set's own definitions (the real transport and the chaos build), for the LL words
        assert len(re.findall(r"NVSHMEM_SIGNAL_SET", _code(path.read_text()))) == 2
        return
    found = sorted(set(m.group(0) for m in re.finditer(FORBIDDEN[what], _code(path.read_text()))))
    assert not found, f"{path.name} uses {what}: {found}"


def test_the_contract_check_sees_through_comments():
    src = "// never NVSHMEM_SIGNAL_SET\n/* nvshmem_barrier_all() */\nnvshmemx_signal_op(w, 1, NVSHMEM_SIGNAL_ADD, pe);"
    assert not any(re.search(p, _code(src)) for p in FORBIDDEN.values())
    assert re.search(FORBIDDEN["NVSHMEM barriers / collectives inside kernels"], "nvshmem_sync_all();")
    assert re.search(FORBIDDEN["fetching atomics"], "nvshmem_uint64_atomic_fetch_add(p, 1, pe)")
