"""tools/build_cubins.py and ep_rt/runtime/manifest.py: builds of throwaway kernel families, the manifest they
produce, and --check catching stale, missing, tampered and unlisted cubins. CPU only; builds need nvcc."""
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "build_cubins.py"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ep_rt.runtime.manifest import find_cubin_entries, load_manifest, source_digest  # noqa: E402

REBUILD = "with python tools/build_cubins.py"

PARAMS_H = """\
#pragma once
#include <stdint.h>
#define EP_RT_TEST_RANKS 4
#define EP_RT_TEST_WORDS (2 + EP_RT_TEST_RANKS)
#define EP_RT_TEST_INLINE __forceinline__
struct Inner {
    int64_t a;
    int32_t b;  // padded to 16 bytes
};
struct Outer {
    uint64_t ptrs[EP_RT_TEST_RANKS];
    struct Inner inner;
    int32_t n, m;
};
"""

PTX_CUH = """\
#pragma once
#if EP_RT_AGGRESSIVE_PTX
#define TEST_LOAD(p) __ldg(p)
#else
#define TEST_LOAD(p) (*(p))
#endif
"""

ALPHA_CU = """\
// Two-variant test family.
// ep_rt-build: variants=safe,aggressive
#include "ep_rt/params.h"
#include "ep_rt/ptx.cuh"
#ifndef EP_RT_AGGRESSIVE_PTX
#error "safe and aggressive variants must define EP_RT_AGGRESSIVE_PTX"
#endif
__device__ __noinline__ int twice(int x) { return 2 * x; }
extern "C" __global__ void alpha_copy(const int *in, int *out) { out[threadIdx.x] = twice(TEST_LOAD(in + threadIdx.x)); }
extern "C" __global__ void alpha_outer(Outer p) { ((int *)p.ptrs[0])[threadIdx.x] = p.n + p.m + (int)p.inner.a; }
"""

BETA_CU = """\
// Single default variant.
#include "ep_rt/params.h"
#ifdef EP_RT_AGGRESSIVE_PTX
#error "the default variant must not define EP_RT_AGGRESSIVE_PTX"
#endif
extern "C" __global__ void beta_fill(int *out, int v) { out[threadIdx.x] = v + EP_RT_TEST_WORDS; }
"""

SHMEM_CU = """\
// ep_rt-build: nvshmem
#include <nvshmem.h>
#include <nvshmemx.h>
extern "C" __global__ void shmem_put(int *sym, int peer, int v) {
    int *p = (int *)nvshmem_ptr(sym, peer);
    if (p != nullptr) *p = v; else nvshmem_int_p(sym, v, peer);
}
"""


def _load_tool():
    spec = importlib.util.spec_from_file_location("_build_cubins", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_cubins = _load_tool()


def run_tool(*args, env=None):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, env=env)


def run_check(root):
    """--check in an environment with no nvcc to be found: it must need none."""
    env = {k: v for k, v in os.environ.items() if k not in ("NVCC", "CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = "/nonexistent"
    return run_tool("--check", "--src", root / "kernels_src", "--out", root / "cubins", env=env)


def write_sources(root, families):
    src = root / "kernels_src"
    (src / "include" / "ep_rt").mkdir(parents=True)
    (src / "include" / "ep_rt" / "params.h").write_text(PARAMS_H)
    (src / "include" / "ep_rt" / "ptx.cuh").write_text(PTX_CUH)
    for name, text in families.items():
        (src / f"{name}.cu").write_text(text)
    return src


def build_or_fail(root, *extra):
    result = run_tool("--src", root / "kernels_src", "--out", root / "cubins", *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return load_manifest(root / "cubins" / "manifest.json")


def require_nvcc():
    try:
        build_cubins.find_nvcc()
    except build_cubins.BuildError:
        pytest.skip("nvcc is not on PATH (nor at $CUDA_HOME/bin or /usr/local/cuda/bin): cannot build test cubins")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A source tree with two test families, built once; tests copy it before changing anything."""
    require_nvcc()
    root = tmp_path_factory.mktemp("built")
    write_sources(root, {"alpha": ALPHA_CU, "beta": BETA_CU})
    build_or_fail(root)
    return root


@pytest.fixture
def tree(built, tmp_path):
    root = tmp_path / "checkout"
    shutil.copytree(built, root)
    return root


# ---------------------------------------------------------------- what a build writes

def test_manifest_entries(built):
    manifest = load_manifest(built / "cubins" / "manifest.json")
    assert manifest["schema"] == 1
    assert manifest["nvcc_version"].count(".") == 2
    assert [e["path"] for e in manifest["cubins"]] == [
        "sm_90/aggressive/alpha.cubin", "sm_90/default/beta.cubin", "sm_90/safe/alpha.cubin"]
    defines = {"safe": ["-DEP_RT_AGGRESSIVE_PTX=0"], "aggressive": ["-DEP_RT_AGGRESSIVE_PTX=1"], "default": []}
    for entry in manifest["cubins"]:
        cubin = (built / "cubins" / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(cubin).hexdigest()
        assert entry["path"] == f"{entry['arch']}/{entry['variant']}/{entry['family']}.cubin"
        assert entry["arch"] == "sm_90" and entry["nvcc"] == manifest["nvcc_version"]
        assert entry["needs_nvshmem"] is False and entry["nvshmem"] is None
        assert entry["sources"] == sorted([f"kernels_src/{entry['family']}.cu", "kernels_src/include/ep_rt/params.h",
                                           "kernels_src/include/ep_rt/ptx.cuh"])
        assert entry["flags"] == ["-arch=sm_90", "-cubin", "-O3", "-std=c++17", "-Ikernels_src/include",
                                  "--expt-relaxed-constexpr", *defines[entry["variant"]]]
    assert find_cubin_entries(manifest, "alpha", "sm_90", "safe")[0]["kernels"] == ["alpha_copy", "alpha_outer"]
    assert find_cubin_entries(manifest, "beta", "sm_90", "default")[0]["kernels"] == ["beta_fill"]
    assert len(find_cubin_entries(manifest, "alpha")) == 2


def test_manifest_text_is_stable(built):
    path = built / "cubins" / "manifest.json"
    assert path.read_text() == json.dumps(load_manifest(path), sort_keys=True, indent=1) + "\n"


def test_struct_layouts_and_constants(built):
    manifest = load_manifest(built / "cubins" / "manifest.json")
    assert manifest["structs"] == {
        "Inner": {"size": 16, "align": 8, "fields": {"a": 0, "b": 8}},
        "Outer": {"size": 56, "align": 8, "fields": {"ptrs": 0, "inner": 32, "n": 48, "m": 52}},
    }
    assert manifest["constants"] == {"EP_RT_TEST_RANKS": 4, "EP_RT_TEST_WORDS": 6}


def test_source_digest_is_recomputable(built):
    manifest = load_manifest(built / "cubins" / "manifest.json")
    entry = find_cubin_entries(manifest, "beta", "sm_90", "default")[0]
    digest = source_digest(built, "kernels_src/beta.cu",
                           [built / p for p in entry["sources"] if "/include/" in p], entry["flags"], "sm_90")
    assert digest == entry["source_sha256"]


# ---------------------------------------------------------------- --check

def test_check_passes_in_another_folder_without_nvcc(tree):
    result = run_check(tree)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cubins up to date: 3 cubins"


def _edit(path, text):
    path.write_text(path.read_text() + text)


MUTATIONS = {
    "source edited": (lambda r: _edit(r / "kernels_src/alpha.cu", "// changed\n"),
                      ["sm_90/safe/alpha.cubin: stale", "sm_90/aggressive/alpha.cubin: stale"]),
    "include edited": (lambda r: _edit(r / "kernels_src/include/ep_rt/ptx.cuh", "// changed\n"),
                       ["sm_90/safe/alpha.cubin: stale", "sm_90/aggressive/alpha.cubin: stale",
                        "sm_90/default/beta.cubin: stale"]),
    "include added": (lambda r: (r / "kernels_src/include/ep_rt/new.cuh").write_text("#pragma once\n"),
                      ["sm_90/default/beta.cubin: stale"]),
    "cubin deleted": (lambda r: (r / "cubins/sm_90/default/beta.cubin").unlink(),
                      ["sm_90/default/beta.cubin: cubin file missing"]),
    "cubin tampered": (lambda r: _edit_bytes(r / "cubins/sm_90/safe/alpha.cubin"),
                       ["sm_90/safe/alpha.cubin: cubin sha256 differs"]),
    "cubin unlisted": (lambda r: shutil.copy(r / "cubins/sm_90/default/beta.cubin", r / "cubins/sm_90/default/x.cubin"),
                       ["sm_90/default/x.cubin: cubin file not in the manifest"]),
    "family added": (lambda r: (r / "kernels_src/gamma.cu").write_text(BETA_CU),
                     ["gamma sm_90/default: no manifest entry"]),
    "variants changed": (lambda r: (r / "kernels_src/beta.cu").write_text(
                             "// ep_rt-build: variants=safe,aggressive\n" + ALPHA_CU),
                         ["beta sm_90/safe: no manifest entry", "sm_90/default/beta.cubin: no such family/variant"]),
    "struct field renamed": (lambda r: (r / "kernels_src/include/ep_rt/params.h").write_text(
                                 PARAMS_H.replace("int32_t n, m;", "int32_t n, count;")),
                             ["params.h struct Outer fields differ from the manifest (added ['count'], removed ['m'])"]),
    "manifest deleted": (lambda r: (r / "cubins/manifest.json").unlink(), ["no cubin manifest at"]),
}


def _edit_bytes(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_check_fails(tree, mutation):
    change, expected = MUTATIONS[mutation]
    change(tree)
    result = run_check(tree)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    for text in expected:
        assert any(text in line and REBUILD in line for line in lines), (text, lines)
    if mutation == "source edited":
        assert not any("beta" in line for line in lines), lines


# ---------------------------------------------------------------- partial and full rebuilds

def test_family_rebuild_keeps_other_entries(tree):
    before = load_manifest(tree / "cubins" / "manifest.json")
    _edit(tree / "kernels_src/beta.cu", "// changed\n")
    after = build_or_fail(tree, "--family", "beta")
    assert find_cubin_entries(after, "alpha") == find_cubin_entries(before, "alpha")
    assert (find_cubin_entries(after, "beta")[0]["source_sha256"]
            != find_cubin_entries(before, "beta")[0]["source_sha256"])
    assert run_check(tree).returncode == 0


def test_full_rebuild_removes_cubins_of_deleted_families(tree):
    (tree / "kernels_src/alpha.cu").unlink()
    manifest = build_or_fail(tree)
    assert [e["path"] for e in manifest["cubins"]] == ["sm_90/default/beta.cubin"]
    assert sorted(p.name for p in (tree / "cubins").rglob("*.cubin")) == ["beta.cubin"]
    assert run_check(tree).returncode == 0


def test_unknown_family_is_an_error(tree):
    result = run_tool("--src", tree / "kernels_src", "--out", tree / "cubins", "--family", "nope")
    assert result.returncode == 1
    assert "unknown family nope" in result.stderr and "alpha, beta" in result.stderr


# ---------------------------------------------------------------- NVSHMEM two-step build

def test_nvshmem_family(tmp_path):
    require_nvcc()
    try:
        build_cubins.find_nvshmem()
    except build_cubins.BuildError:
        pytest.skip("the nvidia-nvshmem-cu13 package is not installed: cannot build an NVSHMEM family")
    write_sources(tmp_path, {"shmem": SHMEM_CU})
    manifest = build_or_fail(tmp_path)
    (entry,) = manifest["cubins"]
    version = importlib.metadata.version("nvidia-nvshmem-cu13")
    assert entry["needs_nvshmem"] is True
    assert entry["nvshmem"] == manifest["nvshmem_version"] == version
    assert entry["kernels"] == ["shmem_put"]  # not the linked-in nvshmemi_* device functions
    assert "-rdc=true" in entry["flags"] and "-dlink" in entry["flags"] and "-lnvshmem_device" in entry["flags"]
    assert not any(os.sep + "site-packages" in f or str(tmp_path) in f for f in entry["flags"])
    cubin = (tmp_path / "cubins" / entry["path"]).read_bytes()
    assert b"nvshmemi_device_lib_version_d" in cubin, "cubin not device-linked against libnvshmem_device"
    assert run_check(tmp_path).returncode == 0


# ---------------------------------------------------------------- the repo's own cubins

def test_repo_cubins_are_current():
    if not (REPO / "cubins" / "manifest.json").is_file():
        pytest.skip("cubins/manifest.json does not exist yet (run python tools/build_cubins.py)")
    result = run_check(REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("cubins up to date:")


# ---------------------------------------------------------------- pieces that need no nvcc

def test_directives(tmp_path):
    cu = tmp_path / "f.cu"
    cu.write_text("// ep_rt-build: variants=safe, aggressive\n// ep_rt-build: nvshmem\n")
    assert build_cubins.read_directives(cu) == (("safe", "aggressive"), True)
    cu.write_text("extern \"C\" __global__ void k() {}\n")
    assert build_cubins.read_directives(cu) == (("default",), False)
    for bad in ("// ep_rt-build: variants=fast\n", "// ep_rt-build: lto\n"):
        cu.write_text(bad)
        with pytest.raises(build_cubins.BuildError, match="f.cu:1"):
            build_cubins.read_directives(cu)


def test_header_parsing():
    assert build_cubins.parse_structs(PARAMS_H) == {"Inner": ["a", "b"], "Outer": ["ptrs", "inner", "n", "m"]}
    assert build_cubins.parse_constants(PARAMS_H) == ["EP_RT_TEST_RANKS", "EP_RT_TEST_WORDS"]


def test_source_digest_ignores_checkout_folder_but_not_flags(tmp_path):
    digests = []
    for folder in ("a", "b/c"):
        root = tmp_path / folder
        src = write_sources(root, {"beta": BETA_CU})
        includes = sorted((src / "include").rglob("*.h*"))
        digests.append(source_digest(root, src / "beta.cu", includes, ["-O3"], "sm_90"))
    assert digests[0] == digests[1]
    assert source_digest(root, src / "beta.cu", includes, ["-O2"], "sm_90") != digests[0]
    assert source_digest(root, src / "beta.cu", includes, ["-O3"], "sm_100") != digests[0]


def _fake_cubin(symbols):
    """A minimal ELF64 with one symbol table: (name, info, other, shndx) per symbol."""
    strtab, names = b"\0", []
    for name, *_ in symbols:
        names.append(len(strtab))
        strtab += name.encode() + b"\0"
    symtab = bytes(24) + b"".join(struct.pack("<IBBHQQ", off, info, other, shndx, 0, 0)
                                  for off, (_, info, other, shndx) in zip(names, symbols))
    shstrtab = b"\0.strtab\0.symtab\0.shstrtab\0"
    data = strtab + symtab + shstrtab
    shoff = 64 + len(data)
    sections = [bytes(64),
                struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(strtab), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 9, 2, 0, 0, 64 + len(strtab), len(symtab), 1, 1, 8, 24),
                struct.pack("<IIQQQQIIQQ", 17, 3, 0, 0, 64 + len(strtab) + len(symtab), len(shstrtab), 0, 0, 1, 0)]
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 4, 3)
    return header + data + b"".join(sections)


def test_kernel_symbols_keep_only_defined_global_entry_functions():
    func_global, func_local, object_global = 0x12, 0x02, 0x11
    cubin = _fake_cubin([("kernel_b", func_global, 0x10, 1), ("kernel_a", func_global, 0x10, 1),
                         ("device_fn", func_global, 0x00, 1), ("vprintf", func_global, 0x00, 0),
                         ("local_fn", func_local, 0x10, 1), ("state_d", object_global, 0x00, 1)])
    assert build_cubins.kernel_symbols(cubin) == ["kernel_a", "kernel_b"]
    with pytest.raises(build_cubins.BuildError):
        build_cubins.kernel_symbols(b"not an elf")
