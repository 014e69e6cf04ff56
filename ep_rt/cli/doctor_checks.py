"""The checks of `python -m ep_rt doctor`. Each takes the System (doctor_probe) and what earlier checks found, and
returns Items: one line each, status ok / warning / error / skip, with a hint saying what to do."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

OK, WARNING, ERROR, SKIP = "ok", "warning", "error", "skip"


@dataclass
class Item:
    name: str
    status: str
    detail: str
    hint: str = ""
    extra: list = field(default_factory=list)  # lines printed under the item (the NVLink matrix)
    blocks: tuple = ("ht", "ll")  # the smoke rounds an ERROR here makes pointless (NVSHMEM trouble: only "ll")


def _why(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _cause(e: Exception) -> str:
    """_why without the install hint an ep_rt error may end with (the item's own hint says what to run)."""
    text = _why(e)
    for start in (": pip install ", ": beside a CUDA "):  # nvshmem_dist.install_hint's two forms
        text = text.split(start)[0]
    return text


# ---- software ----------------------------------------------------------------------------------------

PACKAGES = ("cuda-bindings", "nvidia-ml-py", "numpy")
NVSHMEM_PACKAGES = {"cu12": "nvidia-nvshmem-cu12", "cu13": "nvidia-nvshmem-cu13"}


def torch_flavour(t: dict) -> str | None:
    """cu12 / cu13 from the CUDA version torch was built for (None: a CPU build)."""
    return f"cu{t['cuda'].split('.')[0]}" if t["cuda"] else None


def check_packages(s) -> list[Item]:
    """ep_rt's requirements beside this torch, by the rule of README "Installing" (ep_rt.installing): the NVSHMEM
    distribution of torch's own CUDA major, and for a CUDA 12 torch cuda-bindings 12.9.x. A mismatch names the
    table's command for this torch, which never installs the other flavour."""
    import os

    from .. import __file__ as package_file, __version__, installing

    t = s.torch_info()
    nvshmem = {f: s.package_version(p) for f, p in NVSHMEM_PACKAGES.items()}
    versions = [f"{p} {s.package_version(p) or 'missing'}" for p in PACKAGES]
    versions += [f"{NVSHMEM_PACKAGES[f]} {v}" for f, v in nvshmem.items() if v] or ["no NVSHMEM package"]
    detail = (
        f"ep_rt {__version__} ({os.path.dirname(package_file)}), Python {s.python_version()}, torch "
        f"{t['version']} ({'CUDA ' + t['cuda'] if t['cuda'] else 'CPU-only'}), {', '.join(versions)}"
    )
    command = installing.command_for(t["version"], t["cuda"])
    if t["cuda"] is None:
        return [Item("packages", ERROR, detail, f"this torch is a CPU-only build: {command}")]
    flavour = torch_flavour(t)
    problems, status, blocks = [], OK, set()

    def problem(text, level, blocked):
        nonlocal status
        problems.append(text)
        status = ERROR if ERROR in (status, level) else WARNING
        blocks.update(blocked if level == ERROR else ())

    missing = [p for p in PACKAGES if s.package_version(p) is None]
    if missing:
        problem(f"missing {', '.join(missing)}", ERROR, ("ht", "ll"))
    if flavour in NVSHMEM_PACKAGES and nvshmem[flavour] is None:
        others = [f"{NVSHMEM_PACKAGES[f]} {v}" for f, v in nvshmem.items() if v]
        problem(
            f"no {NVSHMEM_PACKAGES[flavour]} beside this CUDA {t['cuda']} torch (low-latency and internode calls "
            f"need it)" + (f"; {', '.join(others)} is the other flavour" if others else ""),
            ERROR,
            ("ll",),
        )
    bindings = s.package_version("cuda-bindings")
    if flavour == "cu12" and bindings and int(bindings.split(".")[0]) >= 13:
        try:
            driver = s.cuda_driver_version()
        except Exception:
            driver = None
        why = f"cuda-bindings {bindings} beside a CUDA 12 torch: cuda-bindings 13 refuses drivers below r580 (CUDA 13)"
        if driver is not None and driver < (13, 0):
            problem(f"{why}, and this driver supports CUDA {driver[0]}.{driver[1]}", ERROR, ("ht", "ll"))
        else:
            problem(f"{why}; this driver runs it, an older one would not", WARNING, ())
    if not problems:
        return [Item("packages", OK, detail)]
    return [Item("packages", status, "; ".join(problems) + f" ({detail})", command, blocks=tuple(sorted(blocks)))]


# ---- driver and GPUs ---------------------------------------------------------------------------------


def check_driver(s, manifest: dict | None) -> list[Item]:
    """NVML's driver version and the CUDA version the driver supports, against the nvcc the cubins need."""
    try:
        nvml = s.nvml_driver_version()
    except Exception as e:
        return [
            Item(
                "driver",
                ERROR,
                f"no NVIDIA driver ({_why(e)})",
                "install the NVIDIA driver (in a container: run it with the GPUs, e.g. --gpus all)",
            )
        ]
    try:
        major, minor = s.cuda_driver_version()
    except Exception as e:
        return [
            Item(
                "driver",
                ERROR,
                f"NVIDIA driver {nvml}, but the CUDA driver API failed ({_why(e)})",
                "libcuda.so must be loadable: reinstall the driver or check LD_LIBRARY_PATH",
            )
        ]
    detail = f"NVIDIA driver {nvml}, supports CUDA {major}.{minor}"
    version = 1000 * major + 10 * minor
    floors = {e.get("flavour"): e.get("min_driver") for e in (manifest or {}).get("cubins", []) if e.get("min_driver")}
    runnable = sorted(f for f, floor in floors.items() if floor <= version)
    if floors and not runnable:
        need = min(floors.values())
        return [
            Item(
                "driver",
                ERROR,
                detail + f"; every shipped cubin flavour needs CUDA "
                f"{need // 1000}.{need % 1000 // 10} or newer ({', '.join(sorted(floors))})",
                f"update the driver to one that supports CUDA {need // 1000}.{need % 1000 // 10} or newer",
            )
        ]
    if runnable:
        detail += f"; cubin flavours it runs: {', '.join(runnable)}"
    return [Item("driver", OK, detail)]


def check_gpus(s) -> tuple[list[Item], list[dict]]:
    try:
        gpus = s.gpus()
    except Exception as e:
        return [
            Item(
                "GPUs",
                ERROR,
                f"cannot list GPUs ({_why(e)})",
                "python -c 'import torch; print(torch.cuda.is_available())' should say True",
            )
        ], []
    if not gpus:
        return [Item("GPUs", ERROR, "no CUDA GPU visible", "check CUDA_VISIBLE_DEVICES and nvidia-smi")], []
    return [
        Item(f"GPU {g['index']}", OK, f"{g['name']}, {g['arch']}, {g['sms']} SMs, PCI {g['bus_id']}") for g in gpus
    ], gpus


# ---- cubins ------------------------------------------------------------------------------------------


def check_cubins(s, gpus: list[dict], aggressive: bool) -> tuple[list[Item], dict | None]:
    from .. import env
    from ..runtime import choice

    try:
        root, manifest = s.manifest()
    except Exception as e:
        return [
            Item(
                "cubins",
                ERROR,
                f"no usable cubin manifest ({_why(e)})",
                "reinstall ep_rt, or point EP_RT_CUBIN_DIR at a folder with manifest.json",
            )
        ], None
    shipped, compilers = {}, {}
    for e in manifest["cubins"]:
        flavour = e.get("flavour", "?")
        shipped.setdefault(flavour, {}).setdefault(e["arch"], {}).setdefault(e["family"], set()).add(e["variant"])
        compilers.setdefault(flavour, set()).add(str(e.get("compiler")))
    items = []
    for flavour, archs in sorted(shipped.items()):
        listing = "; ".join(
            f"{arch}: " + ", ".join(f"{fam} ({'/'.join(sorted(v))})" for fam, v in sorted(fams.items()))
            for arch, fams in sorted(archs.items())
        )
        items.append(Item(f"cubins {flavour}", OK, f"{listing}; built with {', '.join(sorted(compilers[flavour]))}"))
    items[0].detail += f"; in {root}"
    if not gpus:
        return items + [Item("cubins for this GPU", SKIP, "no GPU: nothing to load")], manifest
    try:
        major, minor = s.cuda_driver_version()
    except Exception as e:
        return items + [
            Item(
                "cubins for this GPU",
                ERROR,
                f"the driver cannot tell its CUDA version ({_why(e)})",
                "check the NVIDIA driver (nvidia-smi)",
            )
        ], manifest
    driver_version = 1000 * major + 10 * minor
    nvshmem_flavour = s.nvshmem_flavour() if hasattr(s, "nvshmem_flavour") else None
    linked = {e["family"] for e in manifest["cubins"] if e.get("needs_nvshmem")}
    undecided = sorted(linked) if nvshmem_flavour is None and env.cubin_flavour() is None else []
    for arch in sorted({g["arch"] for g in gpus}):
        loads, problems = [], []
        cc = choice.parse_arch(arch)[:2]
        for family in sorted({e["family"] for e in manifest["cubins"]} - set(undecided)):
            try:
                entry = choice.choose_entry(
                    manifest, family, cc, aggressive, driver_version, env.cubin_flavour(), nvshmem_flavour
                )
                s.verify_cubin(root, entry)
                loads.append(entry["path"])
            except Exception as e:
                problems.append(_why(e))
        archs = sorted({a for fl in shipped.values() for a in fl})
        if problems:
            items.append(
                Item(
                    f"cubins for {arch}",
                    ERROR,
                    "; ".join(problems),
                    f"ep_rt ships cubins for {archs}; rebuild with tools/build_cubins.py for "
                    f"{arch}, or reinstall ep_rt if a file is corrupt",
                )
            )
        else:
            variant = "aggressive (EP_RT_AGGRESSIVE_PTX=1)" if aggressive else "safe"
            later = f"; {', '.join(undecided)}: by the NVSHMEM library's flavour (see NVSHMEM)" if undecided else ""
            items.append(Item(f"cubins for {arch}", OK, f"loads {', '.join(loads)} ({variant} variant){later}"))
    return items, manifest


# ---- NVLink ------------------------------------------------------------------------------------------


def check_nvlink(s, gpus: list[dict]) -> list[Item]:
    if len(gpus) < 2:
        return [Item("NVLink", SKIP, "fewer than 2 GPUs: nothing to connect" if gpus else "no GPU")]
    ids = [g["bus_id"] for g in gpus]
    try:
        found = s.nvlink(ids)
    except Exception as e:
        return [Item("NVLink", ERROR, f"NVML cannot tell ({_why(e)})", "check the driver (nvidia-smi topo -m)")]
    p2p, links = found["p2p"], found["links"]
    width = max(len(i) for i in ids)
    extra = [" " * (width + 2) + " ".join(f"GPU{j:<3}" for j in range(len(ids))) + "  active links"]
    for i, a in enumerate(ids):
        cells = ["  -   " if a == b else (" NV   " if p2p[(a, b)] else " no   ") for b in ids]
        extra.append(f"{a:<{width}}  " + " ".join(cells) + f"  {links.get(a, 0)}")
    missing = [f"{a} <-> {b}" for i, a in enumerate(ids) for b in ids[i + 1 :] if not p2p[(a, b)]]
    if missing:
        return [
            Item(
                "NVLink",
                WARNING,
                f"{len(missing)} GPU pairs without NVLink: {', '.join(missing)}",
                "ep_rt's intranode kernels need NVLink between the GPUs of a node (use those GPUs only, or "
                "EP_RT_SKIP_TOPOLOGY_CHECK=1 to try PCIe)",
                extra,
            )
        ]
    return [Item("NVLink", OK, f"all {len(ids)} GPUs are NVLink peers (NVML P2P, by PCI bus id)", extra=extra)]


# ---- NVSHMEM -----------------------------------------------------------------------------------------


def check_nvshmem(s, manifest: dict | None, package_missing: bool = False) -> list[Item]:
    """The host library against the device library of the NVSHMEM-linked cubins of its flavour, by NVSHMEM's rule
    (same major, host minor >= device minor; ep_rt.transport.nvshmem_dist). Only the low-latency and internode calls
    need it, so its errors block only the low-latency smoke round. With `package_missing` (the packages item
    already says so) it only points there."""
    from .. import installing
    from ..transport import nvshmem_dist

    if package_missing:
        return [Item("NVSHMEM", SKIP, "no NVSHMEM package of this torch's flavour (see packages)")]
    t = s.torch_info()
    command = installing.command_for(t["version"], t["cuda"])
    flavour = s.nvshmem_flavour() if hasattr(s, "nvshmem_flavour") else None
    linked = [e for e in (manifest or {}).get("cubins", []) if e.get("needs_nvshmem")]
    mine = [e for e in linked if flavour is None or e.get("flavour", flavour) == flavour] or linked
    devices = sorted({e.get("nvshmem") for e in mine if e.get("nvshmem")})
    try:
        host = s.nvshmem_host_version()
    except Exception as e:
        return [Item("NVSHMEM", ERROR, f"host library not loadable ({_cause(e)})", command, blocks=("ll",))]
    if not devices:
        return [
            Item(
                "NVSHMEM",
                WARNING,
                f"host {host}; no NVSHMEM-linked cubin in the manifest",
                "the low-latency mode needs the low_latency cubin: reinstall ep_rt",
            )
        ]
    which = f"{flavour} " if flavour else ""
    for device in devices:
        problem = nvshmem_dist.compatibility_problem(host, device, ibgda=False)
        if problem:
            return [
                Item(
                    "NVSHMEM",
                    ERROR,
                    f"host library {host}, {which}device library {device}: {problem}",
                    f"an NVSHMEM host library in {nvshmem_dist.host_range(device, False)}: {command}",
                    blocks=("ll",),
                )
            ]
    return [
        Item(
            "NVSHMEM",
            OK,
            f"host {host} ({flavour or 'flavour unknown'}) runs the {which}low-latency cubins' "
            f"device library {', '.join(devices)} (same major, host minor >= device minor)",
        )
    ]


# Remote transports NVSHMEM ships as plugins, with what each needs from the system.
TRANSPORTS = {
    "IBGDA": {"plugin": "ibgda", "libs": ("ibverbs", "mlx5"), "ib": True},
    "IBRC": {"plugin": "ibrc", "libs": ("ibverbs",), "ib": True},
    "UCX": {"plugin": "ucx", "libs": ("ucp",), "ib": False},
    "libfabric": {"plugin": "libfabric", "libs": ("fabric",), "ib": False},
}
NOT_NEEDED = "only low-latency calls across nodes need a remote transport; one node uses NVLink"


def check_transports(s, gpus: list[dict]) -> list[Item]:
    if not gpus:
        return [Item("remote transports", SKIP, "no GPU")]
    try:
        lib_dir = s.nvshmem_lib_dir()
        plugins = s.listdir(lib_dir)
    except Exception:
        return [Item("remote transports", SKIP, "no NVSHMEM host library (see NVSHMEM)")]
    ib = s.listdir("/sys/class/infiniband")
    items = [
        Item("InfiniBand devices", OK, ", ".join(ib))
        if ib
        else Item("InfiniBand devices", WARNING, "none under /sys/class/infiniband", NOT_NEEDED)
    ]
    for name, need in TRANSPORTS.items():
        missing = []
        if not any(f.startswith(f"nvshmem_transport_{need['plugin']}.so") for f in plugins):
            missing.append(f"plugin nvshmem_transport_{need['plugin']}.so in {lib_dir}")
        missing += [f"lib{lib}" for lib in need["libs"] if s.find_library(lib) is None]
        if need["ib"] and not ib:
            missing.append("an InfiniBand device")
        if missing:
            items.append(
                Item(f"transport {name}", WARNING, "cannot initialise here: missing " + ", ".join(missing), NOT_NEEDED)
            )
        else:
            items.append(Item(f"transport {name}", OK, "plugin and prerequisites present"))
    return items


def check_gdrcopy(s, gpus: list[dict]) -> list[Item]:
    if not gpus:
        return [Item("GDRCopy", SKIP, "no GPU")]
    lib, dev = s.find_library("gdrapi"), s.exists("/dev/gdrdrv")
    if lib and dev:
        return [Item("GDRCopy", OK, f"{lib}, /dev/gdrdrv")]
    missing = ", ".join(m for m, have in (("libgdrapi", lib), ("/dev/gdrdrv (the gdrdrv module)", dev)) if not have)
    return [
        Item(
            "GDRCopy",
            WARNING,
            f"not available: missing {missing}",
            "NVSHMEM's proxy transports (IBRC, UCX) signal faster with GDRCopy; not needed on one node",
        )
    ]


# ---- the driver's IBGDA settings -----------------------------------------------------------------------


def driver_params(s) -> dict | None:
    """The NVIDIA kernel module's parameters: /proc/driver/nvidia/params ("Name: value" lines), else
    /sys/module/nvidia/parameters/NVreg_* files; None when neither is there (no driver loaded)."""
    text = s.read_text("/proc/driver/nvidia/params")
    if text is not None:
        params = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                params[key.strip()] = value.strip().strip('"')
        return params
    folder = "/sys/module/nvidia/parameters"
    names = s.listdir(folder)
    if not names:
        return None
    return {n.removeprefix("NVreg_"): (s.read_text(f"{folder}/{n}") or "").strip().strip('"') for n in names}


IBGDA_HINT = (
    "for IBGDA across nodes (DeepEP's install guide): options nvidia NVreg_EnableStreamMemOPs=1 "
    'NVreg_RegistryDwords="PeerMappingOverride=1;" in /etc/modprobe.d/nvidia.conf, update the initramfs, '
    "reboot; " + NOT_NEEDED
)


def check_ibgda_driver(s) -> list[Item]:
    params = driver_params(s)
    if params is None:
        return [Item("IBGDA driver options", SKIP, "no NVIDIA kernel module loaded")]
    items = []
    mem_ops = params.get("EnableStreamMemOPs")
    items.append(
        Item(
            "IBGDA: NVreg_EnableStreamMemOPs",
            OK if mem_ops == "1" else WARNING,
            f"= {mem_ops if mem_ops is not None else 'not reported'}",
            "" if mem_ops == "1" else IBGDA_HINT,
        )
    )
    dwords = params.get("RegistryDwords", "")
    override = "PeerMappingOverride=1" in dwords.replace(" ", "")
    items.append(
        Item(
            "IBGDA: PeerMappingOverride",
            OK if override else WARNING,
            f"NVreg_RegistryDwords = {dwords!r}",
            "" if override else IBGDA_HINT,
        )
    )
    return items


def check_gpudirect_rdma(s) -> list[Item]:
    version = s.read_text("/proc/driver/nvidia/version")
    if version is None and not s.exists("/sys/module/nvidia"):
        return [Item("GPUDirect RDMA", SKIP, "no NVIDIA kernel module loaded")]
    if s.exists("/sys/module/nvidia_peermem"):
        return [Item("GPUDirect RDMA", OK, "nvidia_peermem is loaded")]
    release = s.kernel_release()
    m = re.match(r"(\d+)\.(\d+)", release)
    new_kernel = bool(m) and (int(m.group(1)), int(m.group(2))) >= (5, 12)
    open_module = "Open Kernel Module" in (version or "")
    if new_kernel and open_module:
        return [Item("GPUDirect RDMA", OK, f"dma-buf (Linux {release}, open GPU kernel module)")]
    why = [] if new_kernel else [f"Linux {release} < 5.12"]
    why += [] if open_module else ["not the open GPU kernel module"]
    return [
        Item(
            "GPUDirect RDMA",
            WARNING,
            "no nvidia_peermem, and no dma-buf (" + ", ".join(why) + ")",
            "modprobe nvidia_peermem, or use the open GPU kernel module on Linux >= 5.12; " + NOT_NEEDED,
        )
    ]


# What CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING promises (CUGPUDirectRDMAWritesOrdering), in plain words.
RDMA_ORDERING = {
    0: ("NONE", "no ordering promised: even the GPU that owns the memory may see a NIC's writes out of order"),
    100: ("OWNER", "only the GPU that owns the memory reads NIC writes consistently; its NVLink peers may not"),
    200: ("ALL_DEVICES", "the owning GPU and its NVLink peers read NIC writes consistently"),
}
RDMA_FLUSH = {1: "HOST (cuFlushGPUDirectRDMAWrites)", 2: "MEMOPS (stream wait-value flush)"}


def _per_gpu(gpus: list[dict], what: str, probe, judge) -> list[Item]:
    """One item per GPU, "GPU <index> <what>", from the driver's answer probe(index) judged by judge(answer) ->
    (status, detail) or (status, detail, hint); a driver that cannot answer gives a warning; no GPU, one skip."""
    if not gpus:
        return [Item(what, SKIP, "no GPU")]
    items = []
    for g in gpus:
        name = f"GPU {g['index']} {what}"
        try:
            answer = probe(g["index"])
        except Exception as e:
            items.append(Item(name, WARNING, f"the driver cannot tell ({_why(e)})", "check the driver (nvidia-smi)"))
            continue
        items.append(Item(name, *judge(answer)))
    return items


def check_rdma_ordering(s, gpus: list[dict]) -> list[Item]:
    """Per GPU: how the driver orders a NIC's writes into its memory for CUDA readers, and how they can be
    flushed (only ranks on other nodes depend on it)."""

    def judge(a) -> tuple:
        label, meaning = RDMA_ORDERING.get(a["ordering"], (f"unknown value {a['ordering']}", "not in CUDA's list"))
        flush = ", ".join(v for bit, v in RDMA_FLUSH.items() if a["flush_options"] & bit) or "none"
        detail = (
            f"{label}: {meaning}; flush options: {flush}; GPUDirect RDMA "
            f"{'supported' if a['supported'] else 'not supported'}"
        )
        if a["ordering"] in (100, 200):
            return OK, detail
        return (
            WARNING,
            detail,
            "only ranks on other nodes depend on it (a NIC writes into this GPU's memory); on one node nothing does",
        )

    return _per_gpu(gpus, "RDMA write ordering", s.gpudirect_rdma, judge)


def check_host_words(s, gpus: list[dict]) -> list[Item]:
    """Per GPU: whether CUDA's rules cover what ep_rt does with host-mapped words (the HT dispatch's counts, which
    the host waits for while the kernel runs, and the error records): the CPU and the GPU touch them at once. The
    CUDA C++ library allows that for an atomic in host memory only with HOST_NATIVE_ATOMIC_SUPPORTED, which PCIe
    hosts do not have. Informational: ep_rt keeps one writer per word, volatile stores and plain loads, as DeepEP's
    mapped counters do, and nothing the user sets changes it."""

    def judge(a) -> tuple:
        if a["host_native_atomic"]:
            detail = "native host atomics: CUDA's rules cover the CPU and the GPU using one host word at once"
        else:
            detail = (
                "no native host atomics (a PCIe host): CUDA's rules do not cover the CPU and the GPU using one "
                "host word at once; ep_rt's host wait and error records do so as DeepEP's mapped counters do "
                "(one writer, volatile stores, plain loads), not promised by CUDA"
            )
        managed = "yes" if a["concurrent_managed"] else "no"
        return OK, f"{detail}; concurrent managed memory access: {managed}"

    return _per_gpu(gpus, "host-mapped words", s.host_memory, judge)


# ---- settings ----------------------------------------------------------------------------------------


def check_settings(s) -> list[Item]:
    from .. import config_file, env

    environ = s.environ()
    shown = sorted(k for k in environ if k.startswith(("EP_RT_", "NVSHMEM_")))
    items = [
        Item(
            "settings",
            OK,
            ", ".join(f"{k}={environ[k]}" for k in shown)
            if shown
            else "no EP_RT_ or NVSHMEM_ variables set (defaults)",
        )
    ]
    unknown = [k for k in shown if k.startswith("EP_RT_") and k not in env.KNOBS]
    if unknown:
        items.append(
            Item(
                "unknown EP_RT_ variables",
                WARNING,
                ", ".join(unknown),
                f"ep_rt reads only {', '.join(env.KNOBS)} (README 'Environment knobs')",
            )
        )
    readers = {
        "EP_RT_TIMEOUT_S": env.timeout_s,
        "EP_RT_RANKS_PER_NODE": env.ranks_per_node,
        "EP_RT_TOPK_IDX_BITS": env.topk_idx_bits,
    }
    for name, read in readers.items():
        if name in environ:
            try:
                read()
            except ValueError as e:
                items.append(Item(name, ERROR, str(e), "fix or unset it"))
    path = environ.get("EP_RT_CONFIG_FILE")
    if path:
        try:
            found = config_file.load(path)
            items.append(
                Item(
                    "EP_RT_CONFIG_FILE",
                    OK,
                    f"{path}: " + ", ".join(f"{k} x{r}: num_sms={c.num_sms}" for (k, r), c in sorted(found.items())),
                )
            )
        except Exception as e:
            items.append(Item("EP_RT_CONFIG_FILE", ERROR, str(e), "rewrite it with python -m ep_rt tune, or unset it"))
    return items


# ---- network settings --------------------------------------------------------------------------------


def check_network(s, gpus: list[dict]) -> list[Item]:
    """The NVSHMEM and network settings an internode Buffer with DeepEP's defaults (num_qps_per_rank=24) would run
    with here (transport.network_settings): conflicts and bad values are errors, as Buffer would raise them; a
    transport that needs GDRCopy without it is an error; the NIC of each local rank when EP_RT_HCA_LIST_PER_LOCAL_RANK
    pins them."""
    from ..errors import NetworkSettingError
    from ..transport import network_settings as ns

    environ = s.environ()
    sysfs = (s.listdir, s.read_text, s.realpath) if hasattr(s, "realpath") else None
    auto = (environ.get("EP_RT_HCA_LIST_PER_LOCAL_RANK") or "").strip().lower() == "auto"
    place = ns.HostPlace(0, None, tuple(g["bus_id"] for g in gpus)) if auto and sysfs and gpus else None
    try:
        found = ns.effective_settings(environ, place=place, sysfs=sysfs)
    except NetworkSettingError as e:
        return [Item("network settings", ERROR, str(e), "fix or unset it (README 'Running across nodes')")]
    variables = found["variables"]
    shown = [f"{k}={v['value']}" for k, v in variables.items() if v["value"] is not None]
    transport = found["transport"]
    why = "EP_RT_REMOTE_TRANSPORT" if environ.get("EP_RT_REMOTE_TRANSPORT") else "DeepEP's default"
    detail = f"an internode Buffer would use {transport} ({why}); " + ", ".join(shown)
    extra = [
        f"{k} = {v['value'] if v['value'] is not None else '(unset)'}  [{v['source']}]"
        + (f"  {v['note']}" if v["note"] else "")
        for k, v in variables.items()
    ]
    if found["hca_per_local_rank"]:
        extra.append("NIC per local rank: " + ", ".join(f"{i}: {e}" for i, e in enumerate(found["hca_per_local_rank"])))
    items = [Item("network settings", OK, detail, extra=extra)]
    if transport in ("ucx", "libfabric"):
        gdr = s.find_library("gdrapi") and s.exists("/dev/gdrdrv")
        disabled = (environ.get("NVSHMEM_DISABLE_GDRCOPY") or "").strip().lower() in ("1", "true", "yes", "y", "on")
        if not gdr or disabled:
            why = "NVSHMEM_DISABLE_GDRCOPY is set" if disabled else "GDRCopy is not available"
            items.append(
                Item(
                    f"transport {transport} needs GDRCopy",
                    ERROR,
                    f"EP_RT_REMOTE_TRANSPORT={transport}, but "
                    f"{why}: NVSHMEM's {transport} transport runs atomics and its own barrier through it",
                    "install GDRCopy (libgdrapi and the gdrdrv module), or choose ibgda / ibrc",
                )
            )
    return items


# ---- the smoke round ---------------------------------------------------------------------------------


def smoke_item(name: str, run) -> Item:
    """`run()` returns every rank's (checks, failures); an exception (a rank raised, or a timeout) is an error."""
    try:
        results = run()
    except Exception as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        cause = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else type(e).__name__)
        return Item(
            name,
            ERROR,
            f"failed: {cause.strip()}",
            "run it alone for the whole traceback: python -m ep_rt "
            "check --quick (or the GPU tests); EP_RT_NVSHMEM_DEBUG=1 shows NVSHMEM's messages",
        )
    failures = [f"rank {r}: {f}" for r, (_, fs) in enumerate(results) for f in fs]
    checks = sum(c for c, _ in results)
    if failures:
        return Item(
            name,
            ERROR,
            f"{len(failures)} of {checks} checks differ from ep_rt.reference: {failures[0]}",
            "report it with the output of python -m ep_rt doctor",
        )
    return Item(name, OK, f"{checks} checks bit-exact against ep_rt.reference on {len(results)} ranks")
