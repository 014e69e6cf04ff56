"""python -m ep_rt doctor: each check against a stand-in System (a healthy 2-GPU NVLink machine, and the ways it can
be broken), the report's format and exit code, and the real command on a machine without GPU or driver."""

import copy
from pathlib import Path

import pytest
import torch

from ep_rt.cli import doctor, doctor_checks as dc
from ep_rt.runtime import modules

from ..repo import REPO

OK, WARNING, ERROR, SKIP = dc.OK, dc.WARNING, dc.ERROR, dc.SKIP
_CU13 = {"flavour": "cu13", "min_driver": 13000, "compiler": "nvcc 13.0.88", "needs_nvshmem": False, "nvshmem": None}
MANIFEST = {
    "cubins": [
        {**_CU13, "family": "intranode", "arch": "sm_90", "variant": "safe", "path": "cu13/sm_90/safe/intranode.cubin"},
        {
            **_CU13,
            "family": "intranode",
            "arch": "sm_90",
            "variant": "aggressive",
            "path": "cu13/sm_90/aggressive/intranode.cubin",
        },
        {**_CU13, "family": "layout", "arch": "sm_90", "variant": "default", "path": "cu13/sm_90/default/layout.cubin"},
        {
            **_CU13,
            "family": "low_latency",
            "arch": "sm_90",
            "variant": "default",
            "path": "cu13/sm_90/default/low_latency.cubin",
            "needs_nvshmem": True,
            "nvshmem": "3.4.5",
        },
    ]
}
BUS = ["0000:19:00.0", "0000:3B:00.0"]


class FakeSystem:
    """A healthy machine: 2 x H200 with NVLink, driver 580 (CUDA 13.0), InfiniBand, every transport, GDRCopy,
    the IBGDA driver options, nvidia_peermem. Tests break one thing at a time."""

    def __init__(self):
        self.versions = {
            "cuda-bindings": "13.0.3",
            "nvidia-nvshmem-cu13": "3.4.5",
            "nvidia-ml-py": "13.580",
            "numpy": "2.1",
        }
        self.torch = {"version": "2.11.0+cu130", "cuda": "13.0"}
        self.driver, self.cuda = "580.65", (13, 0)
        self.gpu_list = [
            {"index": i, "name": "NVIDIA H200", "arch": "sm_90", "sms": 132, "bus_id": b} for i, b in enumerate(BUS)
        ]
        self.p2p_ok, self.link_count = True, 18
        self.manifest_doc, self.corrupt = copy.deepcopy(MANIFEST), set()
        self.host_nvshmem = "3.4.5"
        self.libs = {"ibverbs", "mlx5", "ucp", "fabric", "gdrapi"}
        self.files = {"/dev/gdrdrv", "/sys/module/nvidia", "/sys/module/nvidia_peermem"}
        self.dirs = {
            "/sys/class/infiniband": ["mlx5_0", "mlx5_1"],
            "/nvshmem/lib": [
                "libnvshmem_host.so.3",
                "nvshmem_transport_ibgda.so.3",
                "nvshmem_transport_ibrc.so.3",
                "nvshmem_transport_ucx.so.3",
                "nvshmem_transport_libfabric.so.3",
            ],
        }
        self.texts = {
            "/proc/driver/nvidia/params": 'EnableStreamMemOPs: 1\nRegistryDwords: "PeerMappingOverride=1;"\n',
            "/proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65",
        }
        self.release, self.env = "6.8.0-45-generic", {}
        self.host_flavour = "cu13"
        self.rdma = {"supported": 1, "ordering": 100, "flush_options": 1}  # what an H200 with driver 580 reports
        self.host = {"host_native_atomic": 0, "concurrent_managed": 1}  # a PCIe x86 host

    def python_version(self):
        return "3.12.3"

    def package_version(self, name):
        return self.versions.get(name)

    def torch_info(self):
        return self.torch

    def nvml_driver_version(self):
        if self.driver is None:
            raise RuntimeError("NVML Shared Library Not Found")
        return self.driver

    def cuda_driver_version(self):
        return self.cuda

    def nvshmem_flavour(self):
        return self.host_flavour

    def gpudirect_rdma(self, index):
        if isinstance(self.rdma, Exception):
            raise self.rdma
        return self.rdma

    def host_memory(self, index):
        if isinstance(self.host, Exception):
            raise self.host
        return self.host

    def gpus(self):
        return self.gpu_list

    def nvlink(self, bus_ids):
        return {
            "p2p": {(a, b): self.p2p_ok for a in bus_ids for b in bus_ids if a != b},
            "links": {b: self.link_count for b in bus_ids},
        }

    def manifest(self):
        if self.manifest_doc is None:
            raise FileNotFoundError("no cubins/manifest.json")
        return Path("/cubins"), self.manifest_doc

    def verify_cubin(self, root, entry):
        if entry["path"] in self.corrupt:
            raise modules.CubinNotFoundError(f"{entry['path']} is corrupt or stale")

    def nvshmem_host_version(self):
        return self.host_nvshmem

    def nvshmem_lib_dir(self):
        return "/nvshmem/lib"

    def find_library(self, name):
        return f"lib{name}.so.1" if name in self.libs else None

    def exists(self, path):
        return path in self.files

    def listdir(self, path):
        return self.dirs.get(str(path), [])

    def read_text(self, path):
        return self.texts.get(path)

    def kernel_release(self):
        return self.release

    def environ(self):
        return self.env


def readme_command(series, cuda):
    """The install command README "Installing" gives for a torch release and CUDA major."""
    readme = (REPO / "README.md").read_text()
    (line,) = [x for x in readme.splitlines() if x.startswith(f"| {series} | {cuda} | `")]
    return line.split("`")[1]


def cuda12_system():
    """The issue's machine: torch 2.10.0+cu128 from PyPI with the cu12 NVSHMEM it pins, no cu13 package."""
    s = FakeSystem()
    s.torch = {"version": "2.10.0+cu128", "cuda": "12.8"}
    s.versions = {"cuda-bindings": "12.9.4", "nvidia-nvshmem-cu12": "3.4.5", "nvidia-ml-py": "13.580", "numpy": "2.1"}
    s.host_flavour, s.cuda = "cu12", (12, 8)
    for e in s.manifest_doc["cubins"]:
        e.update(flavour="cu12", min_driver=12000, path=e["path"].replace("cu13/", "cu12/"))
    return s


def statuses(items):
    return {i.name: i.status for i in items}


def run(s, smoke=False, run_ranks=None):
    return doctor.run_checks(s, smoke, 2, run_ranks)


def test_a_healthy_machine_is_all_ok():
    items = run(FakeSystem(), smoke=True, run_ranks=lambda fn, r, g: [(40, []), (40, [])])
    bad = {n: s for n, s in statuses(items).items() if s != OK}
    assert bad == {}, bad
    assert doctor.exit_code(items) == 0
    by_name = {i.name: i for i in items}
    assert "sm_90/safe/intranode.cubin" in by_name["cubins for sm_90"].detail
    assert "host 3.4.5 (cu13) runs" in by_name["NVSHMEM"].detail and "3.4.5" in by_name["NVSHMEM"].detail
    assert by_name["GPUDirect RDMA"].detail == "nvidia_peermem is loaded"
    smoke = [i for i in items if i.name.startswith("smoke")]
    assert len(smoke) == 2 and all(
        "80 checks" in i.detail and i.detail.startswith("2 ranks on 2 GPUs: ") for i in smoke
    )


def test_no_driver_no_gpu():
    s = FakeSystem()
    s.driver, s.gpu_list, s.torch = None, [], {"version": "2.13.0+cpu", "cuda": None}
    items = run(s, smoke=True, run_ranks=lambda *a: pytest.fail("the smoke round must not run"))
    st = statuses(items)
    assert st["packages"] == st["driver"] == st["GPUs"] == ERROR
    assert st["cubins for this GPU"] == st["NVLink"] == SKIP
    assert all(st[n] == SKIP for n in st if n.startswith("smoke"))
    assert doctor.exit_code(items) == 1
    text = doctor.format_items(items)
    assert "no NVIDIA driver" in text and "CPU-only build" in text and "fix the errors above first" in text


def test_old_driver_for_the_cubins():
    s = FakeSystem()
    s.cuda = (12, 8)  # the stand-in ships only cu13 cubins
    item = dc.check_driver(s, s.manifest_doc)[0]
    assert item.status == ERROR and "cu13" in item.detail and "CUDA 13.0 or newer" in item.hint
    s.manifest_doc["cubins"].append({**s.manifest_doc["cubins"][0], "flavour": "cu12", "min_driver": 12000})
    item = dc.check_driver(s, s.manifest_doc)[0]
    assert item.status == OK and "flavours it runs: cu12" in item.detail


def test_missing_package():
    s = FakeSystem()
    del s.versions["nvidia-nvshmem-cu13"]
    item = dc.check_packages(s)[0]
    assert item.status == ERROR and "no nvidia-nvshmem-cu13 beside this CUDA 13.0 torch" in item.detail
    assert item.hint == readme_command("2.11", 13) and item.blocks == ("ll",)
    del s.versions["numpy"]
    item = dc.check_packages(s)[0]
    assert "missing numpy" in item.detail and item.blocks == ("ht", "ll")


def test_cubins_for_another_arch_and_corrupt_files():
    s = FakeSystem()
    s.gpu_list[1]["arch"] = "sm_100"
    items = {i.name: i for i in dc.check_cubins(s, s.gpu_list, aggressive=False)[0]}
    assert items["cubins for sm_90"].status == OK
    assert items["cubins for sm_100"].status == ERROR and "sm_100" in items["cubins for sm_100"].detail
    s = FakeSystem()
    s.corrupt = {"cu13/sm_90/aggressive/intranode.cubin"}
    safe = {i.name: i for i in dc.check_cubins(s, s.gpu_list, aggressive=False)[0]}
    assert safe["cubins for sm_90"].status == OK  # the safe variant is what loads
    agg = {i.name: i for i in dc.check_cubins(s, s.gpu_list, aggressive=True)[0]}
    assert agg["cubins for sm_90"].status == ERROR and "corrupt" in agg["cubins for sm_90"].detail
    s.manifest_doc = None
    assert dc.check_cubins(s, s.gpu_list, False)[0][0].status == ERROR


def test_nvlink_matrix():
    s = FakeSystem()
    item = dc.check_nvlink(s, s.gpu_list)[0]
    assert item.status == OK and len(item.extra) == 3
    assert item.extra[1].split() == ["0000:19:00.0", "-", "NV", "18"]
    s.p2p_ok = False
    item = dc.check_nvlink(s, s.gpu_list)[0]
    assert (
        item.status == WARNING and f"{BUS[0]} <-> {BUS[1]}" in item.detail and "EP_RT_SKIP_TOPOLOGY_CHECK" in item.hint
    )
    assert item.extra[2].split() == ["0000:3B:00.0", "no", "-", "18"]
    assert dc.check_nvlink(s, s.gpu_list[:1])[0].status == SKIP


def test_nvshmem_versions():
    s = FakeSystem()
    s.host_nvshmem = "3.3.9"  # older minor than the device library 3.4.5: NVSHMEM's rule says no
    item = dc.check_nvshmem(s, s.manifest_doc)[0]
    assert item.status == ERROR and "host minor >= device minor" in item.detail and ">=3.4,<4" in item.hint
    s.host_nvshmem = "3.7.2"  # a newer minor runs older device code
    assert dc.check_nvshmem(s, s.manifest_doc)[0].status == OK
    s.host_nvshmem = "4.0.0"
    assert dc.check_nvshmem(s, s.manifest_doc)[0].status == ERROR


def test_transports_and_their_prerequisites():
    s = FakeSystem()
    s.libs -= {"mlx5", "ucp"}
    s.dirs["/nvshmem/lib"].remove("nvshmem_transport_libfabric.so.3")
    st = {i.name: i for i in dc.check_transports(s, s.gpu_list)}
    assert st["transport IBGDA"].status == WARNING and "libmlx5" in st["transport IBGDA"].detail
    assert st["transport IBRC"].status == OK
    assert st["transport UCX"].status == WARNING and "libucp" in st["transport UCX"].detail
    assert "plugin nvshmem_transport_libfabric.so" in st["transport libfabric"].detail
    s.dirs["/sys/class/infiniband"] = []
    st = {i.name: i for i in dc.check_transports(s, s.gpu_list)}
    assert st["InfiniBand devices"].status == WARNING and "InfiniBand device" in st["transport IBRC"].detail


def test_gdrcopy():
    s = FakeSystem()
    assert dc.check_gdrcopy(s, s.gpu_list)[0].status == OK
    s.files.discard("/dev/gdrdrv")
    item = dc.check_gdrcopy(s, s.gpu_list)[0]
    assert item.status == WARNING and "/dev/gdrdrv" in item.detail and "libgdrapi" not in item.detail


def test_ibgda_driver_options_from_proc_or_sys():
    s = FakeSystem()
    assert set(statuses(dc.check_ibgda_driver(s)).values()) == {OK}
    s.texts["/proc/driver/nvidia/params"] = 'EnableStreamMemOPs: 0\nRegistryDwords: ""\n'
    items = dc.check_ibgda_driver(s)
    assert [i.status for i in items] == [WARNING, WARNING] and "NVreg_EnableStreamMemOPs=1" in items[0].hint
    del s.texts["/proc/driver/nvidia/params"]  # the module's parameter files instead
    s.dirs["/sys/module/nvidia/parameters"] = ["NVreg_EnableStreamMemOPs", "NVreg_RegistryDwords"]
    s.texts["/sys/module/nvidia/parameters/NVreg_EnableStreamMemOPs"] = "1\n"
    s.texts["/sys/module/nvidia/parameters/NVreg_RegistryDwords"] = "PeerMappingOverride=1;\n"
    assert set(statuses(dc.check_ibgda_driver(s)).values()) == {OK}
    del s.dirs["/sys/module/nvidia/parameters"]
    assert dc.check_ibgda_driver(s)[0].status == SKIP


def test_gpudirect_rdma():
    s = FakeSystem()
    s.files.discard("/sys/module/nvidia_peermem")
    assert "dma-buf" in dc.check_gpudirect_rdma(s)[0].detail  # open module on Linux 6.8
    s.release = "5.4.0-100-generic"
    item = dc.check_gpudirect_rdma(s)[0]
    assert item.status == WARNING and "5.4.0-100-generic < 5.12" in item.detail
    s.texts.pop("/proc/driver/nvidia/version")
    s.files.discard("/sys/module/nvidia")
    assert dc.check_gpudirect_rdma(s)[0].status == SKIP


def test_settings(tmp_path, monkeypatch):
    s = FakeSystem()
    s.env = {"EP_RT_TIMEOUT_S": "abc", "EP_RT_TIMOUT_S": "5", "NVSHMEM_DEBUG": "WARN", "PATH": "/bin"}
    for k, v in s.env.items():  # the env readers read os.environ, as Buffer does
        monkeypatch.setenv(k, v)
    items = {i.name: i for i in dc.check_settings(s)}
    assert "NVSHMEM_DEBUG=WARN" in items["settings"].detail and "PATH" not in items["settings"].detail
    assert items["unknown EP_RT_ variables"].detail == "EP_RT_TIMOUT_S"
    assert items["EP_RT_TIMEOUT_S"].status == ERROR
    bad = tmp_path / "c.json"
    bad.write_text("{}")
    s.env = {"EP_RT_CONFIG_FILE": str(bad)}
    items = {i.name: i for i in dc.check_settings(s)}
    assert (
        items["EP_RT_CONFIG_FILE"].status == ERROR and "not an ep_rt config file" in items["EP_RT_CONFIG_FILE"].detail
    )


def test_network_settings():
    s = FakeSystem()
    (item,) = dc.check_network(s, s.gpu_list)
    assert item.status == OK and "would use ibgda (DeepEP's default)" in item.detail
    assert "NVSHMEM_IBGDA_NUM_RC_PER_PE=24" in item.detail
    assert any(x.startswith("NVSHMEM_IB_SL = (unset)  [NVSHMEM default]") for x in item.extra)
    s.env = {"NVSHMEM_IBGDA_NUM_RC_PER_PE": "4"}  # what Buffer would refuse is an error here
    (item,) = dc.check_network(s, s.gpu_list)
    assert item.status == ERROR and "NVSHMEM_IBGDA_NUM_RC_PER_PE='4'" in item.detail
    s.env = {"NVSHMEM_IB_SL": "20"}
    assert dc.check_network(s, s.gpu_list)[0].status == ERROR
    s.env = {"EP_RT_REMOTE_TRANSPORT": "ucx", "NVSHMEM_IB_SL": "3"}
    items = {i.name: i for i in dc.check_network(s, s.gpu_list)}
    assert items["network settings"].status == OK and "UCX_IB_SL=3" in items["network settings"].detail
    assert "transport ucx needs GDRCopy" not in items  # the stand-in has GDRCopy
    s.libs.discard("gdrapi")
    items = {i.name: i for i in dc.check_network(s, s.gpu_list)}
    assert items["transport ucx needs GDRCopy"].status == ERROR
    s.env = {"EP_RT_REMOTE_TRANSPORT": "ibrc", "EP_RT_HCA_LIST_PER_LOCAL_RANK": "mlx5_1:1,mlx5_0:1"}
    (item,) = dc.check_network(s, s.gpu_list)
    assert item.status == OK and "NIC per local rank: 0: mlx5_1:1, 1: mlx5_0:1" in item.extra


def test_network_settings_auto_nic_preview():
    s = FakeSystem()
    paths = {
        "0000:19:00.0": "/sys/devices/pci0000:00/0000:00:01.0/0000:19:00.0",
        "0000:3b:00.0": "/sys/devices/pci0000:30/0000:30:01.0/0000:3b:00.0",
    }
    links = {f"/sys/bus/pci/devices/{b}": p for b, p in paths.items()}
    links.update(
        {
            "/sys/class/infiniband/mlx5_0/device": "/sys/devices/pci0000:30/0000:30:01.0/0000:3c:00.0",
            "/sys/class/infiniband/mlx5_1/device": "/sys/devices/pci0000:00/0000:00:01.0/0000:1a:00.0",
        }
    )
    s.realpath = lambda p: links.get(p, p)
    for nic in ("mlx5_0", "mlx5_1"):
        s.dirs[f"/sys/class/infiniband/{nic}/ports"] = ["1"]
        s.texts[f"/sys/class/infiniband/{nic}/ports/1/state"] = "4: ACTIVE"
    s.env = {"EP_RT_HCA_LIST_PER_LOCAL_RANK": "auto"}
    (item,) = dc.check_network(s, s.gpu_list)
    assert item.status == OK and "NIC per local rank: 0: mlx5_1:1, 1: mlx5_0:1" in item.extra


def test_smoke_failures_and_crashes():
    item = dc.smoke_item("smoke", lambda: [(10, []), (10, ["dispatch.recv_x: 3 elements differ"])])
    assert item.status == ERROR and "rank 1: dispatch.recv_x" in item.detail

    def crash():
        raise RuntimeError("--- rank 0 ---\nTraceback ...\nEpRtError: NVSHMEM initialisation failed (7)\n")

    item = dc.smoke_item("smoke", crash)
    assert item.status == ERROR and "NVSHMEM initialisation failed" in item.detail


def test_report_format_and_summary():
    items = [dc.Item("a", OK, "fine"), dc.Item("bb", WARNING, "hmm", "do this", ["row 1"]), dc.Item("c", SKIP, "-")]
    lines = doctor.format_items(items).splitlines()
    assert lines[0].split() == ["ok", "a", "fine"] and lines[1].endswith("hmm  -> do this")
    assert lines[2].strip() == "row 1" and lines[-1] == "1 ok, 1 warnings, 0 errors, 1 skipped"
    assert doctor.exit_code(items) == 0 and doctor.exit_code(items + [dc.Item("d", ERROR, "x")]) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path: this machine has a GPU")
def test_the_command_on_this_machine_without_gpu(capsys):
    from ep_rt.cli import main

    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "no CUDA GPU visible" in out and "NVSHMEM" in out and "smoke: intranode" in out
    assert max(len(line) for line in out.splitlines()) <= 120
    assert "WARNING" not in out, out  # nothing about transports or GDRCopy on a machine with no GPU
    for line in out.splitlines()[1:-1]:
        assert line.split()[0] in ("ok", "WARNING", "ERROR", "skip") or line.startswith(" "), line


def test_a_cuda12_torch_with_its_cu12_nvshmem_is_all_ok():
    items = run(cuda12_system(), smoke=True, run_ranks=lambda fn, r, g: [(40, []), (40, [])])
    bad = {n: st for n, st in statuses(items).items() if st != OK}
    assert bad == {}, bad
    text = doctor.format_items(items)
    assert "nvidia-nvshmem-cu13" not in text and "nvidia-nvshmem-cu12 3.4.5" in text
    assert "host 3.4.5 (cu12) runs" in text


def test_a_cuda12_torch_without_its_nvshmem_gets_the_tables_command_and_the_intranode_smoke_round():
    s = cuda12_system()
    del s.versions["nvidia-nvshmem-cu12"]
    s.versions["nvidia-nvshmem-cu13"] = "3.4.5"  # the other flavour: never the one to install here
    ran = []
    items = run(s, smoke=True, run_ranks=lambda fn, r, g: ran.append(fn.__name__) or [(40, []), (40, [])])
    by = {i.name: i for i in items}
    pk = by["packages"]
    assert pk.status == ERROR and "nvidia-nvshmem-cu13 3.4.5 is the other flavour" in pk.detail
    assert pk.hint == readme_command("2.10", 12) and "[cu12]" in pk.hint and "cu13" not in pk.hint
    assert by["NVSHMEM"].status == SKIP and "see packages" in by["NVSHMEM"].detail
    assert ran == ["smoke_ht"], ran  # the intranode round needs no NVSHMEM: it runs
    ll = [i for i in items if i.name.startswith("smoke: low-latency")][0]
    assert ll.status == SKIP and "packages" in ll.detail


@pytest.mark.parametrize("driver,status", [((12, 8), ERROR), ((13, 0), WARNING)])
def test_cuda_bindings_13_beside_a_cuda12_torch(driver, status):
    """torch 2.9's CUDA 12 wheels pin no cuda-bindings: a plain install takes 13.x, which refuses drivers < r580."""
    s = cuda12_system()
    s.torch, s.cuda = {"version": "2.9.1+cu128", "cuda": "12.8"}, driver
    s.versions.update({"cuda-bindings": "13.0.3", "nvidia-nvshmem-cu12": "3.3.20"})
    (item,) = dc.check_packages(s)
    assert item.status == status and "cuda-bindings 13 refuses drivers below r580" in item.detail
    assert item.hint == readme_command("2.9", 12)


def test_one_nvshmem_error_is_said_once_and_blocks_only_the_low_latency_round():
    s = FakeSystem()
    message = "no NVSHMEM host library (the nvidia.nvshmem package is not installed)"

    def broken():
        raise RuntimeError(message + ': pip install "./ep_rt-0.1.0-py3-none-any.whl[cu13]"')

    s.nvshmem_host_version = s.nvshmem_lib_dir = broken
    s.host_flavour = None
    ran = []
    items = run(s, smoke=True, run_ranks=lambda fn, r, g: ran.append(fn.__name__) or [(40, []), (40, [])])
    text = doctor.format_items(items)
    assert text.count("nvidia.nvshmem package is not installed") == 1, text
    by = {i.name: i for i in items}
    assert by["NVSHMEM"].status == ERROR and by["NVSHMEM"].hint == readme_command("2.11", 13)
    assert by["remote transports"].status == SKIP and "see NVSHMEM" in by["remote transports"].detail
    assert by["cubins for sm_90"].status == OK and "see NVSHMEM" in by["cubins for sm_90"].detail
    assert ran == ["smoke_ht"]


def test_no_gpu_gives_no_transport_or_gdrcopy_warnings():
    s = FakeSystem()
    s.gpu_list, s.libs, s.files, s.dirs = [], set(), set(), {}
    items = run(s)
    st = statuses(items)
    assert st["remote transports"] == st["GDRCopy"] == st["RDMA write ordering"] == SKIP
    assert not [n for n in st if n.startswith(("transport ", "InfiniBand"))]
    assert {i.detail for i in items if i.name in ("remote transports", "GDRCopy")} == {"no GPU"}


def test_the_two_flavours_cubins_are_listed_apart():
    s = FakeSystem()
    s.manifest_doc["cubins"].append(
        {
            **MANIFEST["cubins"][2],
            "flavour": "cu12",
            "arch": "sm_80",
            "compiler": "nvrtc 12.9.86",
            "path": "cu12/sm_80/default/layout.cubin",
        }
    )
    items = {i.name: i for i in dc.check_cubins(s, s.gpu_list, False)[0]}
    assert items["cubins cu12"].detail.startswith("sm_80: layout (default); built with nvrtc 12.9.86")
    assert "sm_80" not in items["cubins cu13"].detail and "nvrtc" not in items["cubins cu13"].detail
    assert "intranode (aggressive/safe)" in items["cubins cu13"].detail


@pytest.mark.parametrize(
    "ordering,status,words",
    [
        (100, OK, "OWNER: only the GPU that owns the memory reads NIC writes consistently"),
        (200, OK, "ALL_DEVICES: the owning GPU and its NVLink peers read NIC writes consistently"),
        (0, WARNING, "NONE: no ordering promised"),
    ],
)
def test_rdma_write_ordering_per_gpu(ordering, status, words):
    s = FakeSystem()
    s.rdma = {"supported": 1, "ordering": ordering, "flush_options": 3}
    items = dc.check_rdma_ordering(s, s.gpu_list)
    assert [i.name for i in items] == ["GPU 0 RDMA write ordering", "GPU 1 RDMA write ordering"]
    assert all(i.status == status and words in i.detail for i in items), items
    assert "flush options: HOST (cuFlushGPUDirectRDMAWrites), MEMOPS" in items[0].detail
    s.rdma = RuntimeError("cuDeviceGetAttribute failed")
    assert dc.check_rdma_ordering(s, s.gpu_list)[0].status == WARNING


@pytest.mark.parametrize(
    "native,words",
    [
        (0, "CUDA's rules do not cover the CPU and the GPU using one host word at once"),
        (1, "CUDA's rules cover the CPU and the GPU using one host word at once"),
    ],
)
def test_host_mapped_words_per_gpu_say_whether_cuda_promises_what_ep_rt_does_with_them(native, words):
    s = FakeSystem()
    s.host = {"host_native_atomic": native, "concurrent_managed": 1}
    items = dc.check_host_words(s, s.gpu_list)
    assert [i.name for i in items] == ["GPU 0 host-mapped words", "GPU 1 host-mapped words"]
    assert all(i.status == OK and words in i.detail for i in items), items
    assert ("DeepEP's mapped counters" in items[0].detail) == (not native)
    assert items[0].detail.endswith("concurrent managed memory access: yes")
    s.host = RuntimeError("cuDeviceGetAttribute failed")
    assert dc.check_host_words(s, s.gpu_list)[0].status == WARNING
    assert dc.check_host_words(s, [])[0].status == SKIP


def test_the_driver_reads_the_host_memory_attributes_through_its_checked_call(monkeypatch):
    from types import SimpleNamespace

    from ep_rt.errors import CudaDriverError
    from ep_rt.runtime import driver

    names = ["CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED", "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS"]
    values = {names[0]: 0, names[1]: 1}
    fail = set()
    fake = SimpleNamespace(
        CUresult=SimpleNamespace(CUDA_SUCCESS=0),
        CUdevice_attribute=SimpleNamespace(**{n: n for n in names}),
        cuDeviceGet=lambda i: (0, f"dev{i}"),
        cuDeviceGetAttribute=lambda attr, dev: (1 if attr in fail else 0, values[attr]),
        cuGetErrorName=lambda e: (0, b"CUDA_ERROR_INVALID_VALUE"),
        cuGetErrorString=lambda e: (0, b"invalid argument"),
    )
    monkeypatch.setattr(driver, "_cu", lambda: fake)
    monkeypatch.setattr(driver, "_initialised", lambda: True)
    assert driver.host_memory_attributes(0) == {"host_native_atomic": 0, "concurrent_managed": 1}
    fail.add(names[0])
    with pytest.raises(CudaDriverError, match="HOST_NATIVE_ATOMIC_SUPPORTED.*CUDA_ERROR_INVALID_VALUE"):
        driver.host_memory_attributes(0)


def test_no_line_is_longer_than_120_characters():
    s = FakeSystem()
    s.env = {"EP_RT_REMOTE_TRANSPORT": "ucx", "NVSHMEM_IB_SL": "3"}
    for system in (s, cuda12_system()):
        text = doctor.format_items(run(system, smoke=True, run_ranks=lambda fn, r, g: [(40, []), (40, [])]))
        long = [line for line in text.splitlines() if len(line) > 120]
        assert not long, long


def test_the_driver_reads_the_rdma_attributes_through_its_checked_call(monkeypatch):
    from types import SimpleNamespace

    from ep_rt.errors import CudaDriverError
    from ep_rt.runtime import driver

    names = [
        "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED",
        "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING",
        "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS",
    ]
    values = {names[0]: 1, names[1]: 200, names[2]: 2}
    asked = []
    fail = set()

    def get_attribute(attr, dev):
        asked.append((attr, dev))
        return (1 if attr in fail else 0, values[attr])

    fake = SimpleNamespace(
        CUresult=SimpleNamespace(CUDA_SUCCESS=0),
        CUdevice_attribute=SimpleNamespace(**{n: n for n in names}),
        cuDeviceGet=lambda i: (0, f"dev{i}"),
        cuDeviceGetAttribute=get_attribute,
        cuGetErrorName=lambda e: (0, b"CUDA_ERROR_INVALID_VALUE"),
        cuGetErrorString=lambda e: (0, b"invalid argument"),
    )
    monkeypatch.setattr(driver, "_cu", lambda: fake)
    monkeypatch.setattr(driver, "_initialised", lambda: True)
    assert driver.gpudirect_rdma_attributes(1) == {"supported": 1, "ordering": 200, "flush_options": 2}
    assert asked == [(n, "dev1") for n in names]
    fail.add(names[1])
    with pytest.raises(CudaDriverError, match="GPU_DIRECT_RDMA_WRITES_ORDERING.*CUDA_ERROR_INVALID_VALUE"):
        driver.gpudirect_rdma_attributes(0)


def test_an_error_keeps_its_cause_and_leaves_the_install_hint_to_the_item():
    from ep_rt.transport import nvshmem_dist

    for flavour in ("cu12", None):
        e = RuntimeError("no NVSHMEM host library (not installed): " + nvshmem_dist.install_hint(flavour))
        assert dc._cause(e) == "RuntimeError: no NVSHMEM host library (not installed)"


def test_the_hint_command_stays_copyable_in_the_report():
    """A wrapped hint keeps each command of the table's row whole on one line (two commands split after &&)."""
    s = cuda12_system()
    del s.versions["nvidia-nvshmem-cu12"]
    s.torch = {"version": "2.12.0+cu126", "cuda": "12.6"}
    lines = doctor.format_items(run(s)).splitlines()
    first, second = readme_command("2.12", 12).split(" && ")
    assert any(line.strip() == f"-> {first} &&" for line in lines), lines
    assert any(line.strip() == second for line in lines), lines
    assert max(map(len, lines)) <= 120
