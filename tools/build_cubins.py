#!/usr/bin/env python3
"""Compile kernels_src/*.cu into cubins/<arch>/<variant>/<family>.cubin and write cubins/manifest.json.

    python tools/build_cubins.py                  build every family (needs nvcc, a host C++ compiler)
    python tools/build_cubins.py --family NAME    rebuild only NAME (repeatable); other entries are kept
    python tools/build_cubins.py --check          CI: is cubins/ current with kernels_src/? (stdlib only)

A family is one kernels_src/<family>.cu. It declares its build needs in comment lines:
    // ep_rt-build: variants=safe,aggressive      (default: one variant named "default")
    // ep_rt-build: nvshmem                       (device-links libnvshmem_device, two nvcc steps)

Reproducible output: nvcc runs in a scratch staging folder that holds two symlinks, <src name> -> the
source folder and nvshmem -> the NVSHMEM wheel's nvidia/nvshmem folder, so every path on the nvcc
command lines is relative and the same on every machine (the device linker writes its -L paths into
the cubin). The recorded flags are exactly those command lines without input and output names.
"""
import argparse
import concurrent.futures
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHS = ("sm_90",)
VARIANT_DEFINES = {
    "default": [],
    "safe": ["-DEP_RT_AGGRESSIVE_PTX=0"],
    "aggressive": ["-DEP_RT_AGGRESSIVE_PTX=1"],
}
COMMON_FLAGS = ["-O3", "-std=c++17"]
EXTRA_FLAGS = ["--expt-relaxed-constexpr"]
NVSHMEM_PACKAGE = "nvidia-nvshmem-cu13"
NVSHMEM_LINK = "nvshmem"
PARAMS_HEADER = Path("include", "ep_rt", "params.h")
DIRECTIVE = "// ep_rt-build:"
REBUILD_HINT = "rebuild with python tools/build_cubins.py"


def _load_manifest_lib():
    # Loaded by file path so that --check never runs ep_rt/__init__.py (which may import torch).
    spec = importlib.util.spec_from_file_location("_ep_rt_manifest", REPO / "ep_rt" / "runtime" / "manifest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


manifest_lib = _load_manifest_lib()


class BuildError(Exception):
    """A build or configuration problem, reported as one message without a traceback."""


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    source: Path
    variants: tuple
    needs_nvshmem: bool


# ---------------------------------------------------------------- families and sources

def read_directives(path):
    """(variants, needs_nvshmem) from the `// ep_rt-build:` lines of a .cu file."""
    variants, needs_nvshmem = None, False
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line.startswith(DIRECTIVE):
            continue
        for option in re.sub(r"\s*,\s*", ",", line[len(DIRECTIVE):]).split():
            if option == "nvshmem":
                needs_nvshmem = True
            elif option.startswith("variants="):
                variants = tuple(v for v in option[len("variants="):].split(",") if v)
                unknown = [v for v in variants if v not in VARIANT_DEFINES]
                if unknown or not variants:
                    raise BuildError(f"{path.name}:{lineno}: unknown variant(s) {unknown or option!r}; "
                                     f"known: {', '.join(VARIANT_DEFINES)}")
            else:
                raise BuildError(f"{path.name}:{lineno}: unknown ep_rt-build option {option!r} "
                                 "(known: variants=a,b and nvshmem)")
    return variants or ("default",), needs_nvshmem


def discover_families(src):
    """Every <src>/*.cu as a Family, sorted by name."""
    if not src.is_dir():
        raise BuildError(f"no kernel source folder {src}")
    return [Family(p.stem, p, *read_directives(p)) for p in sorted(src.glob("*.cu"))]


def include_files(src):
    """All files under <src>/include, sorted; every family depends on all of them."""
    return sorted(p for p in (src / "include").rglob("*") if p.is_file())


def relative_sources(src, family):
    return sorted(os.path.relpath(p, src.parent).replace(os.sep, "/")
                  for p in [family.source, *include_files(src)])


def nvcc_commands(family, variant, arch, src_name):
    """nvcc argument lists (without the nvcc path) run in the staging folder; the cubin's name."""
    source, obj, cubin = f"{src_name}/{family.name}.cu", f"{family.name}.o", f"{family.name}.cubin"
    head = [*COMMON_FLAGS, f"-I{src_name}/include"]
    tail = [*EXTRA_FLAGS, *VARIANT_DEFINES[variant]]
    if not family.needs_nvshmem:
        return [[f"-arch={arch}", "-cubin", *head, *tail, source, "-o", cubin]], cubin
    # One step would silently give an unlinked cubin: compile relocatable, then device-link.
    return [
        [f"-arch={arch}", "-rdc=true", *head, f"-I{NVSHMEM_LINK}/include", *tail, "-c", source, "-o", obj],
        [f"-arch={arch}", "-dlink", "-cubin", obj, f"-L{NVSHMEM_LINK}/lib", "-lnvshmem_device", "-o", cubin],
    ], cubin


def recorded_flags(family, variant, arch, src_name):
    """The nvcc flags of every step, without input and output names; identical on every machine."""
    commands, _ = nvcc_commands(family, variant, arch, src_name)
    return [arg for cmd in commands for arg in cmd if arg.startswith("-") and arg != "-o"]


def family_digest(src, family, variant, arch):
    flags = recorded_flags(family, variant, arch, src.name)
    return manifest_lib.source_digest(src.parent, family.source, include_files(src), flags, arch)


# ---------------------------------------------------------------- tools and versions

def find_nvcc():
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    candidates += [os.path.join(os.environ[v], "bin", "nvcc") for v in ("CUDA_HOME", "CUDA_PATH") if v in os.environ]
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise BuildError("nvcc not found (looked at $NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")


def nvcc_version(nvcc):
    """'13.0.88' from nvcc --version ("... release 13.0, V13.0.88")."""
    text = run_tool([nvcc, "--version"], "nvcc --version")
    match = re.search(r"release [\d.]+, V([\d.]+)", text)
    if match is None:
        raise BuildError(f"cannot read the version from `{nvcc} --version`:\n{text}")
    return match.group(1)


def installed_nvshmem_version():
    try:
        return importlib.metadata.version(NVSHMEM_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def find_nvshmem():
    """The nvidia/nvshmem folder of the installed nvidia-nvshmem-cu13 wheel."""
    try:
        spec = importlib.util.find_spec("nvidia.nvshmem")
    except ModuleNotFoundError:
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location)
        if (folder / "include" / "nvshmem.h").is_file() and (folder / "lib" / "libnvshmem_device.a").is_file():
            return folder
    raise BuildError(f"NVSHMEM families need the {NVSHMEM_PACKAGE} package (nvidia/nvshmem with include/ and "
                     f"lib/libnvshmem_device.a), not found for {sys.executable}: "
                     f"pip install {NVSHMEM_PACKAGE}==<the version torch pins>")


def find_host_compiler():
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return [shutil.which(name)]
    return [find_nvcc(), "-x", "c++"]


# ---------------------------------------------------------------- cubin symbols (ELF)

SHT_SYMTAB, STT_FUNC, STB_GLOBAL, SHN_UNDEF = 2, 2, 1, 0
STO_CUDA_ENTRY = 0x10  # st_other bit of a __global__ function; rdc device functions are global FUNCs too


def kernel_symbols(cubin):
    """Sorted names of the kernels (__global__ functions) defined in a cubin's ELF symbol table."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise BuildError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != SHT_SYMTAB:
            continue
        strtab = sections[link][4]
        for pos in range(offset, offset + size, entsize or 24):
            st_name, st_info, st_other, st_shndx, _, _ = struct.unpack_from("<IBBHQQ", cubin, pos)
            if (st_info & 0xF == STT_FUNC and st_info >> 4 == STB_GLOBAL and st_shndx != SHN_UNDEF
                    and st_other & STO_CUDA_ENTRY):
                name = cubin[strtab + st_name:cubin.index(b"\0", strtab + st_name)].decode()
                if name:
                    names.add(name)
    return sorted(names)


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
    for name, expr in re.findall(r"^[ \t]*#[ \t]*define[ \t]+(EP_RT_\w+)[ \t]+(.+?)[ \t]*$",
                                 strip_comments(text), re.M):
        tokens = re.findall(r"\w+", expr)
        if re.fullmatch(r"[\w\s()+\-*/%<>&|^~]+", expr) and all(
                t[0].isdigit() or t in names for t in tokens):
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

def run_tool(cmd, what, cwd=None):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"{what} failed:\n  $ {shlex.join(cmd)}\n{result.stdout}{result.stderr}")
    return result.stdout


def compile_cubin(family, variant, arch, src, nvcc, nvshmem_dir):
    """The cubin bytes of one (family, variant, arch), built in a scratch staging folder."""
    commands, cubin = nvcc_commands(family, variant, arch, src.name)
    with tempfile.TemporaryDirectory(prefix="ep_rt_build_") as stage:
        os.symlink(src, os.path.join(stage, src.name))
        if family.needs_nvshmem:
            os.symlink(nvshmem_dir, os.path.join(stage, NVSHMEM_LINK))
        for args in commands:
            run_tool([nvcc, *args], f"nvcc for {family.name} {arch}/{variant}", cwd=stage)
        return Path(stage, cubin).read_bytes()


def manifest_entry(family, variant, arch, src, cubin, nvcc_ver, nvshmem_ver):
    return {
        "path": f"{arch}/{variant}/{family.name}.cubin",
        "family": family.name,
        "arch": arch,
        "variant": variant,
        "sha256": hashlib.sha256(cubin).hexdigest(),
        "source_sha256": family_digest(src, family, variant, arch),
        "sources": relative_sources(src, family),
        "nvcc": nvcc_ver,
        "nvshmem": nvshmem_ver if family.needs_nvshmem else None,
        "flags": recorded_flags(family, variant, arch, src.name),
        "kernels": kernel_symbols(cubin),
        "needs_nvshmem": family.needs_nvshmem,
    }


def select_families(families, names):
    if not names:
        return families
    known = {f.name for f in families}
    unknown = sorted(set(names) - known)
    if unknown:
        raise BuildError(f"unknown family {', '.join(unknown)}; families in sources: {', '.join(sorted(known))}")
    return [f for f in families if f.name in names]


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


def build(src, out, names=(), jobs=None):
    families = select_families(discover_families(src), names)
    nvcc = find_nvcc()
    nvcc_ver, nvshmem_ver = nvcc_version(nvcc), installed_nvshmem_version()
    nvshmem_dir = find_nvshmem() if any(f.needs_nvshmem for f in families) else None
    structs, constants = measure_params(src)
    work = [(f, v, a) for f in families for v in f.variants for a in ARCHS]

    def build_one(item):
        family, variant, arch = item
        cubin = compile_cubin(family, variant, arch, src, nvcc, nvshmem_dir)
        entry = manifest_entry(family, variant, arch, src, cubin, nvcc_ver, nvshmem_ver)
        write_atomic(out / entry["path"], cubin)
        print(f"built {entry['path']}: {len(entry['kernels'])} kernels", flush=True)
        return entry

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        entries = list(pool.map(build_one, work))

    manifest_path = out / "manifest.json"
    if names and manifest_path.is_file():
        rebuilt = {f.name for f in families}
        old = manifest_lib.load_manifest(manifest_path)["cubins"]
        entries += [e for e in old if e["family"] not in rebuilt]
    else:
        remove_stray_cubins(out, {e["path"] for e in entries})
    manifest = {
        "schema": manifest_lib.SCHEMA,
        "nvcc_version": nvcc_ver,
        "nvshmem_version": nvshmem_ver,
        "structs": structs,
        "constants": constants,
        "cubins": sorted(entries, key=lambda e: e["path"]),
    }
    write_atomic(manifest_path, (json.dumps(manifest, sort_keys=True, indent=1) + "\n").encode())
    print(f"wrote {manifest_path} ({len(manifest['cubins'])} cubins)")


# ---------------------------------------------------------------- --check

def check_entry(src, out, families, entry):
    family = families.get(entry["family"])
    if family is None or entry["variant"] not in family.variants or entry["arch"] not in ARCHS:
        return [f"{entry['path']}: no such family/variant/arch in {src.name}/: {REBUILD_HINT}"]
    problems = []
    if family_digest(src, family, entry["variant"], entry["arch"]) != entry["source_sha256"]:
        problems.append(f"{entry['path']}: stale, its sources or flags changed since it was built: {REBUILD_HINT}")
    cubin = out / entry["path"]
    if not cubin.is_file():
        problems.append(f"{entry['path']}: cubin file missing: {REBUILD_HINT}")
    elif manifest_lib.file_sha256(cubin) != entry["sha256"]:
        problems.append(f"{entry['path']}: cubin sha256 differs from the manifest: {REBUILD_HINT}")
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
            problems.append(f"params.h struct {name} fields differ from the manifest "
                            f"(added {added}, removed {removed}): {REBUILD_HINT}")
    return problems


def check(src, out):
    """(problems, number of cubins) comparing out/ with src/; needs neither nvcc nor a GPU."""
    try:
        manifest = manifest_lib.load_manifest(out / "manifest.json")
    except manifest_lib.ManifestError as e:
        return [str(e)], 0
    families = {f.name: f for f in discover_families(src)}
    problems, entries = [], {}
    for entry in manifest["cubins"]:
        key = (entry["family"], entry["arch"], entry["variant"])
        if key in entries:
            problems.append(f"{entry['path']}: duplicate manifest entry")
        entries[key] = entry
    for family in families.values():
        for variant in family.variants:
            problems += [f"{family.name} {arch}/{variant}: no manifest entry: {REBUILD_HINT}"
                         for arch in ARCHS if (family.name, arch, variant) not in entries]
    for key in sorted(entries):
        problems += check_entry(src, out, families, entries[key])
    listed = {e["path"] for e in entries.values()}
    problems += [f"{p.relative_to(out).as_posix()}: cubin file not in the manifest: {REBUILD_HINT}"
                 for p in sorted(out.rglob("*.cubin")) if p.relative_to(out).as_posix() not in listed]
    problems += check_structs(src, manifest)
    return problems, len(entries)


# ---------------------------------------------------------------- CLI

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=str(REPO / "kernels_src"), help="kernel sources (default: %(default)s)")
    parser.add_argument("--out", default=str(REPO / "cubins"), help="cubins and manifest (default: %(default)s)")
    parser.add_argument("--family", action="append", default=[], metavar="NAME",
                        help="build only this family (repeatable); other manifest entries are kept")
    parser.add_argument("--check", action="store_true", help="verify out/ against src/ without building")
    parser.add_argument("--jobs", "-j", type=int, default=None, help="parallel nvcc runs (default: CPU count)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    src, out = Path(os.path.abspath(args.src)), Path(os.path.abspath(args.out))
    try:
        if args.check:
            problems, count = check(src, out)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                return 1
            print(f"cubins up to date: {count} cubins")
            return 0
        build(src, out, args.family, args.jobs)
        return 0
    except BuildError as e:
        print(f"build_cubins: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
