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


def _why(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


# ---- software ----------------------------------------------------------------------------------------

PACKAGES = ("cuda-bindings", "nvidia-nvshmem-cu13", "nvidia-ml-py", "numpy")


def check_packages(s) -> list[Item]:
    import os

    from .. import __file__ as package_file, __version__

    t = s.torch_info()
    versions = ", ".join(f"{p} {s.package_version(p) or 'missing'}" for p in PACKAGES)
    detail = (f"ep_rt {__version__} ({os.path.dirname(package_file)}), Python {s.python_version()}, torch "
              f"{t['version']} ({'CUDA ' + t['cuda'] if t['cuda'] else 'CPU-only'}), {versions}")
    missing = [p for p in PACKAGES if s.package_version(p) is None]
    if t["cuda"] is None:
        return [Item("packages", ERROR, detail, "this torch is a CPU-only build: install a CUDA build of torch")]
    if missing:
        return [Item("packages", ERROR, detail, f"install {' '.join(missing)} (pip install ep-rt pulls them in)")]
    return [Item("packages", OK, detail)]


# ---- driver and GPUs ---------------------------------------------------------------------------------

def check_driver(s, manifest: dict | None) -> list[Item]:
    """NVML's driver version and the CUDA version the driver supports, against the nvcc the cubins need."""
    try:
        nvml = s.nvml_driver_version()
    except Exception as e:
        return [Item("driver", ERROR, f"no NVIDIA driver ({_why(e)})",
                     "install the NVIDIA driver (in a container: run it with the GPUs, e.g. --gpus all)")]
    try:
        major, minor = s.cuda_driver_version()
    except Exception as e:
        return [Item("driver", ERROR, f"NVIDIA driver {nvml}, but the CUDA driver API failed ({_why(e)})",
                     "libcuda.so must be loadable: reinstall the driver or check LD_LIBRARY_PATH")]
    detail = f"NVIDIA driver {nvml}, supports CUDA {major}.{minor}"
    version = 1000 * major + 10 * minor
    floors = {e.get("flavour"): e.get("min_driver") for e in (manifest or {}).get("cubins", []) if e.get("min_driver")}
    runnable = sorted(f for f, floor in floors.items() if floor <= version)
    if floors and not runnable:
        need = min(floors.values())
        return [Item("driver", ERROR, detail + f"; every shipped cubin flavour needs CUDA "
                     f"{need // 1000}.{need % 1000 // 10} or newer ({', '.join(sorted(floors))})",
                     f"update the driver to one that supports CUDA {need // 1000}.{need % 1000 // 10} or newer")]
    if runnable:
        detail += f"; cubin flavours it runs: {', '.join(runnable)}"
    return [Item("driver", OK, detail)]


def check_gpus(s) -> tuple[list[Item], list[dict]]:
    try:
        gpus = s.gpus()
    except Exception as e:
        return [Item("GPUs", ERROR, f"cannot list GPUs ({_why(e)})", "python -c 'import torch; "
                     "print(torch.cuda.is_available())' should say True")], []
    if not gpus:
        return [Item("GPUs", ERROR, "no CUDA GPU visible", "check CUDA_VISIBLE_DEVICES and nvidia-smi")], []
    return [Item(f"GPU {g['index']}", OK, f"{g['name']}, {g['arch']}, {g['sms']} SMs, PCI {g['bus_id']}")
            for g in gpus], gpus


# ---- cubins ------------------------------------------------------------------------------------------

def check_cubins(s, gpus: list[dict], aggressive: bool) -> tuple[list[Item], dict | None]:
    from .. import env
    from ..runtime import choice

    try:
        root, manifest = s.manifest()
    except Exception as e:
        return [Item("cubins", ERROR, f"no usable cubin manifest ({_why(e)})",
                     "reinstall ep_rt, or point EP_RT_CUBIN_DIR at a folder with manifest.json")], None
    shipped = {}
    for e in manifest["cubins"]:
        shipped.setdefault(e["arch"], {}).setdefault(e["family"], []).append(e["variant"])
    listing = "; ".join(f"{arch}: " + ", ".join(f"{fam} ({'/'.join(sorted(v))})" for fam, v in sorted(fams.items()))
                        for arch, fams in sorted(shipped.items()))
    compilers = sorted({f"{e.get('flavour')}: {e.get('compiler')}" for e in manifest["cubins"]})
    items = [Item("cubins", OK, f"{listing} in {root}, built with {'; '.join(compilers)}")]
    if not gpus:
        return items + [Item("cubins for this GPU", SKIP, "no GPU: nothing to load")], manifest
    try:
        major, minor = s.cuda_driver_version()
    except Exception as e:
        return items + [Item("cubins for this GPU", ERROR, f"the driver cannot tell its CUDA version ({_why(e)})",
                             "check the NVIDIA driver (nvidia-smi)")], manifest
    driver_version = 1000 * major + 10 * minor
    nvshmem_flavour = s.nvshmem_flavour() if hasattr(s, "nvshmem_flavour") else None
    for arch in sorted({g["arch"] for g in gpus}):
        loads, problems = [], []
        cc = choice.parse_arch(arch)[:2]
        for family in sorted({e["family"] for e in manifest["cubins"]}):
            try:
                entry = choice.choose_entry(manifest, family, cc, aggressive, driver_version, env.cubin_flavour(),
                                            nvshmem_flavour)
                s.verify_cubin(root, entry)
                loads.append(entry["path"])
            except Exception as e:
                problems.append(_why(e))
        if problems:
            items.append(Item(f"cubins for {arch}", ERROR, "; ".join(problems),
                              f"ep_rt ships cubins for {sorted(shipped)}; rebuild with tools/build_cubins.py for "
                              f"{arch}, or reinstall ep_rt if a file is corrupt"))
        else:
            variant = "aggressive (EP_RT_AGGRESSIVE_PTX=1)" if aggressive else "safe"
            items.append(Item(f"cubins for {arch}", OK, f"loads {', '.join(loads)} ({variant} variant)"))
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
    missing = [f"{a} <-> {b}" for i, a in enumerate(ids) for b in ids[i + 1:] if not p2p[(a, b)]]
    if missing:
        return [Item("NVLink", WARNING, f"{len(missing)} GPU pairs without NVLink: {', '.join(missing)}",
                     "ep_rt's intranode kernels need NVLink between the GPUs of a node (use those GPUs only, or "
                     "EP_RT_SKIP_TOPOLOGY_CHECK=1 to try PCIe)", extra)]
    return [Item("NVLink", OK, f"all {len(ids)} GPUs are NVLink peers (NVML P2P, by PCI bus id)", extra=extra)]


# ---- NVSHMEM -----------------------------------------------------------------------------------------

def check_nvshmem(s, manifest: dict | None) -> list[Item]:
    """The host library against the device library of the NVSHMEM-linked cubins of its flavour, by NVSHMEM's rule
    (same major, host minor >= device minor; ep_rt.transport.nvshmem_dist)."""
    from ..transport import nvshmem_dist

    flavour = s.nvshmem_flavour() if hasattr(s, "nvshmem_flavour") else None
    linked = [e for e in (manifest or {}).get("cubins", []) if e.get("needs_nvshmem")]
    mine = [e for e in linked if flavour is None or e.get("flavour", flavour) == flavour] or linked
    devices = sorted({e.get("nvshmem") for e in mine if e.get("nvshmem")})
    try:
        host = s.nvshmem_host_version()
    except Exception as e:
        return [Item("NVSHMEM", ERROR, f"host library not loadable ({_why(e)})", nvshmem_dist.install_hint(flavour))]
    if not devices:
        return [Item("NVSHMEM", WARNING, f"host {host}; no NVSHMEM-linked cubin in the manifest",
                     "the low-latency mode needs the low_latency cubin: reinstall ep_rt")]
    which = f"{flavour} " if flavour else ""
    for device in devices:
        problem = nvshmem_dist.compatibility_problem(host, device, ibgda=False)
        if problem:
            return [Item("NVSHMEM", ERROR, f"host library {host}, {which}device library {device}: {problem}",
                         f"install an NVSHMEM host library in {nvshmem_dist.host_range(device, False)}: "
                         f"{nvshmem_dist.install_hint(flavour)}")]
    return [Item("NVSHMEM", OK, f"host {host} ({flavour or 'flavour unknown'}) runs the {which}low-latency cubins' "
                                f"device library {', '.join(devices)} (same major, host minor >= device minor)")]


# Remote transports NVSHMEM ships as plugins, with what each needs from the system.
TRANSPORTS = {
    "IBGDA": {"plugin": "ibgda", "libs": ("ibverbs", "mlx5"), "ib": True},
    "IBRC": {"plugin": "ibrc", "libs": ("ibverbs",), "ib": True},
    "UCX": {"plugin": "ucx", "libs": ("ucp",), "ib": False},
    "libfabric": {"plugin": "libfabric", "libs": ("fabric",), "ib": False},
}
NOT_NEEDED = "only low-latency calls across nodes need a remote transport; one node uses NVLink"


def check_transports(s) -> list[Item]:
    try:
        lib_dir = s.nvshmem_lib_dir()
        plugins = s.listdir(lib_dir)
    except Exception as e:
        return [Item("remote transports", SKIP, f"no NVSHMEM library folder ({_why(e)})")]
    ib = s.listdir("/sys/class/infiniband")
    items = [Item("InfiniBand devices", OK, ", ".join(ib)) if ib else
             Item("InfiniBand devices", WARNING, "none under /sys/class/infiniband", NOT_NEEDED)]
    for name, need in TRANSPORTS.items():
        missing = []
        if not any(f.startswith(f"nvshmem_transport_{need['plugin']}.so") for f in plugins):
            missing.append(f"plugin nvshmem_transport_{need['plugin']}.so in {lib_dir}")
        missing += [f"lib{lib}" for lib in need["libs"] if s.find_library(lib) is None]
        if need["ib"] and not ib:
            missing.append("an InfiniBand device")
        if missing:
            items.append(Item(f"transport {name}", WARNING, "cannot initialise here: missing " + ", ".join(missing),
                              NOT_NEEDED))
        else:
            items.append(Item(f"transport {name}", OK, "plugin and prerequisites present"))
    return items


def check_gdrcopy(s) -> list[Item]:
    lib, dev = s.find_library("gdrapi"), s.exists("/dev/gdrdrv")
    if lib and dev:
        return [Item("GDRCopy", OK, f"{lib}, /dev/gdrdrv")]
    missing = ", ".join(m for m, have in (("libgdrapi", lib), ("/dev/gdrdrv (the gdrdrv module)", dev)) if not have)
    return [Item("GDRCopy", WARNING, f"not available: missing {missing}",
                 "NVSHMEM's proxy transports (IBRC, UCX) signal faster with GDRCopy; not needed on one node")]


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


IBGDA_HINT = ('for IBGDA across nodes (DeepEP\'s install guide): options nvidia NVreg_EnableStreamMemOPs=1 '
              'NVreg_RegistryDwords="PeerMappingOverride=1;" in /etc/modprobe.d/nvidia.conf, update the initramfs, '
              'reboot; ' + NOT_NEEDED)


def check_ibgda_driver(s) -> list[Item]:
    params = driver_params(s)
    if params is None:
        return [Item("IBGDA driver options", SKIP, "no NVIDIA kernel module loaded")]
    items = []
    mem_ops = params.get("EnableStreamMemOPs")
    items.append(Item("IBGDA: NVreg_EnableStreamMemOPs", OK if mem_ops == "1" else WARNING,
                      f"= {mem_ops if mem_ops is not None else 'not reported'}", "" if mem_ops == "1" else IBGDA_HINT))
    dwords = params.get("RegistryDwords", "")
    override = "PeerMappingOverride=1" in dwords.replace(" ", "")
    items.append(Item("IBGDA: PeerMappingOverride", OK if override else WARNING,
                      f"NVreg_RegistryDwords = {dwords!r}", "" if override else IBGDA_HINT))
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
    return [Item("GPUDirect RDMA", WARNING, "no nvidia_peermem, and no dma-buf (" + ", ".join(why) + ")",
                 "modprobe nvidia_peermem, or use the open GPU kernel module on Linux >= 5.12; " + NOT_NEEDED)]


# ---- settings ----------------------------------------------------------------------------------------

def check_settings(s) -> list[Item]:
    from .. import config_file, env

    environ = s.environ()
    shown = sorted(k for k in environ if k.startswith(("EP_RT_", "NVSHMEM_")))
    items = [Item("settings", OK, ", ".join(f"{k}={environ[k]}" for k in shown) if shown else
                  "no EP_RT_ or NVSHMEM_ variables set (defaults)")]
    unknown = [k for k in shown if k.startswith("EP_RT_") and k not in env.KNOBS]
    if unknown:
        items.append(Item("unknown EP_RT_ variables", WARNING, ", ".join(unknown),
                          f"ep_rt reads only {', '.join(env.KNOBS)} (README 'Environment knobs')"))
    readers = {"EP_RT_TIMEOUT_S": env.timeout_s, "EP_RT_RANKS_PER_NODE": env.ranks_per_node,
               "EP_RT_TOPK_IDX_BITS": env.topk_idx_bits}
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
            items.append(Item("EP_RT_CONFIG_FILE", OK, f"{path}: " + ", ".join(
                f"{k} x{r}: num_sms={c.num_sms}" for (k, r), c in sorted(found.items()))))
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
    extra = [f"{k} = {v['value'] if v['value'] is not None else '(unset)'}  [{v['source']}]"
             + (f"  {v['note']}" if v["note"] else "") for k, v in variables.items()]
    if found["hca_per_local_rank"]:
        extra.append("NIC per local rank: " + ", ".join(f"{i}: {e}" for i, e in enumerate(found["hca_per_local_rank"])))
    items = [Item("network settings", OK, detail, extra=extra)]
    if transport in ("ucx", "libfabric"):
        gdr = s.find_library("gdrapi") and s.exists("/dev/gdrdrv")
        disabled = (environ.get("NVSHMEM_DISABLE_GDRCOPY") or "").strip().lower() in ("1", "true", "yes", "y", "on")
        if not gdr or disabled:
            why = "NVSHMEM_DISABLE_GDRCOPY is set" if disabled else "GDRCopy is not available"
            items.append(Item(f"transport {transport} needs GDRCopy", ERROR, f"EP_RT_REMOTE_TRANSPORT={transport}, but "
                              f"{why}: NVSHMEM's {transport} transport runs atomics and its own barrier through it",
                              "install GDRCopy (libgdrapi and the gdrdrv module), or choose ibgda / ibrc"))
    return items


# ---- the smoke round ---------------------------------------------------------------------------------

def smoke_item(name: str, run) -> Item:
    """`run()` returns every rank's (checks, failures); an exception (a rank raised, or a timeout) is an error."""
    try:
        results = run()
    except Exception as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        cause = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else type(e).__name__)
        return Item(name, ERROR, f"failed: {cause.strip()}", "run it alone for the whole traceback: python -m ep_rt "
                    "check --quick (or the GPU tests); EP_RT_NVSHMEM_DEBUG=1 shows NVSHMEM's messages")
    failures = [f"rank {r}: {f}" for r, (_, fs) in enumerate(results) for f in fs]
    checks = sum(c for c, _ in results)
    if failures:
        return Item(name, ERROR, f"{len(failures)} of {checks} checks differ from ep_rt.reference: {failures[0]}",
                    "report it with the output of python -m ep_rt doctor")
    return Item(name, OK, f"{checks} checks bit-exact against ep_rt.reference on {len(results)} ranks")
