#!/usr/bin/env python3
"""Compile kernels_src/*.cu into cubins/<flavour>/<arch>/<variant>/<family>.cubin and write cubins/manifest.json.

Two flavours of every cubin (tools/cubin_toolchains.py): cu13 (nvcc 13.0, needs a CUDA 13 driver) and cu12
(NVRTC + nvJitLink 12.9, loads from driver r525 on). Both flavours' compilers and NVSHMEM device libraries come
from pip "sites" (folders made with pip install --target), at pinned versions; no CUDA toolkit is needed:

    python tools/build_cubins.py --install-sites  pip-install the pinned packages into build/cu12-site and
                                                  build/cu13-site (fresh; needs PyPI), then build everything
    python tools/build_cubins.py                  build every family, flavour, arch and variant (needs a host
                                                  C++ compiler and the two sites)
    python tools/build_cubins.py --family NAME    rebuild only NAME (repeatable); other entries are kept
    python tools/build_cubins.py --flavour cu12   rebuild only one flavour (repeatable); other entries are kept
    python tools/build_cubins.py --verify         rebuild everything into a scratch folder and compare its bytes
                                                  with cubins/ (every differing file named; with --install-sites:
                                                  install first)
    python tools/build_cubins.py --check          CI: is cubins/ current with kernels_src/? (stdlib only, no
                                                  compiler, no site)
    python tools/build_cubins.py --update-marks   rewrite only the manifest's hardware marks (after adding a mark to
                                                  cubins/hardware_runs.json; no compiler)
    --cu12-site DIR / --cu13-site DIR             use other site folders (default: build/cu12-site, build/cu13-site)
    --nvcc PATH                                   cu13 from a toolkit's nvcc instead of the site's (or $NVCC); it
                                                  must be the pinned version

A family is one kernels_src/<family>.cu. It declares its build needs in comment lines:
    // ep_rt-build: variants=safe,aggressive      (default: one variant named "default"; known: default, safe,
                                                  aggressive, chaos, tma, packed,
                                                  packed_chaos)
    // ep_rt-build: nvshmem                       (device-links libnvshmem_device)
    // ep_rt-build: min_arch=sm_90                (not built for older archs: ARCHS below)

Archs: every family for sm_80 (A100), sm_90 (Hopper) and sm_100 (Blackwell; plain sm_100, which B300 (10.3) also
runs, unlike sm_100a) from its min_arch on. The aggressive variant only for sm_90, the one arch on which its
non-coherent loads were validated (as DeepEP, which forces them off elsewhere). The chaos variant (the test
transport of include/ep_rt/net.cuh, EP_RT_CHAOS_TRANSPORT=1; NVSHMEM families only) only for sm_90 too: it is for
emulated nodes on the H200 test machines, and each NVSHMEM-linked cubin costs the wheel ~0.17 MB. The tma variant
(bulk copies through the copy engine, EP_RT_TMA=1, for A/B measurements) for sm_90 only, and so are the packed
variants of the LL family (receive areas sized by what can arrive, EP_RT_LL_PACKED=1; packed_chaos the same under the
test transport), until they have run on other archs.

Reproducible output: the compilers run in a scratch staging folder holding symlinks to the sources, the toolkit and
the sites, so every path on their command lines is relative and the bytes are the same from every checkout folder
and toolchain location (cubin_toolchains.nvcc_commands says what else nvcc would take from absolute paths). The recorded flags are exactly
those command lines without input and output names; the source digest covers the sources, the flags, the arch
and the pinned packages (cubin_toolchains.identity), so --check sees a change in any of them.

Hardware marks (tools/hardware_marks.py): cubins/hardware_runs.json names, by sha256, the cubin bytes that ran on a
GPU; an entry's ran_on_hardware is true only for the bytes a mark names, and --check fails on a stale mark.
"""

import argparse
import concurrent.futures
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import struct
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHS = ("sm_80", "sm_90", "sm_100")
AGGRESSIVE_ARCHS = ("sm_90",)
# Variants built for some archs only (every other variant: every arch of the family).
VARIANT_ARCHS = {
    "aggressive": AGGRESSIVE_ARCHS,
    "chaos": ("sm_90",),
    "tma": ("sm_90",),
    "packed": ("sm_90",),
    "packed_chaos": ("sm_90",),
}
PARAMS_HEADER = Path("include", "ep_rt", "params.h")
DIRECTIVE = "// ep_rt-build:"
REBUILD_HINT = "rebuild with python tools/build_cubins.py"
MARKS_HINT = "then python tools/build_cubins.py --update-marks"


def _load(name, path):
    # Loaded by file path so that --check never runs ep_rt/__init__.py (which may import torch).
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


manifest_lib = _load("_ep_rt_manifest", REPO / "ep_rt" / "runtime" / "manifest.py")
toolchains = _load("_ep_rt_cubin_toolchains", Path(__file__).resolve().parent / "cubin_toolchains.py")
marks_lib = _load("_ep_rt_hardware_marks", Path(__file__).resolve().parent / "hardware_marks.py")
BuildError = toolchains.BuildError
FLAVOURS = toolchains.FLAVOURS
VARIANT_DEFINES = toolchains.VARIANT_DEFINES
run_tool = toolchains.run_tool


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    source: Path
    variants: tuple
    needs_nvshmem: bool
    min_arch: str = ARCHS[0]


@dataclasses.dataclass(frozen=True)
class Target:
    family: Family
    flavour: str
    arch: str
    variant: str

    @property
    def key(self):
        return (self.family.name, self.flavour, self.arch, self.variant)

    @property
    def path(self):
        return f"{self.flavour}/{self.arch}/{self.variant}/{self.family.name}.cubin"


# ---------------------------------------------------------------- families and sources


def arch_number(arch):
    """sm_100 -> 100; raises on anything that is not a plain sm_XY."""
    match = re.fullmatch(r"sm_(\d+)", arch)
    if match is None:
        raise BuildError(f"not a plain arch name: {arch!r} (expected sm_XY, e.g. sm_90)")
    return int(match.group(1))


def read_directives(path):
    """(variants, needs_nvshmem, min_arch) from the `// ep_rt-build:` lines of a .cu file."""
    variants, needs_nvshmem, min_arch = None, False, ARCHS[0]
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line.startswith(DIRECTIVE):
            continue
        for option in re.sub(r"\s*,\s*", ",", line[len(DIRECTIVE) :]).split():
            if option == "nvshmem":
                needs_nvshmem = True
            elif option.startswith("variants="):
                variants = tuple(v for v in option[len("variants=") :].split(",") if v)
                unknown = [v for v in variants if v not in VARIANT_DEFINES]
                if unknown or not variants:
                    raise BuildError(
                        f"{path.name}:{lineno}: unknown variant(s) {unknown or option!r}; "
                        f"known: {', '.join(VARIANT_DEFINES)}"
                    )
            elif option.startswith("min_arch="):
                min_arch = option[len("min_arch=") :]
                if min_arch not in ARCHS:
                    raise BuildError(f"{path.name}:{lineno}: min_arch {min_arch!r} is not one of {', '.join(ARCHS)}")
            else:
                raise BuildError(
                    f"{path.name}:{lineno}: unknown ep_rt-build option {option!r} "
                    "(known: variants=a,b, nvshmem and min_arch=sm_XY)"
                )
    if variants and {"chaos", "packed_chaos"} & set(variants) and not needs_nvshmem:
        raise BuildError(
            f"{path.name}: the chaos variant replaces NVSHMEM calls (include/ep_rt/net.cuh): it needs "
            f"the nvshmem option"
        )
    return variants or ("default",), needs_nvshmem, min_arch


def discover_families(src):
    """Every <src>/*.cu as a Family, sorted by name."""
    if not src.is_dir():
        raise BuildError(f"no kernel source folder {src}")
    return [Family(p.stem, p, *read_directives(p)) for p in sorted(src.glob("*.cu"))]


def targets(families, flavours=FLAVOURS):
    """Every cubin to build: each family for each flavour, arch from its min_arch, and variant."""
    out = []
    for family in families:
        for flavour in flavours:
            for arch in ARCHS:
                if arch_number(arch) < arch_number(family.min_arch):
                    continue
                out += [
                    Target(family, flavour, arch, v) for v in family.variants if arch in VARIANT_ARCHS.get(v, ARCHS)
                ]
    return out


def include_files(src):
    """All files under <src>/include, sorted; every family depends on all of them."""
    return sorted(p for p in (src / "include").rglob("*") if p.is_file())


def relative_sources(src, family):
    return sorted(os.path.relpath(p, src.parent).replace(os.sep, "/") for p in [family.source, *include_files(src)])


def recorded_flags(target, src_name):
    return toolchains.recorded_flags(target.flavour, target.family, target.variant, target.arch, src_name)


def target_digest(src, target):
    return manifest_lib.source_digest(
        src.parent,
        target.family.source,
        include_files(src),
        recorded_flags(target, src.name),
        target.arch,
        toolchains.identity(target.flavour, target.family),
    )


def find_host_compiler():
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return [shutil.which(name)]
    raise BuildError(
        "no host C++ compiler (c++, g++ or clang++ on PATH, or $CXX): the params.h layout probe and "
        "nvcc's preprocessing need one"
    )


# ---------------------------------------------------------------- cubin symbols (ELF)

SHT_SYMTAB, SHT_NOBITS, STT_FUNC, STB_GLOBAL, SHN_UNDEF = 2, 8, 2, 1, 0
STO_CUDA_ENTRY = 0x10  # st_other bit of a __global__ function; rdc device functions are global FUNCs too


def elf_section_headers(cubin):
    """[(name, sh_type, offset, size, link)] of an ELF64 little-endian file's sections, in index order."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise BuildError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4] if shstrndx < shnum else 0
    return [
        (cubin[names_at + n : cubin.index(b"\0", names_at + n)].decode(), t, offset, size, link)
        for n, t, _, _, offset, size, link, *_ in raw
    ]


def _symbol_entries(cubin, headers):
    """(name, st_info, st_other, st_shndx, st_value, st_size) of every symbol-table entry."""
    for _, sh_type, offset, size, link in headers:
        if sh_type != SHT_SYMTAB:
            continue
        strtab = headers[link][2]
        for pos in range(offset, offset + size, 24):
            st_name, st_info, st_other, st_shndx, value, st_size = struct.unpack_from("<IBBHQQ", cubin, pos)
            name = cubin[strtab + st_name : cubin.index(b"\0", strtab + st_name)].decode()
            yield name, st_info, st_other, st_shndx, value, st_size


def kernel_symbols(cubin):
    """Sorted names of the kernels (__global__ functions) defined in a cubin's ELF symbol table."""
    headers = elf_section_headers(cubin)
    return sorted(
        {
            name
            for name, st_info, st_other, st_shndx, _, _ in _symbol_entries(cubin, headers)
            if name
            and st_info & 0xF == STT_FUNC
            and st_info >> 4 == STB_GLOBAL
            and st_shndx != SHN_UNDEF
            and st_other & STO_CUDA_ENTRY
        }
    )


def elf_symbols(cubin):
    """{name: (section name, st_value, st_size)} of the symbols defined in a section (a data symbol's bytes are
    its section's bytes from st_value on)."""
    headers = elf_section_headers(cubin)
    return {
        name: (headers[shndx][0], value, size)
        for name, _, _, shndx, value, size in _symbol_entries(cubin, headers)
        if name and 0 < shndx < len(headers)
    }


def elf_sections(cubin):
    """{section name: bytes} of an ELF file (NOBITS sections as empty bytes; a repeated name gets a #n suffix)."""
    out = {}
    for name, sh_type, offset, size, _ in elf_section_headers(cubin):
        name = name or "(null)"
        key, n = name, 1
        while key in out:
            n += 1
            key = f"{name}#{n}"
        out[key] = b"" if sh_type == SHT_NOBITS else cubin[offset : offset + size]
    return out


# .nv.info.<kernel>: records of (format u8, attribute u8, u16), the u16 being an SVAL's payload size (its bytes
# follow) and the value itself for the other formats. __launch_bounds__(N) compiles to .maxntid N,1,1 in PTX and to
# EIATTR_MAX_THREADS (x, y, z) here; .reqntid to EIATTR_REQNTID, which is exact and so preferred.
EIFMT_SVAL, EIATTR_MAX_THREADS, EIATTR_REQNTID = 0x04, 0x05, 0x10


def nv_info_attributes(section):
    """{attribute: payload bytes (SVAL) or u16 value} of one .nv.info section; BuildError when it is malformed."""
    attributes, pos = {}, 0
    while pos < len(section):
        if pos + 4 > len(section):
            raise BuildError(f"truncated .nv.info record at byte {pos}")
        fmt, attribute, value = struct.unpack_from("<BBH", section, pos)
        pos += 4
        if fmt == EIFMT_SVAL:
            if pos + value > len(section):
                raise BuildError(f".nv.info attribute 0x{attribute:x} runs past its section")
            attributes[attribute], pos = section[pos : pos + value], pos + value
        elif fmt in (1, 2, 3):
            attributes[attribute] = value
        else:
            raise BuildError(f"unknown .nv.info record format 0x{fmt:x} at byte {pos - 4}")
    return attributes


def kernel_blocks(cubin):
    """{kernel: threads per block it is compiled for} of the kernels of a cubin that carry one in their ELF
    .nv.info.<kernel> section (those with a __launch_bounds__; the runtime refuses to launch the others: it takes
    every block size from here). BuildError for a 2D/3D block or a malformed section."""
    sections = elf_sections(cubin)
    blocks = {}
    for name in kernel_symbols(cubin):
        attributes = nv_info_attributes(sections.get(f".nv.info.{name}", b""))
        dims = attributes.get(EIATTR_REQNTID, attributes.get(EIATTR_MAX_THREADS))
        if dims is None:
            continue
        if not isinstance(dims, bytes) or len(dims) != 12:
            raise BuildError(f"kernel {name}: its block size attribute is not three 32-bit numbers")
        x, y, z = struct.unpack("<III", dims)
        if (y, z) != (1, 1):
            raise BuildError(f"kernel {name} is compiled for a {x}x{y}x{z} block: ep_rt launches 1D blocks only")
        blocks[name] = x
    return blocks


LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\(([^()]*)\)\s*(?:void\s+)?(\w+)\s*\(")


def source_launch_bounds(path):
    """{kernel: the max threads per block of its __launch_bounds__} of a .cu file (integer literals only)."""
    bounds = {}
    for args, name in LAUNCH_BOUNDS.findall(strip_comments(path.read_text(encoding="utf-8"))):
        first = args.split(",")[0].strip()
        if not first.isdigit():
            raise BuildError(
                f"{path.name}: kernel {name}: __launch_bounds__({args.strip()}) does not start with "
                f"an integer literal (the manifest's block sizes are checked against it)"
            )
        bounds[name] = int(first)
    return bounds


def block_problems(family, kernels, blocks):
    """Where a cubin's kernel block sizes (`blocks`, of its `kernels`) disagree with its family source's
    __launch_bounds__: another number, or one side without any."""
    bounds = source_launch_bounds(family.source)
    problems = []
    for name in kernels:
        if name not in blocks and name not in bounds:
            continue  # no block size on either side: the runtime refuses to launch it (runtime/manifest.py)
        if name not in blocks:
            problems.append(
                f"kernel {name}: {family.source.name} gives it __launch_bounds__({bounds[name]}), the "
                f"cubin carries no block size"
            )
        elif name not in bounds:
            problems.append(
                f"kernel {name}: the cubin is compiled for {blocks[name]} threads per block, "
                f"{family.source.name} has no __launch_bounds__ for it"
            )
        elif bounds[name] != blocks[name]:
            problems.append(
                f"kernel {name}: the cubin is compiled for {blocks[name]} threads per block, "
                f"{family.source.name} says __launch_bounds__({bounds[name]})"
            )
    return problems


# nvcc's module id of relocatable code (in internal-linkage names, so in some section names too)
MODULE_ID = re.compile(r"_INTERNAL_[0-9a-f]{8}_")


def section_differences(a, b):
    """Names of the ELF sections whose bytes differ between two cubins ("ELF header" if only it does). Section names
    are compared with nvcc's module id masked (_INTERNAL_*_), so a changed id shows as .strtab / .shstrtab only."""
    try:
        sa, sb = ({MODULE_ID.sub("_INTERNAL_*_", k): v for k, v in elf_sections(c).items()} for c in (a, b))
    except (struct.error, ValueError, BuildError):
        return ["(not ELF files)"]
    names = [n for n in sorted(sa.keys() | sb.keys()) if sa.get(n) != sb.get(n)]
    return names or (["ELF header"] if a[:64] != b[:64] else ["layout only (same sections, other offsets)"])


# ---------------------------------------------------------------- params.h layouts


def strip_comments(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def parse_structs(text):
    """{struct name: [field names in order]} of every `struct Name { ... };` in a header."""
    structs = {}
    for match in re.finditer(r"\bstruct\s+(\w+)\s*\{([^{}]*)\}\s*;", strip_comments(text)):
        fields = []
        for decl in filter(None, (d.strip() for d in match.group(2).split(";"))):
            for part in decl.split(","):
                name = re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*$", part.strip())
                if name is None:
                    raise BuildError(f"cannot read field declaration {decl!r} in struct {match.group(1)}")
                fields.append(name.group(1))
        structs[match.group(1)] = fields
    return structs


def parse_constants(text):
    """Names of the `#define EP_RT_* <integer expression>` macros, in order."""
    names = []
    for name, expr in re.findall(
        r"^[ \t]*#[ \t]*define[ \t]+(EP_RT_\w+)[ \t]+(.+?)[ \t]*$", strip_comments(text), re.M
    ):
        tokens = re.findall(r"\w+", expr)
        if re.fullmatch(r"[\w\s()+\-*/%<>&|^~]+", expr) and all(t[0].isdigit() or t in names for t in tokens):
            names.append(name)
    return names


def layout_program(structs, constants):
    lines = ["#include <cstddef>", "#include <cstdio>", '#include "ep_rt/params.h"', "int main() {"]
    for name, fields in structs.items():
        lines.append(f'  std::printf("struct {name} %zu %zu\\n", sizeof(struct {name}), alignof(struct {name}));')
        lines += [f'  std::printf("field {name} {f} %zu\\n", offsetof(struct {name}, {f}));' for f in fields]
    lines += [f'  std::printf("const {c} %lld\\n", (long long)({c}));' for c in constants]
    return "\n".join(lines + ["  return 0;", "}", ""])


def measure_params(src):
    """(structs, constants) of params.h, measured by compiling and running a host program."""
    header = src / PARAMS_HEADER
    if not header.is_file():
        return {}, {}
    text = header.read_text(encoding="utf-8")
    structs, constants = parse_structs(text), parse_constants(text)
    with tempfile.TemporaryDirectory(prefix="ep_rt_layout_") as tmp:
        program, exe = os.path.join(tmp, "layout.cpp"), os.path.join(tmp, "layout")
        Path(program).write_text(layout_program(structs, constants))
        cmd = [*find_host_compiler(), "-std=c++17", f"-I{src / 'include'}", program, "-o", exe]
        run_tool(cmd, "compiling the params.h layout probe")
        output = run_tool([exe], "running the params.h layout probe")
    measured_structs, measured_constants = {}, {}
    for kind, *rest in (line.split() for line in output.splitlines()):
        if kind == "struct":
            measured_structs[rest[0]] = {"size": int(rest[1]), "align": int(rest[2]), "fields": {}}
        elif kind == "field":
            measured_structs[rest[0]]["fields"][rest[1]] = int(rest[2])
        elif kind == "const":
            measured_constants[rest[0]] = int(rest[1])
    return measured_structs, measured_constants


# ---------------------------------------------------------------- building


def manifest_entry(target, src, cubin, compiler):
    family = target.family
    return {
        "path": target.path,
        "family": family.name,
        "flavour": target.flavour,
        "arch": target.arch,
        "variant": target.variant,
        "sha256": hashlib.sha256(cubin).hexdigest(),
        "source_sha256": target_digest(src, target),
        "sources": relative_sources(src, family),
        "compiler": compiler,
        "toolchain": toolchains.identity(target.flavour, family),
        "min_driver": toolchains.min_driver(target.flavour, target.arch),
        "nvshmem": toolchains.nvshmem_version(target.flavour, family),
        "flags": recorded_flags(target, src.name),
        "kernels": kernel_symbols(cubin),
        "blocks": kernel_blocks(cubin),  # the runtime launches each kernel with this block (runtime/launch.py)
        "needs_nvshmem": family.needs_nvshmem,
        "ran_on_hardware": False,  # set from the marks (apply_marks)
    }


def select(items, names, what, known_names):
    if not names:
        return items
    unknown = sorted(set(names) - set(known_names))
    if unknown:
        raise BuildError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(sorted(known_names))}")
    return [i for i in items if (i.name if isinstance(i, Family) else i) in names]


def write_atomic(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def remove_stray_cubins(out, keep):
    for path in sorted(out.rglob("*.cubin")):
        if path.relative_to(out).as_posix() not in keep:
            path.unlink()
            print(f"removed {path.relative_to(out).as_posix()} (no longer built)")
    for folder in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()


def read_marks(folder, root):
    """The hardware marks of <folder>/hardware_runs.json; BuildError when the file or a mark is malformed."""
    doc, problems = marks_lib.load(folder)
    problems += marks_lib.field_problems(doc["marks"], root)
    if problems:
        raise BuildError("\n".join(problems))
    return doc["marks"]


def apply_marks(manifest, marks):
    """Each entry's ran_on_hardware from the marks (a mark names its path and sha256); the marks themselves."""
    for entry in manifest["cubins"]:
        entry["ran_on_hardware"] = marks_lib.marked(entry, marks)
    manifest["hardware_runs"] = marks


def write_manifest(path, manifest):
    write_atomic(path, (json.dumps(manifest, sort_keys=True, indent=1) + "\n").encode())


def warn_stale_marks(marks, entries):
    for problem in marks_lib.stale_problems(marks, entries, MARKS_HINT):
        print(f"warning: {problem}", file=sys.stderr)


def update_marks(src, out):
    """Rewrite only the manifest's hardware marks from out/hardware_runs.json (after a GPU run; no compiler)."""
    manifest = manifest_lib.load_manifest(out / "manifest.json")
    marks = read_marks(out, src.parent)
    apply_marks(manifest, marks)
    write_manifest(out / "manifest.json", manifest)
    warn_stale_marks(marks, manifest["cubins"])
    ran = sum(e["ran_on_hardware"] for e in manifest["cubins"])
    print(f"wrote {out / 'manifest.json'}: {ran} of {len(manifest['cubins'])} cubins marked as run on hardware")


def build(src, out, names=(), flavours=(), sites=None, jobs=None, marks_from=None, nvcc=None):
    """Build into out/; the hardware marks come from marks_from/hardware_runs.json (default: out/); nvcc: an
    explicit nvcc for cu13 (default: $NVCC, else the cu13 site's)."""
    marks = read_marks(marks_from or out, src.parent)
    all_families = discover_families(src)
    families = select(all_families, names, "family", [f.name for f in all_families])
    flavours = select(list(FLAVOURS), flavours, "flavour", FLAVOURS)
    sites = sites or {}
    chains = {
        fl: toolchains.Toolchain(fl, sites.get(fl, REPO / "build" / f"{fl}-site"), families, nvcc) for fl in flavours
    }
    structs, constants = measure_params(src)
    work = targets(families, flavours)

    def build_one(target):
        cubin = chains[target.flavour].compile(target.family, target.variant, target.arch, src)
        entry = manifest_entry(target, src, cubin, chains[target.flavour].compiler(target.family))
        mismatch = block_problems(target.family, entry["kernels"], entry["blocks"])
        if mismatch:
            raise BuildError(f"{entry['path']}: " + "; ".join(mismatch))
        write_atomic(out / entry["path"], cubin)
        print(f"built {entry['path']}: {len(cubin)} bytes, {len(entry['kernels'])} kernels", flush=True)
        return entry

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        entries = list(pool.map(build_one, work))

    manifest_path = out / "manifest.json"
    described = {fl: chain.describe() for fl, chain in chains.items()}
    partial = len(families) < len(all_families) or len(flavours) < len(FLAVOURS)
    if partial and manifest_path.is_file():  # keep the rest, except families whose source is gone
        rebuilt = {(f.name, fl) for f in families for fl in flavours}
        existing = {f.name for f in all_families}
        old = manifest_lib.load_manifest(manifest_path)
        entries += [e for e in old["cubins"] if (e["family"], e["flavour"]) not in rebuilt and e["family"] in existing]
        described = {**old.get("toolchains", {}), **described}
    remove_stray_cubins(out, {e["path"] for e in entries})
    manifest = {
        "schema": manifest_lib.SCHEMA,
        "toolchains": described,
        "structs": structs,
        "constants": constants,
        "cubins": sorted(entries, key=lambda e: e["path"]),
    }
    apply_marks(manifest, marks)
    write_manifest(manifest_path, manifest)
    print(f"wrote {manifest_path} ({len(manifest['cubins'])} cubins)")
    warn_stale_marks(marks, manifest["cubins"])


# ---------------------------------------------------------------- --check


def check_entry(src, out, expected, entry):
    key = (entry["family"], entry.get("flavour"), entry["arch"], entry["variant"])
    target = expected.get(key)
    if target is None:
        return [f"{entry['path']}: no such family/flavour/arch/variant in {src.name}/: {REBUILD_HINT}"]
    problems = []
    if entry["path"] != target.path:
        problems.append(f"{entry['path']}: should be at {target.path}: {REBUILD_HINT}")
    if target_digest(src, target) != entry["source_sha256"]:
        problems.append(
            f"{entry['path']}: stale, its sources, flags or pinned packages changed since it was built: {REBUILD_HINT}"
        )
    cubin = out / entry["path"]
    if not cubin.is_file():
        problems.append(f"{entry['path']}: cubin file missing: {REBUILD_HINT}")
    elif manifest_lib.file_sha256(cubin) != entry["sha256"]:
        problems.append(f"{entry['path']}: cubin sha256 differs from the manifest: {REBUILD_HINT}")
    else:
        problems += check_blocks(target, entry, cubin.read_bytes())
    return problems


def check_blocks(target, entry, cubin):
    """The entry's kernel block sizes against the cubin's (.nv.info) and the source's __launch_bounds__."""
    try:
        blocks = kernel_blocks(cubin)
        problems = [
            f"{entry['path']}: {p}: {REBUILD_HINT}"
            for p in block_problems(target.family, kernel_symbols(cubin), blocks)
        ]
    except BuildError as e:
        return [f"{entry['path']}: {e}"]
    if entry.get("blocks") != blocks:
        problems.append(
            f"{entry['path']}: the manifest's block sizes {entry.get('blocks')} differ from the cubin's "
            f"{blocks}: {REBUILD_HINT}"
        )
    return problems


def check_structs(src, manifest):
    header = src / PARAMS_HEADER
    current = parse_structs(header.read_text(encoding="utf-8")) if header.is_file() else {}
    recorded = {name: set(s["fields"]) for name, s in manifest.get("structs", {}).items()}
    problems = []
    for name in sorted(current.keys() | recorded.keys()):
        if name not in recorded:
            problems.append(f"params.h struct {name} is not in the manifest: {REBUILD_HINT}")
        elif name not in current:
            problems.append(f"manifest struct {name} is no longer in params.h: {REBUILD_HINT}")
        elif set(current[name]) != recorded[name]:
            added, removed = sorted(set(current[name]) - recorded[name]), sorted(recorded[name] - set(current[name]))
            problems.append(
                f"params.h struct {name} fields differ from the manifest "
                f"(added {added}, removed {removed}): {REBUILD_HINT}"
            )
    return problems


def check(src, out, flavours=()):
    """(problems, number of cubins) comparing out/ with src/; needs neither a compiler nor a GPU. Every
    target of the `flavours` asked for (default: all) must be in the manifest; every entry must be current."""
    try:
        manifest = manifest_lib.load_manifest(out / "manifest.json")
    except manifest_lib.ManifestError as e:
        return [str(e)], 0
    families = discover_families(src)
    expected = {t.key: t for t in targets(families)}
    required = {t.key for t in targets(families, select(list(FLAVOURS), flavours, "flavour", FLAVOURS))}
    problems, entries = [], {}
    for entry in manifest["cubins"]:
        key = (entry["family"], entry.get("flavour"), entry["arch"], entry["variant"])
        if key in entries:
            problems.append(f"{entry['path']}: duplicate manifest entry")
        entries[key] = entry
    problems += [f"{expected[k].path}: no manifest entry: {REBUILD_HINT}" for k in sorted(required - entries.keys())]
    for key in sorted(entries):
        problems += check_entry(src, out, expected, entries[key])
    listed = {e["path"] for e in entries.values()}
    problems += [
        f"{p.relative_to(out).as_posix()}: cubin file not in the manifest: {REBUILD_HINT}"
        for p in sorted(out.rglob("*.cubin"))
        if p.relative_to(out).as_posix() not in listed
    ]
    problems += check_structs(src, manifest)
    problems += check_marks(src, out, manifest, list(entries.values()))
    return problems, len(entries)


def check_marks(src, out, manifest, entries):
    """Malformed or stale marks in out/hardware_runs.json; manifest marks that do not follow from them."""
    doc, problems = marks_lib.load(out)
    marks = doc["marks"]
    problems += marks_lib.field_problems(marks, src.parent)
    problems += marks_lib.stale_problems(marks, entries, MARKS_HINT)
    hint = "python tools/build_cubins.py --update-marks"
    for entry in entries:
        if entry.get("ran_on_hardware") != marks_lib.marked(entry, marks):
            problems.append(
                f"{entry['path']}: ran_on_hardware is {entry.get('ran_on_hardware')} in the manifest, "
                f"but {marks_lib.MARKS_FILE} says {marks_lib.marked(entry, marks)}: {hint}"
            )
    if manifest.get("hardware_runs") != marks:
        problems.append(f"manifest.json: its hardware_runs differ from {marks_lib.MARKS_FILE}: {hint}")
    return problems


# ---------------------------------------------------------------- --verify


def compare_outputs(shipped, rebuilt):
    """Every difference between the shipped cubins/ and a rebuild of it: cubin files and the manifest."""

    def files(root):
        return {p.relative_to(root).as_posix() for p in root.rglob("*.cubin")} | (
            {"manifest.json"} if (root / "manifest.json").is_file() else set()
        )

    have, want = files(shipped), files(rebuilt)
    problems = [f"{p}: shipped, but the rebuild makes no such file" for p in sorted(have - want)]
    problems += [f"{p}: the rebuild makes it, but it is not shipped" for p in sorted(want - have)]
    for name in sorted(have & want):
        a, b = (shipped / name).read_bytes(), (rebuilt / name).read_bytes()
        if a == b:
            continue
        if name == "manifest.json":
            old, new = json.loads(a), json.loads(b)
            keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            problems.append(f"manifest.json: differs from the rebuild's (in {', '.join(keys)})")
        else:
            problems.append(
                f"{name}: differs from the rebuild ({len(a)} vs {len(b)} bytes; ELF sections that "
                f"differ: {', '.join(section_differences(a, b))})"
            )
    return problems


def verify(src, out, sites=None, jobs=None, nvcc=None):
    """(problems, number of files compared): rebuild everything into a scratch folder and compare bytes."""
    with tempfile.TemporaryDirectory(prefix="ep_rt_verify_") as scratch:
        rebuilt = Path(scratch) / out.name
        build(src, rebuilt, sites=sites, jobs=jobs, marks_from=out, nvcc=nvcc)
        count = len(list(rebuilt.rglob("*.cubin"))) + 1
        return compare_outputs(out, rebuilt), count


# ---------------------------------------------------------------- CLI


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=str(REPO / "kernels_src"), help="kernel sources (default: %(default)s)")
    parser.add_argument("--out", default=str(REPO / "cubins"), help="cubins and manifest (default: %(default)s)")
    parser.add_argument(
        "--family",
        action="append",
        default=[],
        metavar="NAME",
        help="build only this family (repeatable); other manifest entries are kept",
    )
    parser.add_argument(
        "--flavour",
        action="append",
        default=[],
        choices=FLAVOURS,
        help="build (or with --check, require) only this flavour (repeatable)",
    )
    for fl in FLAVOURS:
        parser.add_argument(
            f"--{fl}-site",
            default=str(REPO / "build" / f"{fl}-site"),
            metavar="DIR",
            help=f"the {fl} pip site (default: %(default)s)",
        )
    parser.add_argument(
        "--install-sites", action="store_true", help="pip-install the pinned packages into the sites first (needs PyPI)"
    )
    parser.add_argument("--check", action="store_true", help="verify out/ against src/ without building")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="rebuild everything into a scratch folder and compare its bytes with out/ (every "
        "differing file is reported)",
    )
    parser.add_argument(
        "--nvcc",
        default=None,
        metavar="PATH",
        help=f"build cu13 with this nvcc (a toolkit's, version {toolchains.NVCC_VERSION}) instead "
        "of the cu13 site's (default: $NVCC, else the site's)",
    )
    parser.add_argument(
        "--update-marks",
        action="store_true",
        help="rewrite only the manifest's hardware marks from out/hardware_runs.json (no compiler)",
    )
    parser.add_argument("--jobs", "-j", type=int, default=None, help="parallel compiler runs (default: CPU count)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    src, out = Path(os.path.abspath(args.src)), Path(os.path.abspath(args.out))
    sites = {fl: Path(os.path.abspath(getattr(args, f"{fl}_site"))) for fl in FLAVOURS}
    try:
        if args.check:
            problems, count = check(src, out, args.flavour)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                return 1
            print(f"cubins up to date: {count} cubins")
            return 0
        if args.update_marks:
            update_marks(src, out)
            return 0
        if args.verify and (args.family or args.flavour):
            raise BuildError("--verify rebuilds every family and flavour: it takes no --family or --flavour")
        if args.install_sites:
            for fl in args.flavour or FLAVOURS:
                toolchains.install_site(fl, sites[fl])
        if args.verify:
            problems, count = verify(src, out, sites, args.jobs, args.nvcc)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print(f"build_cubins: {len(problems)} of {count} files differ from a rebuild", file=sys.stderr)
                return 1
            print(f"cubins reproduced: {count} files (every cubin and the manifest) byte-identical to a rebuild")
            return 0
        build(src, out, args.family, args.flavour, sites, args.jobs, nvcc=args.nvcc)
        return 0
    except BuildError as e:
        print(f"build_cubins: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
