"""Which shipped cubin fits this machine: pure functions of the manifest, the GPU's compute capability, the
driver version, the NVSHMEM flavour loaded and EP_RT_CUBIN_FLAVOUR (the callers read those; tests fake them).

Flavour: cu13 cubins (nvcc 13) need a CUDA 13 driver; cu12 ones (NVRTC 12.9) load from r525 on. Where both may
run, cu13 is taken: it is the flavour that has run on hardware. A family linked against NVSHMEM must be of the
flavour of the NVSHMEM host library in the process. Arch: a cubin for sm_XY runs on compute capability X.Z with
Z >= Y (an `a` target, sm_XYa, only on X.Y itself); the closest minor wins. Variant: "default", else "safe" (or
"aggressive" when asked); for an NVSHMEM-linked family with the chaos transport asked for (EP_RT_CHAOS_TRANSPORT),
"chaos" or an error, never a silent fallback to the real transport; for a family that has a "tma" variant anywhere,
with EP_RT_TMA asked for, "tma" or an error; for a family that has a "packed" variant anywhere (low_latency), with
EP_RT_LL_PACKED asked for, "packed" (or "packed_chaos" with the chaos transport) or an error.
"""

from __future__ import annotations

import re

from .. import installing
from ..errors import CubinNotFoundError, CudaDriverError

FLAVOURS = ("cu13", "cu12")  # preference order
FLAVOUR_CUDA = {"cu12": 12, "cu13": 13}
MIN_CUDA_DRIVER = 12000


def describe_driver(version: int) -> str:
    """cuDriverGetVersion's 12080 -> 'CUDA 12.8'."""
    return f"CUDA {version // 1000}.{version % 1000 // 10}"


def parse_arch(arch: str) -> tuple[int, int, str]:
    """'sm_90' -> (9, 0, ''), 'sm_100a' -> (10, 0, 'a'), 'sm_103f' -> (10, 3, 'f')."""
    match = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
    if match is None:
        raise CubinNotFoundError(f"unreadable arch {arch!r} in the cubin manifest (expected sm_XY, sm_XYa, sm_XYf)")
    return int(match.group(1)), int(match.group(2)), match.group(3)


def arch_name(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def arch_distance(arch: str, cc: tuple[int, int]) -> int | None:
    """How many minor versions below the GPU a cubin for `arch` is, or None if it cannot run there."""
    major, minor, suffix = parse_arch(arch)
    if major != cc[0] or minor > cc[1] or (suffix == "a" and minor != cc[1]):
        return None
    return cc[1] - minor


def require_cuda12_driver(driver_version: int) -> None:
    if driver_version < MIN_CUDA_DRIVER:
        raise CudaDriverError(
            f"this CUDA driver supports {describe_driver(driver_version)}; ep_rt needs a driver "
            f"for CUDA 12.0 or newer (r525+)"
        )


def check_bindings(bindings_version: str, driver_version: int) -> None:
    """cuda-bindings 13.x needs a CUDA 13 driver (r580+); 12.9.x works from r525 on (cuda-python's docs)."""
    require_cuda12_driver(driver_version)
    major = int(bindings_version.split(".")[0])
    if major * 1000 > driver_version:
        raise CudaDriverError(
            f"cuda-bindings {bindings_version} needs a driver for CUDA {major}; this driver supports "
            f"{describe_driver(driver_version)}: pip install 'cuda-bindings>=12.9,<13' (or ep_rt's cu12 extra: "
            f"{installing.extra_hint('cu12')}), or update the driver"
        )


def runnable_flavours(driver_version: int, forced: str | None) -> list[str]:
    """The flavours this driver can load, in preference order, or just the forced one."""
    require_cuda12_driver(driver_version)
    flavours = [f for f in FLAVOURS if FLAVOUR_CUDA[f] * 1000 <= driver_version]
    if forced is None:
        return flavours
    if forced not in flavours:
        raise CubinNotFoundError(
            f"EP_RT_CUBIN_FLAVOUR={forced} needs a driver for CUDA {FLAVOUR_CUDA[forced]} "
            f"(r580+); this one supports {describe_driver(driver_version)}: unset it or use "
            f"EP_RT_CUBIN_FLAVOUR=cu12"
        )
    return [forced]


def nvshmem_flavours(flavours: list[str], nvshmem_flavour: str | None, forced: str | None) -> list[str]:
    """Narrow `flavours` to the NVSHMEM host library's flavour (an NVSHMEM-linked cubin must match it)."""
    if nvshmem_flavour is None:
        if forced is None:
            raise CubinNotFoundError(
                "cannot tell whether the NVSHMEM host library is nvidia-nvshmem-cu12 or -cu13 "
                "(no installed distribution owns it): set EP_RT_CUBIN_FLAVOUR=cu12 or cu13 to "
                "say which"
            )
        return flavours
    if forced is not None and forced != nvshmem_flavour:
        raise CubinNotFoundError(
            f"EP_RT_CUBIN_FLAVOUR={forced}, but the NVSHMEM host library in this process is "
            f"nvidia-nvshmem-{nvshmem_flavour}; NVSHMEM-linked cubins must match it: unset EP_RT_CUBIN_FLAVOUR, "
            f"or install the {forced} extra ({installing.extra_hint(forced)}) beside a CUDA {FLAVOUR_CUDA[forced]} "
            f"torch"
        )
    if nvshmem_flavour not in flavours:
        raise CubinNotFoundError(
            f"the NVSHMEM host library is nvidia-nvshmem-{nvshmem_flavour} (CUDA {FLAVOUR_CUDA[nvshmem_flavour]}), "
            f"but this driver runs only {', '.join(flavours)} cubins: update the driver, or use a torch built "
            f"for CUDA 12 with ep_rt's cu12 extra ({installing.extra_hint('cu12')})"
        )
    return [nvshmem_flavour]


def _inventory(entries: list[dict]) -> str:
    by_flavour: dict[str, set] = {}
    for e in entries:
        by_flavour.setdefault(e["flavour"], set()).add(e["arch"])
    return "; ".join(f"{fl}: {', '.join(sorted(archs, key=parse_arch))}" for fl, archs in sorted(by_flavour.items()))


def ll_variant(packed: bool, chaos: bool) -> str:
    """The low-latency cubin variant EP_RT_LL_PACKED and EP_RT_CHAOS_TRANSPORT select on sm_90: "default", "chaos",
    "packed" or "packed_chaos"."""
    if packed:
        return "packed_chaos" if chaos else "packed"
    return "chaos" if chaos else "default"


def _variant(
    on_arch: list[dict], family: str, aggressive: bool, chaos: bool = False, tma: bool = False, packed: bool = False
) -> dict:
    by_variant = {e["variant"]: e for e in on_arch}
    where = f"{on_arch[0]['flavour']}/{on_arch[0]['arch']}"
    if packed:
        name = ll_variant(True, chaos)
        if name in by_variant:
            return by_variant[name]
        raise CubinNotFoundError(
            f"EP_RT_LL_PACKED=1{' and EP_RT_CHAOS_TRANSPORT=1' if chaos else ''}, but {family!r} has no {name} variant "
            f"for {where} (it has {sorted(by_variant)}; the packed layout is built for sm_90 only): unset "
            f"EP_RT_LL_PACKED"
        )
    if tma:
        if aggressive:
            raise CubinNotFoundError(
                f"EP_RT_TMA=1 and EP_RT_AGGRESSIVE_PTX=1: {family!r}'s tma variant is built with the safe loads only; "
                f"unset one of them"
            )
        if "tma" in by_variant:
            return by_variant["tma"]
        raise CubinNotFoundError(
            f"EP_RT_TMA=1, but {family!r} has no tma variant for {where} (it has {sorted(by_variant)}; the bulk "
            f"copies need sm_90 or newer, and are built for sm_90 only): unset EP_RT_TMA"
        )
    if chaos:
        if "chaos" in by_variant:
            return by_variant["chaos"]
        raise CubinNotFoundError(
            f"EP_RT_CHAOS_TRANSPORT=1, but {family!r} has no chaos variant for {where} (it has {sorted(by_variant)}; "
            f"the chaos transport is a test build, made for sm_90 only): unset EP_RT_CHAOS_TRANSPORT, or add chaos to "
            f"the variants= of the ep_rt-build line of kernels_src/{family}.cu and rebuild with tools/build_cubins.py"
        )
    for variant in ("default", "aggressive" if aggressive else "safe"):
        if variant in by_variant:
            return by_variant[variant]
    if aggressive and "safe" in by_variant:
        raise CubinNotFoundError(
            f"EP_RT_AGGRESSIVE_PTX=1, but {family!r} has no aggressive variant for {where} (its "
            f"non-coherent loads are validated on sm_90 only): unset EP_RT_AGGRESSIVE_PTX"
        )
    raise CubinNotFoundError(f"family {family!r} on {where} has variants {sorted(by_variant)}, none usable")


def choose_entry(
    manifest: dict,
    family: str,
    cc: tuple[int, int],
    aggressive: bool,
    driver_version: int,
    forced: str | None = None,
    nvshmem_flavour: str | None = None,
    chaos: bool = False,
    tma: bool = False,
    packed: bool = False,
) -> dict:
    """The manifest entry to load for `family` on a GPU of compute capability `cc` (see the module doc). `chaos`
    (EP_RT_CHAOS_TRANSPORT) asks NVSHMEM-linked families for their chaos variant; the others have no network traffic
    and ignore it. `tma` (EP_RT_TMA) asks the families that have a tma variant for it; the others ignore it. `packed`
    (EP_RT_LL_PACKED) asks the families that have a packed variant for it; the others ignore it."""
    entries = [e for e in manifest["cubins"] if e["family"] == family]
    if not entries:
        known = sorted({e["family"] for e in manifest["cubins"]})
        raise CubinNotFoundError(f"no kernel family {family!r} in the manifest; families: {known}")
    flavours = runnable_flavours(driver_version, forced)
    networked = any(e["needs_nvshmem"] for e in entries)
    if networked:
        flavours = nvshmem_flavours(flavours, nvshmem_flavour, forced)
    for flavour in flavours:
        fits = [
            (arch_distance(e["arch"], cc), e)
            for e in entries
            if e["flavour"] == flavour and e["min_driver"] <= driver_version
        ]
        fits = [(d, e) for d, e in fits if d is not None]
        if fits:
            best = min(d for d, _ in fits)
            has_tma = any(e["variant"] == "tma" for e in entries)
            has_packed = any(e["variant"] == "packed" for e in entries)
            return _variant(
                [e for d, e in fits if d == best],
                family,
                aggressive,
                chaos and networked,
                tma and has_tma,
                packed and has_packed,
            )
    raise CubinNotFoundError(
        f"ep_rt ships no {family!r} cubin for this GPU (compute capability {cc[0]}.{cc[1]}, {arch_name(cc)}) in the "
        f"flavour(s) this process can use ({', '.join(flavours)}, driver {describe_driver(driver_version)}); it has "
        f"{_inventory(entries)}. A cubin for sm_XY runs on X.Z for Z >= Y: use such a GPU, or rebuild with "
        f"tools/build_cubins.py for {arch_name(cc)}."
    )
