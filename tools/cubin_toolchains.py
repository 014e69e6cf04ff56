"""The two cubin flavours and how each is compiled (used by tools/build_cubins.py).

    cu13   nvcc 13.0 from pip wheels in the cu13 site (nvidia-cuda-nvcc, -crt, -nvvm, -runtime, -cccl: no CUDA
           toolkit installed), or an explicit toolkit of the same nvcc version (--nvcc / $NVCC); NVSHMEM families
           link libnvshmem_device of nvidia-nvshmem-cu13 from the cu13 site. Cubins need a CUDA 13 driver (r580+).
    cu12   NVRTC 12.9 + nvJitLink 12.9 from pip wheels in the cu12 site (no CUDA 12 toolkit installed);
           NVSHMEM families link nvidia-nvshmem-cu12's device library. Cubins load from driver r525 on
           (Blackwell ones from r570, where CUDA 12.8 added sm_100).

A site is a folder made by `pip install --no-deps --target SITE <SITE_PINS[flavour]>` (build_cubins.py
--install-sites does exactly that). Its package versions are checked against the pins, which are part of every
cubin's source digest, so a changed pin makes --check report the cubins stale.

Every path a compiler sees is relative to a scratch staging folder holding symlinks (<src name> -> the kernel
sources, `cuda` -> the nvcc toolkit, `cu12` / `nvshmem` / `cudadevrt` -> the site's folders), so the command lines,
and the cubins, are the same from every checkout folder and every toolchain location. Two things nvcc would still
take from absolute paths are pinned by hand (nvcc_commands): the module id of relocatable code and nvlink's command
line. The functions that make command lines are pure: --check recomputes them without any compiler.
"""

import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
FLAVOURS = ("cu12", "cu13")
# The NVSHMEM device library each flavour links: the oldest one a supported torch pins (torch 2.9: cu12 3.3.20,
# cu13 3.3.24), so that every newer host library of the same major accepts the cubin (NVSHMEM's ABI rule).
SITE_PINS = {
    "cu12": {
        "nvidia-cuda-nvrtc-cu12": "12.9.86",
        "nvidia-nvjitlink-cu12": "12.9.86",
        "nvidia-cuda-runtime-cu12": "12.9.79",  # cuda_runtime.h, cooperative_groups (NVSHMEM includes them)
        "nvidia-cuda-cccl-cu12": "12.9.27",  # libcu++, for the shims below
        "nvidia-nvshmem-cu12": "3.3.20",
    },
    "cu13": {
        # nvcc 13.0.88 as pip wheels (the same files as this machine's /usr/local/cuda-13.0): driver, front ends,
        # cicc/libnvvm, cuda_runtime.h (nvcc includes it in every compile) and libcu++ (NVSHMEM's headers use it)
        "nvidia-cuda-nvcc": "13.0.88",
        "nvidia-cuda-crt": "13.0.88",
        "nvidia-nvvm": "13.0.88",
        "nvidia-cuda-runtime": "13.0.96",
        "nvidia-cuda-cccl": "13.0.85",
        "nvidia-nvshmem-cu13": "3.3.24",
    },
}
NVCC_PACKAGE = "nvidia-cuda-nvcc"
NVCC_VERSION = SITE_PINS["cu13"][NVCC_PACKAGE]  # an explicit --nvcc must report exactly this (nvcc --version)
NVCC_TOOLKIT = ("nvidia", "cu13")  # where the wheels put bin/, nvvm/, include/, lib/ in a site
NVSHMEM_PACKAGE = {"cu12": "nvidia-nvshmem-cu12", "cu13": "nvidia-nvshmem-cu13"}
# cuDriverGetVersion() a cubin needs: the toolkit's major; sm_100 came with CUDA 12.8 (driver r570).
MIN_DRIVER = {"cu12": 12000, "cu13": 13000}
ARCH_MIN_DRIVER = {("cu12", "sm_100"): 12080}
VARIANT_DEFINES = {
    "default": [],
    "safe": ["-DEP_RT_AGGRESSIVE_PTX=0"],
    "aggressive": ["-DEP_RT_AGGRESSIVE_PTX=1"],
    # the test transport of include/ep_rt/net.cuh (puts delivered late, split and reordered); safe loads
    "chaos": ["-DEP_RT_CHAOS_TRANSPORT=1"],
    # the LL receive areas sized by what can arrive (kernels_src/low_latency.cu, docs/LL_PACKED_DESIGN.md), and the
    # same under the test transport
    "packed": ["-DEP_RT_LL_PACKED=1"],
    "packed_chaos": ["-DEP_RT_CHAOS_TRANSPORT=1", "-DEP_RT_LL_PACKED=1"],
    # the copy engine's bulk copies where a family has them (include/ep_rt/tma.cuh); safe loads elsewhere
    "tma": ["-DEP_RT_AGGRESSIVE_PTX=0", "-DEP_RT_TMA=1"],
}
NVCC_COMMON = ["-O3", "-std=c++17"]
NVCC_EXTRA = ["--expt-relaxed-constexpr"]  # NVRTC rejects it (and -O3); the sources need neither there
NVSHMEM_LINK, CU12_LINK, SHIM_DIR = "nvshmem", "cu12", "rtc_shim"
CUDA_LINK, CUDADEVRT_LINK = "cuda", "cudadevrt"  # the nvcc toolkit; the folder of its libcudadevrt.a
# NVRTC has no C library headers, and NVSHMEM 3.x's reduce.cuh uses std:: traits without an NVRTC guard.
#
# Which <stdint.h> NVRTC gets (STDINT_SHIM):
# - "cuda_std" (the cu12 cubins before 2026-12-01's network redesign): libcu++'s NVRTC prelude, whose 64-bit types are long long. NVSHMEM's
#   device library was compiled by nvcc with glibc's, where they are long, so a call whose mangled name holds one
#   has nothing to link: nvshmemx_putmem_signal_nbi_block / _warp need
#   _Z28nvshmemi_transfer_put_signalIL13threadgroup_t1EEvPvS1_mS1_y14nvshmemi_amo_tib (..._t3... for the warp; the
#   `y` is unsigned long long) where the library defines ..._mS1_m14... (unsigned long): "Undefined reference" from
#   nvJitLink. Hence net.cuh had an __CUDACC_RTC__ branch (put, quiet, signal: a quiet per message).
# - "lp64": glibc's LP64 types (long, unsigned long for the 64-bit ones), defined before libcu++'s prelude can be
#   (its include guard is set) and then exported by <cuda/std/cstdint>; rtc_shim.h includes it first, because its
#   own libcu++ header would otherwise bring the prelude in before any source line. Tried with NVRTC + nvJitLink
#   12.9, nvshmem-cu12 3.3.20, sm_90 and sm_100: both put-with-signal calls and nvshmemx_signal_op link, and the
#   real low_latency.cu and internode.cu build with net.cuh's __CUDACC_RTC__ branch removed (so does every other
#   family: layout's bytes are unchanged, intranode's differ only in .strtab).
#   In use (the branch is gone): both flavours issue the same put-with-signals, and neither quiets.
STDINT_SHIM = "lp64"
STDINT_SHIMS = {
    "cuda_std": "#pragma once\n#include <cuda/std/cstdint>\n",
    "lp64": "\n".join(
        [
            "#pragma once",
            "#define _LIBCUDACXX___CUDA_CSTDINT_PRELUDE_H",  # keep libcu++'s long long prelude out
            *(
                f"typedef {t} {n};"
                for n, t in [
                    ("int8_t", "signed char"),
                    ("uint8_t", "unsigned char"),
                    ("int16_t", "signed short"),
                    ("uint16_t", "unsigned short"),
                    ("int32_t", "signed int"),
                    ("uint32_t", "unsigned int"),
                    ("int64_t", "signed long"),
                    ("uint64_t", "unsigned long"),
                    *((f"int_least{b}_t", f"int{b}_t") for b in (8, 16, 32, 64)),
                    *((f"uint_least{b}_t", f"uint{b}_t") for b in (8, 16, 32, 64)),
                    ("int_fast8_t", "signed char"),
                    ("uint_fast8_t", "unsigned char"),
                    *((f"int_fast{b}_t", "signed long") for b in (16, 32, 64)),
                    *((f"uint_fast{b}_t", "unsigned long") for b in (16, 32, 64)),
                    ("intptr_t", "signed long"),
                    ("uintptr_t", "unsigned long"),
                    ("intmax_t", "signed long"),
                    ("uintmax_t", "unsigned long"),
                ]
            ),
            "#include <cuda/std/climits>",
            *(
                f"#define {n} {v}"
                for n, v in [
                    ("INT8_MIN", "SCHAR_MIN"),
                    ("INT16_MIN", "SHRT_MIN"),
                    ("INT32_MIN", "INT_MIN"),
                    ("INT64_MIN", "LONG_MIN"),
                    ("INT8_MAX", "SCHAR_MAX"),
                    ("INT16_MAX", "SHRT_MAX"),
                    ("INT32_MAX", "INT_MAX"),
                    ("INT64_MAX", "LONG_MAX"),
                    ("UINT8_MAX", "UCHAR_MAX"),
                    ("UINT16_MAX", "USHRT_MAX"),
                    ("UINT32_MAX", "UINT_MAX"),
                    ("UINT64_MAX", "ULONG_MAX"),
                    ("INTPTR_MIN", "LONG_MIN"),
                    ("INTPTR_MAX", "LONG_MAX"),
                    ("UINTPTR_MAX", "ULONG_MAX"),
                    ("INTMAX_MIN", "LONG_MIN"),
                    ("INTMAX_MAX", "LONG_MAX"),
                    ("UINTMAX_MAX", "ULONG_MAX"),
                    ("SIZE_MAX", "ULONG_MAX"),
                    ("INT8_C(X)", "X"),
                    ("INT16_C(X)", "X"),
                    ("INT32_C(X)", "X"),
                    ("INT64_C(X)", "X##L"),
                    ("UINT8_C(X)", "X"),
                    ("UINT16_C(X)", "X"),
                    ("UINT32_C(X)", "X##U"),
                    ("UINT64_C(X)", "X##UL"),
                    ("INTMAX_C(X)", "X##L"),
                    ("UINTMAX_C(X)", "X##UL"),
                ]
            ),
            "#include <cuda/std/cstdint>",
            "",
        ]
    ),
}


def shims(stdint_shim):
    """The shim headers (name: text) with the given STDINT_SHIMS choice."""
    return {
        "stdint.h": STDINT_SHIMS[stdint_shim],
        "rtc_shim.h": (
            "#pragma once\n"
            + ("#include <stdint.h>\n" if stdint_shim == "lp64" else "")
            + "#include <cuda/std/type_traits>\n"
            "namespace std { using cuda::std::is_integral; using cuda::std::is_unsigned; "
            "using cuda::std::is_signed; }\n"
        ),
    }


SHIMS = shims(STDINT_SHIM)
# nvidia-nvshmem-cu12 has no sm_100 SASS: nvJitLink JIT-compiles its compute_90 PTX without the callers'
# __launch_bounds__ register cap, and the link fails ("max regcount of 80 calls ... regcount of 126").
NVJITLINK_EXTRA = {("cu12", "sm_100"): ["-maxrregcount=80"]}


class BuildError(Exception):
    """A build or configuration problem (a missing compiler or site, a failed step), reported as one message."""


# ---------------------------------------------------------------- command lines (pure)


def nvcc_commands(family, variant, arch, src_name):
    """cu13: (tool, arguments) of each step, run in the staging folder as cuda/bin/<tool>; the cubin's name.

    nvcc is run through the relative `cuda` link, so the toolkit paths it adds are relative too. Two inputs of the
    relocatable (NVSHMEM) build would still be absolute, and differ between checkouts and toolkit locations:
    - cudafe++ hashes --orig_src_path_name (nvcc passes the source's resolved absolute path) into the module id
      that names every internal-linkage symbol (_INTERNAL_<hash>_..., in .strtab); the -Xcudafe option below,
      passed after nvcc's own, replaces it with the relative source name.
    - `nvcc -dlink` hands nvlink the toolkit's absolute lib folders, and nvlink writes its command line into the
      cubin (.note.nv.tkinfo); their names also differ between a toolkit's layout (targets/<arch>/lib) and the
      wheels' (lib). So the device link calls nvlink itself, with the libraries nvcc would give it (NVSHMEM's and
      cudadevrt, by relative links) and a fixed -cpu-arch (nvcc passes the build host's; only recorded there).
    """
    source, obj, cubin = f"{src_name}/{family.name}.cu", f"{family.name}.o", f"{family.name}.cubin"
    head = [*NVCC_COMMON, f"-I{src_name}/include"]
    tail = [*NVCC_EXTRA, *VARIANT_DEFINES[variant]]
    if not family.needs_nvshmem:
        return [("nvcc", [f"-arch={arch}", "-cubin", *head, *tail, source, "-o", cubin])], cubin
    # One step would silently give an unlinked cubin: compile relocatable, then device-link.
    return [
        (
            "nvcc",
            [
                f"-arch={arch}",
                "-rdc=true",
                *head,
                f"-I{NVSHMEM_LINK}/include",
                *tail,
                "-Xcudafe",
                f"--orig_src_path_name={source}",
                "-c",
                source,
                "-o",
                obj,
            ],
        ),
        (
            "nvlink",
            [
                "-m64",
                f"--arch={arch}",
                f"-L{NVSHMEM_LINK}/lib",
                "-lnvshmem_device",
                f"-L{CUDADEVRT_LINK}",
                "-lcudadevrt",
                "-cpu-arch=X86_64",
                obj,
                "-o",
                cubin,
            ],
        ),
    ], cubin


def nvrtc_job(family, variant, arch, src_name):
    """cu12: the nvrtc_build.py job (paths relative to the staging folder)."""
    site = f"{CU12_LINK}/nvidia"
    options = [
        f"--gpu-architecture={arch}",
        "-std=c++17",
        f"-I{src_name}/include",
        f"-I{site}/cuda_cccl/include",
        f"-I{site}/cuda_runtime/include",
        f"-I{SHIM_DIR}",
    ]
    job = {
        "nvrtc": f"{site}/cuda_nvrtc/lib/libnvrtc.so.12",
        "source": f"{src_name}/{family.name}.cu",
        "output": f"{family.name}.cubin",
        "nvjitlink": None,
        "link_options": None,
        "libraries": [],
    }
    if family.needs_nvshmem:
        # -default-device: NVSHMEM's nvshmem_tensor.h has constructors without __device__.
        options += [
            "--relocatable-device-code=true",
            f"-I{site}/nvshmem/include",
            "-default-device",
            "--pre-include=rtc_shim.h",
        ]
        job.update(
            nvjitlink=f"{site}/nvjitlink/lib/libnvJitLink.so.12",
            link_options=[f"-arch={arch}", *NVJITLINK_EXTRA.get(("cu12", arch), [])],
            libraries=[f"{site}/nvshmem/lib/libnvshmem_device.a"],
        )
    job["nvrtc_options"] = options + VARIANT_DEFINES[variant]
    return job


def recorded_flags(flavour, family, variant, arch, src_name):
    """The compiler flags of every step, without input and output names; identical on every machine."""
    if flavour == "cu13":
        commands, _ = nvcc_commands(family, variant, arch, src_name)
        flags = []
        for tool, args in commands:
            flags += ([] if tool == "nvcc" else [f"{tool}:"]) + [a for a in args if a.startswith("-") and a != "-o"]
        return flags
    job = nvrtc_job(family, variant, arch, src_name)
    link = [] if job["link_options"] is None else ["nvJitLink:", *job["link_options"], *job["libraries"]]
    return [*job["nvrtc_options"], *link]


def identity(flavour, family):
    """What besides sources and flags decides the cubin: the pinned packages it was built from (and the shims)."""
    pins = SITE_PINS[flavour]
    names = [n for n in sorted(pins) if family.needs_nvshmem or n != NVSHMEM_PACKAGE[flavour]]
    if flavour == "cu12" and not family.needs_nvshmem:
        names.remove("nvidia-nvjitlink-cu12")
    parts = [f"{n}=={pins[n]}" for n in names]
    if flavour == "cu12":
        shims = hashlib.sha256(json.dumps(SHIMS, sort_keys=True).encode()).hexdigest()[:16]
        parts.append(f"nvrtc shims {shims}")
    return parts


def min_driver(flavour, arch):
    return ARCH_MIN_DRIVER.get((flavour, arch), MIN_DRIVER[flavour])


def nvshmem_version(flavour, family):
    return SITE_PINS[flavour][NVSHMEM_PACKAGE[flavour]] if family.needs_nvshmem else None


# ---------------------------------------------------------------- sites


def install_command(flavour, site):
    pins = [f"{n}=={v}" for n, v in sorted(SITE_PINS[flavour].items())]
    return [sys.executable, "-m", "pip", "install", "--no-deps", "--upgrade", "--target", str(site), *pins]


def install_site(flavour, site):
    """A fresh site: installed beside it, then swapped in (pip --target over an old site would keep the
    dist-info of replaced versions, and a half-done install would look like a site)."""
    site = Path(site)
    fresh = site.with_name(site.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    cmd = install_command(flavour, fresh)
    print(f"installing the {flavour} site: {shlex.join(cmd)}", flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(fresh, ignore_errors=True)
        raise BuildError(f"installing the {flavour} site failed:\n{result.stdout}{result.stderr}")
    shutil.rmtree(site, ignore_errors=True)
    os.replace(fresh, site)


def check_site(flavour, site, needed):
    """Raise unless `site` holds the pinned versions of the packages `needed`."""
    found = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions(path=[str(site)])}
    wrong = [
        f"{n}=={SITE_PINS[flavour][n]} (found {found.get(n, 'none')})"
        for n in needed
        if found.get(n) != SITE_PINS[flavour][n]
    ]
    if wrong:
        raise BuildError(
            f"the {flavour} site {site} lacks {', '.join(wrong)}: run python tools/build_cubins.py --install-sites "
            f"(that is: {shlex.join(install_command(flavour, site))})"
        )


# ---------------------------------------------------------------- compiling


def run_tool(cmd, what, cwd=None):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"{what} failed:\n  $ {shlex.join(cmd)}\n{result.stdout}{result.stderr}")
    return result.stdout


def site_toolkit(site):
    """The toolkit root the nvcc wheels make in a site."""
    return Path(site).joinpath(*NVCC_TOOLKIT)


def find_nvcc(site, explicit=None):
    """The nvcc to build with: `explicit` (--nvcc), else $NVCC, else the cu13 site's own (the default)."""
    chosen = explicit or os.environ.get("NVCC")
    nvcc = Path(chosen) if chosen else site_toolkit(site) / "bin" / "nvcc"
    if not (nvcc.is_file() and os.access(nvcc, os.X_OK)):
        if chosen:
            raise BuildError(f"nvcc {nvcc} (from {'--nvcc' if explicit else '$NVCC'}) is not an executable file")
        raise BuildError(
            f"no nvcc in the cu13 site ({nvcc}): run python tools/build_cubins.py --install-sites, or "
            f"pass --nvcc /usr/local/cuda/bin/nvcc (a toolkit whose nvcc is {NVCC_VERSION})"
        )
    return nvcc


def toolkit_root(nvcc):
    """The toolkit folder of an nvcc (its bin/..), checked to hold what a build runs from it."""
    root = Path(os.path.realpath(nvcc)).parent.parent
    missing = [p for p in ("bin/nvlink", "nvvm/bin/cicc") if not (root / p).is_file()]
    if missing:
        raise BuildError(
            f"{nvcc} is not inside a CUDA toolkit ({root} has no {', '.join(missing)}): pass the nvcc "
            f"of the toolkit itself (e.g. /usr/local/cuda/bin/nvcc), not a wrapper"
        )
    return root


def cudadevrt_folder(root):
    """Where a toolkit keeps libcudadevrt.a: lib/ in the wheels, targets/<arch>/lib or lib64 in a toolkit."""
    for folder in [root / "lib", root / "lib64", *sorted(root.glob("targets/*/lib"))]:
        if (folder / "libcudadevrt.a").is_file():
            return folder
    raise BuildError(f"no libcudadevrt.a in the toolkit {root} (looked in lib, lib64, targets/*/lib)")


def nvcc_version(nvcc):
    """'13.0.88' from nvcc --version ("... release 13.0, V13.0.88")."""
    text = run_tool([str(nvcc), "--version"], "nvcc --version")
    match = re.search(r"release [\d.]+, V([\d.]+)", text)
    if match is None:
        raise BuildError(f"cannot read the version from `{nvcc} --version`:\n{text}")
    return match.group(1)


class Toolchain:
    """One flavour's compiler, ready to build: checked once (compiler found, site versions right)."""

    def __init__(self, flavour, site, families, nvcc=None):
        self.flavour, self.site = flavour, Path(site)
        needs_nvshmem = any(f.needs_nvshmem for f in families)
        if flavour == "cu13":
            self.nvcc = find_nvcc(self.site, nvcc)
            self.root = toolkit_root(self.nvcc)
            self.version = nvcc_version(self.nvcc)
            if self.version != NVCC_VERSION:
                raise BuildError(
                    f"the cu13 cubins are pinned to nvcc {NVCC_VERSION} (SITE_PINS); {self.nvcc} is "
                    f"{self.version}: use the cu13 site's (--install-sites) or a {NVCC_VERSION} toolkit"
                )
            own = self.root == site_toolkit(self.site).resolve()
            needed = [
                n
                for n in SITE_PINS["cu13"]
                if (own and n != NVSHMEM_PACKAGE["cu13"]) or (needs_nvshmem and n == NVSHMEM_PACKAGE["cu13"])
            ]
        else:
            needed = [
                n
                for n in SITE_PINS["cu12"]
                if needs_nvshmem or n not in (NVSHMEM_PACKAGE["cu12"], "nvidia-nvjitlink-cu12")
            ]
        if needed:
            check_site(flavour, self.site, needed)

    def compiler(self, family=None):
        """What compiles (and links) `family`; without one, the whole toolchain."""
        if self.flavour == "cu13":
            return f"nvcc {self.version}"
        pins = SITE_PINS["cu12"]
        links = family is None or family.needs_nvshmem
        return f"nvrtc {pins['nvidia-cuda-nvrtc-cu12']}" + (
            f" + nvjitlink {pins['nvidia-nvjitlink-cu12']}" if links else ""
        )

    def describe(self):
        """The manifest's record of this toolchain."""
        return {"compiler": self.compiler(), "packages": dict(sorted(SITE_PINS[self.flavour].items()))}

    def compile(self, family, variant, arch, src):
        """The cubin bytes of one (family, variant, arch), built in a scratch staging folder."""
        with tempfile.TemporaryDirectory(prefix="ep_rt_build_") as stage:
            os.symlink(src, os.path.join(stage, src.name))
            if self.flavour == "cu13":
                return self._nvcc(family, variant, arch, src, stage)
            return self._nvrtc(family, variant, arch, src, stage)

    def _nvcc(self, family, variant, arch, src, stage):
        os.symlink(self.root, os.path.join(stage, CUDA_LINK))
        if family.needs_nvshmem:
            os.symlink(self.site.resolve() / "nvidia" / "nvshmem", os.path.join(stage, NVSHMEM_LINK))
            os.symlink(cudadevrt_folder(self.root), os.path.join(stage, CUDADEVRT_LINK))
        commands, cubin = nvcc_commands(family, variant, arch, src.name)
        for tool, args in commands:
            # a relative program path: run from the staging folder, and nvcc derives relative toolkit paths from it
            run_tool([f"{CUDA_LINK}/bin/{tool}", *args], f"{tool} for {family.name} cu13/{arch}/{variant}", cwd=stage)
        return Path(stage, cubin).read_bytes()

    def _nvrtc(self, family, variant, arch, src, stage):
        os.symlink(self.site.resolve(), os.path.join(stage, CU12_LINK))
        os.mkdir(os.path.join(stage, SHIM_DIR))
        for name, text in SHIMS.items():
            Path(stage, SHIM_DIR, name).write_text(text)
        job = nvrtc_job(family, variant, arch, src.name)
        Path(stage, "job.json").write_text(json.dumps(job))
        run_tool(
            [sys.executable, str(TOOLS / "nvrtc_build.py"), "job.json"],
            f"NVRTC for {family.name} cu12/{arch}/{variant}",
            cwd=stage,
        )
        return Path(stage, job["output"]).read_bytes()
