"""tools/build_cubins.py and ep_rt/runtime/manifest.py: builds of throwaway kernel families in both flavours, the
manifest they produce, and --check catching stale, missing, tampered and unlisted cubins; the repo's own cubin set.
CPU only. Builds need nvcc 13.0 (cu13: the cu13 site's, else a toolkit of that version at $NVCC or /usr/local/cuda)
and the cu12 site (NVRTC/nvJitLink wheels); `python tools/build_cubins.py --install-sites` makes both sites under
build/ ($EP_RT_TEST_CU12_SITE / $EP_RT_TEST_CU13_SITE point elsewhere). Without the cu12 site, the builds here are
cu13-only and the cu12-specific tests skip."""

import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ..repo import REPO

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
extern "C" __global__ void __launch_bounds__(64, 2) alpha_outer(Outer p) { ((int *)p.ptrs[0])[threadIdx.x] = p.n + p.m + (int)p.inner.a; }
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
// ep_rt-build: nvshmem min_arch=sm_90
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
toolchains = build_cubins.toolchains
SITES = {
    "cu12": Path(os.environ.get("EP_RT_TEST_CU12_SITE", REPO / "build" / "cu12-site")),
    "cu13": Path(os.environ.get("EP_RT_TEST_CU13_SITE", REPO / "build" / "cu13-site")),
}
PLAIN = {"cu12": ["nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12"], "cu13": []}


def site_ready(flavour, nvshmem=False):
    """The site has what this flavour's builds here need (cu13: NVSHMEM only; nvcc is found by pick_nvcc)."""
    if flavour == "cu13":
        needed = [toolchains.NVSHMEM_PACKAGE["cu13"]] if nvshmem else []
    else:
        needed = list(toolchains.SITE_PINS[flavour]) if nvshmem else PLAIN[flavour]
    try:
        toolchains.check_site(flavour, SITES[flavour], needed)
        return True
    except build_cubins.BuildError:
        return False


def system_nvcc():
    """A toolkit's nvcc of the pinned version ($NVCC, else /usr/local/cuda), or None."""
    for candidate in (os.environ.get("NVCC"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.isfile(candidate):
            try:
                if toolchains.nvcc_version(candidate) == toolchains.NVCC_VERSION:
                    return candidate
            except build_cubins.BuildError:
                pass
    return None


SITE_NVCC = toolchains.site_toolkit(SITES["cu13"]) / "bin" / "nvcc"
# --nvcc for the cu13 builds here: none when the cu13 site has its own nvcc (the default), else a toolkit's
NVCC_ARGS = [] if SITE_NVCC.is_file() else (["--nvcc", system_nvcc()] if system_nvcc() else None)

# The flavours the throwaway families are built in here: cu13 always (nvcc), cu12 where its site is installed.
BUILT = tuple(f for f in build_cubins.FLAVOURS if f == "cu13" or site_ready(f))
FLAVOUR_ARGS = [] if len(BUILT) == 2 else [a for f in BUILT for a in ("--flavour", f)]


def run_tool(*args, env=None):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, env=env)


def run_check(root, *extra):
    """--check in an environment with no nvcc to be found: it must need none."""
    env = {k: v for k, v in os.environ.items() if k not in ("NVCC", "CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = "/nonexistent"
    return run_tool("--check", "--src", root / "kernels_src", "--out", root / "cubins", *FLAVOUR_ARGS, *extra, env=env)


def write_sources(root, families):
    src = root / "kernels_src"
    (src / "include" / "ep_rt").mkdir(parents=True)
    (src / "include" / "ep_rt" / "params.h").write_text(PARAMS_H)
    (src / "include" / "ep_rt" / "ptx.cuh").write_text(PTX_CUH)
    for name, text in families.items():
        (src / f"{name}.cu").write_text(text)
    return src


def build_or_fail(root, *extra):
    sites = [a for f in build_cubins.FLAVOURS for a in (f"--{f}-site", SITES[f])]
    result = run_tool("--src", root / "kernels_src", "--out", root / "cubins", *sites, *(NVCC_ARGS or []), *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return load_manifest(root / "cubins" / "manifest.json")


def require_nvcc():
    if NVCC_ARGS is None:
        pytest.skip(
            f"no nvcc {toolchains.NVCC_VERSION}: neither the cu13 site's ({SITE_NVCC}; python "
            f"tools/build_cubins.py --install-sites) nor a toolkit's at $NVCC or /usr/local/cuda/bin"
        )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A source tree with two test families, built once; tests copy it before changing anything."""
    require_nvcc()
    root = tmp_path_factory.mktemp("built")
    write_sources(root, {"alpha": ALPHA_CU, "beta": BETA_CU})
    build_or_fail(root, *FLAVOUR_ARGS)
    return root


@pytest.fixture
def tree(built, tmp_path):
    root = tmp_path / "checkout"
    shutil.copytree(built, root)
    return root


# ---------------------------------------------------------------- what a build writes

# (family, arch, variant) of the test families: every arch, the aggressive variant only on sm_90.
TEST_TARGETS = [
    ("alpha", "sm_80", "safe"),
    ("alpha", "sm_90", "safe"),
    ("alpha", "sm_90", "aggressive"),
    ("alpha", "sm_100", "safe"),
    ("beta", "sm_80", "default"),
    ("beta", "sm_90", "default"),
    ("beta", "sm_100", "default"),
]
DEFINES = {"safe": ["-DEP_RT_AGGRESSIVE_PTX=0"], "aggressive": ["-DEP_RT_AGGRESSIVE_PTX=1"], "default": []}


def expected_flags(flavour, arch, variant):
    if flavour == "cu13":
        return [
            f"-arch={arch}",
            "-cubin",
            "-O3",
            "-std=c++17",
            "-Ikernels_src/include",
            "--expt-relaxed-constexpr",
            *DEFINES[variant],
        ]
    return [
        f"--gpu-architecture={arch}",
        "-std=c++17",
        "-Ikernels_src/include",
        "-Icu12/nvidia/cuda_cccl/include",
        "-Icu12/nvidia/cuda_runtime/include",
        "-Irtc_shim",
        *DEFINES[variant],
    ]


def test_manifest_entries(built):
    manifest = load_manifest(built / "cubins" / "manifest.json")
    assert manifest["schema"] == 2
    assert sorted(manifest["toolchains"]) == sorted(BUILT)
    assert manifest["toolchains"]["cu13"]["compiler"].startswith("nvcc 13.")
    assert sorted(e["path"] for e in manifest["cubins"]) == sorted(
        f"{fl}/{arch}/{variant}/{family}.cubin" for fl in BUILT for family, arch, variant in TEST_TARGETS
    )
    for entry in manifest["cubins"]:
        flavour, arch = entry["flavour"], entry["arch"]
        cubin = (built / "cubins" / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(cubin).hexdigest()
        assert (
            entry["compiler"] == {"cu13": manifest["toolchains"]["cu13"]["compiler"], "cu12": "nvrtc 12.9.86"}[flavour]
        )
        assert entry["needs_nvshmem"] is False and entry["nvshmem"] is None
        assert entry["min_driver"] == {"cu13": 13000, "cu12": 12080 if arch == "sm_100" else 12000}[flavour]
        assert entry["ran_on_hardware"] is False  # no marks in this tree (cubins/hardware_runs.json)
        assert entry["sources"] == sorted(
            [
                f"kernels_src/{entry['family']}.cu",
                "kernels_src/include/ep_rt/params.h",
                "kernels_src/include/ep_rt/ptx.cuh",
            ]
        )
        assert entry["flags"] == expected_flags(flavour, arch, entry["variant"])
        # the block size of the one kernel with __launch_bounds__, as compiled (the others have none to record)
        assert entry["blocks"] == ({"alpha_outer": 64} if entry["family"] == "alpha" else {}), entry["path"]
        # NVRTC 12 writes the ELF ABI that r525+ drivers load (sm_100 has only the newer one); nvcc 13 cannot.
        assert (cubin[7], cubin[8]) == ((0x33, 7) if flavour == "cu12" and arch != "sm_100" else (0x41, 8)), entry
    for flavour in BUILT:
        assert find_cubin_entries(manifest, "alpha", "sm_90", "safe", flavour)[0]["kernels"] == [
            "alpha_copy",
            "alpha_outer",
        ]
        assert find_cubin_entries(manifest, "beta", "sm_100", "default", flavour)[0]["kernels"] == ["beta_fill"]
    assert len(find_cubin_entries(manifest, "alpha", flavour="cu13")) == 4


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
    for entry in find_cubin_entries(manifest, "beta", "sm_90", "default"):
        digest = source_digest(
            built,
            "kernels_src/beta.cu",
            [built / p for p in entry["sources"] if "/include/" in p],
            entry["flags"],
            "sm_90",
            entry["toolchain"],
        )
        assert digest == entry["source_sha256"]


def test_build_is_reproducible_in_another_folder(built, tmp_path):
    root = tmp_path / "elsewhere" / "deeper"
    write_sources(root, {"alpha": ALPHA_CU, "beta": BETA_CU})
    again = build_or_fail(root, *FLAVOUR_ARGS)
    assert again == load_manifest(built / "cubins" / "manifest.json")


# ---------------------------------------------------------------- --check


def test_check_passes_in_another_folder_without_nvcc(tree):
    result = run_check(tree)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"cubins up to date: {len(TEST_TARGETS) * len(BUILT)} cubins"


def test_check_of_all_flavours_needs_both(tree):
    result = run_tool("--check", "--src", tree / "kernels_src", "--out", tree / "cubins")
    if len(BUILT) == 2:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 1 and "cu12/sm_90/safe/alpha.cubin: no manifest entry" in result.stderr


def _edit(path, text):
    path.write_text(path.read_text() + text)


MUTATIONS = {
    "source edited": (
        lambda r: _edit(r / "kernels_src/alpha.cu", "// changed\n"),
        [
            "cu13/sm_90/safe/alpha.cubin: stale",
            "cu13/sm_90/aggressive/alpha.cubin: stale",
            "cu13/sm_80/safe/alpha.cubin: stale",
        ],
    ),
    "include edited": (
        lambda r: _edit(r / "kernels_src/include/ep_rt/ptx.cuh", "// changed\n"),
        [
            "cu13/sm_90/safe/alpha.cubin: stale",
            "cu13/sm_90/aggressive/alpha.cubin: stale",
            "cu13/sm_100/default/beta.cubin: stale",
        ],
    ),
    "include added": (
        lambda r: (r / "kernels_src/include/ep_rt/new.cuh").write_text("#pragma once\n"),
        ["cu13/sm_90/default/beta.cubin: stale"],
    ),
    "cubin deleted": (
        lambda r: (r / "cubins/cu13/sm_90/default/beta.cubin").unlink(),
        ["cu13/sm_90/default/beta.cubin: cubin file missing"],
    ),
    "cubin tampered": (
        lambda r: _edit_bytes(r / "cubins/cu13/sm_90/safe/alpha.cubin"),
        ["cu13/sm_90/safe/alpha.cubin: cubin sha256 differs"],
    ),
    "cubin unlisted": (
        lambda r: shutil.copy(r / "cubins/cu13/sm_90/default/beta.cubin", r / "cubins/cu13/sm_90/default/x.cubin"),
        ["cu13/sm_90/default/x.cubin: cubin file not in the manifest"],
    ),
    "family added": (
        lambda r: (r / "kernels_src/gamma.cu").write_text(BETA_CU),
        ["cu13/sm_90/default/gamma.cubin: no manifest entry"],
    ),
    "min_arch raised": (
        lambda r: (r / "kernels_src/beta.cu").write_text("// ep_rt-build: min_arch=sm_90\n" + BETA_CU),
        ["cu13/sm_80/default/beta.cubin: no such family/flavour/arch/variant", "cu13/sm_90/default/beta.cubin: stale"],
    ),
    "variants changed": (
        lambda r: (r / "kernels_src/beta.cu").write_text("// ep_rt-build: variants=safe,aggressive\n" + ALPHA_CU),
        [
            "cu13/sm_90/safe/beta.cubin: no manifest entry",
            "cu13/sm_90/default/beta.cubin: no such family/flavour/arch/variant",
        ],
    ),
    "struct field renamed": (
        lambda r: (r / "kernels_src/include/ep_rt/params.h").write_text(
            PARAMS_H.replace("int32_t n, m;", "int32_t n, count;")
        ),
        ["params.h struct Outer fields differ from the manifest (added ['count'], removed ['m'])"],
    ),
    "manifest deleted": (lambda r: (r / "cubins/manifest.json").unlink(), ["no cubin manifest at"]),
    "launch bounds changed": (
        lambda r: (r / "kernels_src/alpha.cu").write_text(
            ALPHA_CU.replace("__launch_bounds__(64, 2)", "__launch_bounds__(128, 2)")
        ),
        [
            "cu13/sm_90/safe/alpha.cubin: stale",
            "cu13/sm_90/safe/alpha.cubin: kernel alpha_outer: the cubin is compiled for 64 threads "
            "per block, alpha.cu says __launch_bounds__(128)",
        ],
    ),
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


def test_check_sees_a_changed_pin(tree, monkeypatch):
    src, out = tree / "kernels_src", tree / "cubins"
    assert build_cubins.check(src, out, BUILT) == ([], len(TEST_TARGETS) * len(BUILT))
    monkeypatch.setitem(
        toolchains.SITE_PINS, "cu12", {**toolchains.SITE_PINS["cu12"], "nvidia-cuda-nvrtc-cu12": "12.9.99"}
    )
    problems, _ = build_cubins.check(src, out, BUILT)
    stale = sorted(p.split(":")[0] for p in problems)
    assert stale == sorted(f"cu12/{a}/{v}/{f}.cubin" for f, a, v in TEST_TARGETS if "cu12" in BUILT)


# ---------------------------------------------------------------- hardware marks (cubins/hardware_runs.json)

MARKED = "cu13/sm_90/default/beta.cubin"


def add_mark(root, path=MARKED, sha=None, **fields):
    """A mark for the cubin at `path` (its current bytes unless `sha`), with a log in the tree."""
    log = root / "docs" / "gpu_runs" / "2026-12-02_test" / "tests.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("1 passed\n")
    cubin = root / "cubins" / (path or MARKED)
    sha = sha or hashlib.sha256((cubin if cubin.is_file() else root / "cubins" / MARKED).read_bytes()).hexdigest()
    marks_file = root / "cubins" / "hardware_runs.json"
    doc = json.loads(marks_file.read_text()) if marks_file.is_file() else {"comment": [], "marks": []}
    doc["marks"].append(
        {
            "sha256": sha,
            "path": path,
            "date": "2026-12-02T10:00:00Z",
            "commit": "abc1234",
            "machine": "test GPU",
            "ran": "the beta test",
            "log": "docs/gpu_runs/2026-12-02_test/tests.log",
            **fields,
        }
    )
    marks_file.write_text(json.dumps(doc))


def update_marks(root):
    result = run_tool("--update-marks", "--src", root / "kernels_src", "--out", root / "cubins")
    assert result.returncode == 0, result.stderr
    return load_manifest(root / "cubins" / "manifest.json")


def test_a_mark_names_one_cubin_by_its_bytes(tree):
    add_mark(tree)
    result = run_check(tree)
    assert result.returncode == 1 and "manifest.json: its hardware_runs differ from hardware_runs.json" in result.stderr
    assert f"{MARKED}: ran_on_hardware is False in the manifest, but hardware_runs.json says True" in result.stderr
    manifest = update_marks(tree)
    assert [e["path"] for e in manifest["cubins"] if e["ran_on_hardware"]] == [MARKED]
    assert [m["path"] for m in manifest["hardware_runs"]] == [MARKED]
    assert run_check(tree).returncode == 0


def test_check_catches_a_mark_whose_cubin_changed(tree):
    """The bug of issue 20: a rebuilt cubin kept a mark it never earned. Rebuilt from an edited source, the cubin
    loses ran_on_hardware and --check names the file and the stale mark until the mark is moved or renewed."""
    add_mark(tree)
    update_marks(tree)
    old_sha = hashlib.sha256((tree / "cubins" / MARKED).read_bytes()).hexdigest()
    (tree / "kernels_src/beta.cu").write_text(BETA_CU.replace("v + EP_RT_TEST_WORDS", "v * 3 + EP_RT_TEST_WORDS"))
    manifest = build_or_fail(tree, "--family", "beta", *FLAVOUR_ARGS)
    entry = next(e for e in manifest["cubins"] if e["path"] == MARKED)
    assert entry["sha256"] != old_sha and entry["ran_on_hardware"] is False
    result = run_check(tree)
    assert result.returncode == 1
    stale = [line for line in result.stderr.splitlines() if "stale" in line]
    assert len(stale) == 1, result.stderr
    assert stale[0].startswith(
        f"hardware_runs.json: mark 0 ({MARKED}, sha256 {old_sha[:12]}..., "
        f"2026-12-02T10:00:00Z, abc1234) is stale: the cubin at {MARKED} is now "
        f"{entry['sha256'][:12]}..."
    )
    # Kept as a record of bytes no longer shipped, the mark is fine again; the cubin stays unmarked.
    marks_file = tree / "cubins" / "hardware_runs.json"
    doc = json.loads(marks_file.read_text())
    doc["marks"][0]["path"] = None
    marks_file.write_text(json.dumps(doc))
    manifest = update_marks(tree)
    assert not any(e["ran_on_hardware"] for e in manifest["cubins"])
    assert run_check(tree).returncode == 0


def test_check_catches_a_stale_mark_even_if_the_manifest_was_not_updated(tree):
    add_mark(tree)
    update_marks(tree)
    marks_file = tree / "cubins" / "hardware_runs.json"
    doc = json.loads(marks_file.read_text())
    doc["marks"][0]["sha256"] = "0" * 64
    marks_file.write_text(json.dumps(doc))
    result = run_check(tree)
    assert result.returncode == 1
    assert f"mark 0 ({MARKED}, sha256 000000000000..., 2026-12-02T10:00:00Z, abc1234) is stale" in result.stderr
    assert f"{MARKED}: ran_on_hardware is True in the manifest, but hardware_runs.json says False" in result.stderr


MARK_FAULTS = {
    "no log in the checkout": ({"log": "docs/gpu_runs/nowhere/x.log"}, "its log docs/gpu_runs/nowhere/x.log is not"),
    "log outside docs/gpu_runs": ({"log": "README.md"}, "log must be a path under docs/gpu_runs/"),
    "short sha256": ({"sha256": "abc"}, "sha256 is not 64 lower-case hex digits"),
    "bad date": ({"date": "yesterday"}, "date must be YYYY-MM-DD"),
    "empty ran": ({"ran": " "}, "ran must be a non-empty string"),
    "unknown field": ({"note": "x"}, "unknown ['note']"),
    "unclaimed shipped bytes": (
        {"path": None},
        "names the bytes of the shipped cu13/sm_90/default/beta.cubin but claims no path",
    ),
    "path not shipped": (
        {"path": "cu13/sm_90/default/gone.cubin"},
        "the cubin at cu13/sm_90/default/gone.cubin is not shipped",
    ),
}


@pytest.mark.parametrize("fault", sorted(MARK_FAULTS))
def test_check_fails_on_a_bad_mark(tree, fault):
    fields, expected = MARK_FAULTS[fault]
    sha = fields.pop("sha256", None)
    add_mark(tree, **({"sha": sha} if sha else {}), **fields)
    result = run_check(tree)
    assert result.returncode == 1
    assert any(
        line.startswith("hardware_runs.json: mark 0") and expected in line for line in result.stderr.splitlines()
    ), result.stderr
    if fault != "unclaimed shipped bytes" and fault != "path not shipped":
        # a malformed marks file stops builds and --update-marks too, before anything is written
        before = (tree / "cubins" / "manifest.json").read_bytes()
        result = run_tool("--update-marks", "--src", tree / "kernels_src", "--out", tree / "cubins")
        assert result.returncode == 1 and expected in result.stderr
        assert (tree / "cubins" / "manifest.json").read_bytes() == before


# ---------------------------------------------------------------- partial and full rebuilds


def test_family_rebuild_keeps_other_entries(tree):
    before = load_manifest(tree / "cubins" / "manifest.json")
    _edit(tree / "kernels_src/beta.cu", "// changed\n")
    after = build_or_fail(tree, "--family", "beta", *FLAVOUR_ARGS)
    assert find_cubin_entries(after, "alpha") == find_cubin_entries(before, "alpha")
    assert (
        find_cubin_entries(after, "beta")[0]["source_sha256"] != find_cubin_entries(before, "beta")[0]["source_sha256"]
    )
    assert run_check(tree).returncode == 0


def test_flavour_rebuild_keeps_the_other_flavour(tree):
    before = load_manifest(tree / "cubins" / "manifest.json")
    after = build_or_fail(tree, "--flavour", "cu13")
    assert after == before


def test_full_rebuild_removes_cubins_of_deleted_families(tree):
    (tree / "kernels_src/alpha.cu").unlink()
    manifest = build_or_fail(tree, *FLAVOUR_ARGS)
    assert sorted(e["path"] for e in manifest["cubins"]) == sorted(
        f"{fl}/{a}/default/beta.cubin" for fl in BUILT for a in ("sm_80", "sm_90", "sm_100")
    )
    assert sorted(p.name for p in (tree / "cubins").rglob("*.cubin")) == ["beta.cubin"] * 3 * len(BUILT)
    assert run_check(tree).returncode == 0


def test_unknown_family_or_flavour_is_an_error(tree):
    result = run_tool("--src", tree / "kernels_src", "--out", tree / "cubins", "--family", "nope")
    assert result.returncode == 1
    assert "unknown family nope" in result.stderr and "alpha, beta" in result.stderr
    result = run_tool("--check", "--src", tree / "kernels_src", "--out", tree / "cubins", "--flavour", "cu11")
    assert result.returncode == 2 and "invalid choice: 'cu11'" in result.stderr


def test_missing_site_names_the_install_command(tree, tmp_path):
    result = run_tool(
        "--src",
        tree / "kernels_src",
        "--out",
        tree / "cubins",
        "--flavour",
        "cu12",
        "--cu12-site",
        tmp_path / "no-site",
    )
    assert result.returncode == 1
    assert "--install-sites" in result.stderr and "nvidia-cuda-nvrtc-cu12==12.9.86" in result.stderr


# ---------------------------------------------------------------- NVSHMEM families


@pytest.mark.parametrize("flavour", build_cubins.FLAVOURS)
def test_nvshmem_family(tmp_path, flavour):
    require_nvcc()
    if not site_ready(flavour, nvshmem=True):
        pytest.skip(
            f"no {flavour} site with NVSHMEM at {SITES[flavour]} (python tools/build_cubins.py --install-sites)"
        )
    write_sources(tmp_path, {"shmem": SHMEM_CU})
    manifest = build_or_fail(tmp_path, "--flavour", flavour)
    entries = manifest["cubins"]
    assert [(e["arch"], e["variant"]) for e in entries] == [("sm_100", "default"), ("sm_90", "default")]
    package = toolchains.NVSHMEM_PACKAGE[flavour]
    for entry in entries:
        assert entry["needs_nvshmem"] is True
        assert entry["nvshmem"] == toolchains.SITE_PINS[flavour][package]
        assert f"{package}=={entry['nvshmem']}" in entry["toolchain"]
        assert entry["kernels"] == ["shmem_put"]  # not the linked-in nvshmemi_* device functions
        assert not any(os.sep + "site-packages" in f or str(tmp_path) in f or str(REPO) in f for f in entry["flags"])
        cubin = (tmp_path / "cubins" / entry["path"]).read_bytes()
        assert b"nvshmemi_device_lib_version_d" in cubin, "cubin not device-linked against libnvshmem_device"
    flags = {e["arch"]: e["flags"] for e in entries}
    if flavour == "cu13":
        assert "-rdc=true" in flags["sm_90"] and "nvlink:" in flags["sm_90"] and "-lnvshmem_device" in flags["sm_90"]
        assert "--orig_src_path_name=kernels_src/shmem.cu" in flags["sm_90"]  # the module id's input, relative
    else:
        assert "--relocatable-device-code=true" in flags["sm_90"] and "-maxrregcount=80" not in flags["sm_90"]
        assert "-maxrregcount=80" in flags["sm_100"]  # nvshmem-cu12 has no sm_100 SASS (cubin_toolchains)
    assert run_check(tmp_path, "--flavour", flavour).returncode == 0


# An NVSHMEM family with internal-linkage device code: its symbols carry nvcc's module id (_INTERNAL_<id>_...), which
# nvcc derived from the checkout's absolute path before the build pinned it.
SHMEM_INTERNAL_CU = (
    SHMEM_CU
    + """\
namespace { __device__ __noinline__ int bump(int v) { return v + 1; } }
static __device__ int calls;
extern "C" __global__ void shmem_bump(int *sym, int peer) { nvshmem_int_p(sym, bump(atomicAdd(&calls, 1)), peer); }
"""
)


def other_nvcc():
    """A second nvcc of the pinned version in another place and layout than the one the builds here use."""
    if NVCC_ARGS == [] and system_nvcc():
        return ["--nvcc", system_nvcc()]
    return [] if NVCC_ARGS and SITE_NVCC.is_file() else None


def test_nvshmem_cubins_are_the_same_from_any_folder_and_toolkit(tmp_path):
    """Issue 24: the cu13 NVSHMEM-linked cubins embedded a hash of the checkout's absolute path (module id) and the
    toolkit's lib folders (nvlink's command line). Built from two folders (and, where there are two, with two
    toolkits: the cu13 site's wheels and a system toolkit), the bytes must be the same."""
    require_nvcc()
    if not site_ready("cu13", nvshmem=True):
        pytest.skip(f"no cu13 site with NVSHMEM at {SITES['cu13']} (python tools/build_cubins.py --install-sites)")
    roots = [tmp_path / "a", tmp_path / "b" / "c" / "deeper"]
    for root in roots:
        write_sources(root, {"shmem": SHMEM_INTERNAL_CU})
    build_or_fail(roots[0], "--flavour", "cu13")
    second = other_nvcc()
    # build_or_fail passes NVCC_ARGS first; a later --nvcc wins (argparse)
    build_or_fail(roots[1], "--flavour", "cu13", *(second or []))
    for arch in ("sm_90", "sm_100"):
        a, b = ((r / "cubins" / "cu13" / arch / "default" / "shmem.cubin").read_bytes() for r in roots)
        assert b"_INTERNAL_" in a, "the test family should have internal-linkage symbols"
        assert a == b, (arch, build_cubins.section_differences(a, b))
        assert str(tmp_path).encode() not in a and b"/usr/local" not in a and b"site-packages" not in a
    if second is None:
        pytest.skip("built with one toolkit only (no second nvcc of the pinned version): folders compared")


def test_nvcc_command_lines_hold_no_absolute_path(tmp_path):
    for needs_nvshmem in (False, True):
        family = build_cubins.Family("f", tmp_path / "f.cu", ("default",), needs_nvshmem)
        commands, cubin = toolchains.nvcc_commands(family, "default", "sm_90", "kernels_src")
        assert cubin == "f.cubin"
        args = [a for _, args in commands for a in args]
        assert not any(a.startswith("/") or "=/" in a or a.startswith("-I/") or a.startswith("-L/") for a in args)
        assert [tool for tool, _ in commands] == (["nvcc", "nvlink"] if needs_nvshmem else ["nvcc"])
        assert "-dlink" not in args  # nvcc -dlink would hand nvlink the toolkit's absolute lib folders
        if needs_nvshmem:
            compile_args = commands[0][1]
            at = compile_args.index("-Xcudafe")
            assert compile_args[at + 1] == "--orig_src_path_name=kernels_src/f.cu"


def test_verify_passes_and_names_every_differing_file(tree):
    args = [
        "--verify",
        "--src",
        tree / "kernels_src",
        "--out",
        tree / "cubins",
        *[a for f in build_cubins.FLAVOURS for a in (f"--{f}-site", SITES[f])],
        *(NVCC_ARGS or []),
    ]
    if len(BUILT) == 1:
        pytest.skip("--verify rebuilds both flavours: needs the cu12 site")
    result = run_tool(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(
        f"cubins reproduced: {len(TEST_TARGETS) * 2 + 1} files (every cubin and "
        f"the manifest) byte-identical to a rebuild"
    )
    cubin = tree / "cubins" / "cu13/sm_90/safe/alpha.cubin"
    data = cubin.read_bytes()
    assert data.count(b"Cuda compilation tools") == 1
    cubin.write_bytes(data.replace(b"Cuda compilation tools", b"Cuda compilation tooLs"))  # in .note.nv.tkinfo
    (tree / "cubins" / "cu12/sm_80/default/beta.cubin").unlink()
    shutil.copy(tree / "cubins" / "cu13/sm_90/default/beta.cubin", tree / "cubins" / "cu13/sm_90/default/x.cubin")
    result = run_tool(*args)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert "cu13/sm_90/safe/alpha.cubin: differs from the rebuild (" in result.stderr
    assert any(
        line.startswith("cu13/sm_90/safe/alpha.cubin: differs") and line.endswith("differ: .note.nv.tkinfo)")
        for line in lines
    ), lines
    assert "cu12/sm_80/default/beta.cubin: the rebuild makes it, but it is not shipped" in lines
    assert "cu13/sm_90/default/x.cubin: shipped, but the rebuild makes no such file" in lines
    assert lines[-1].startswith("build_cubins: 3 of ")
    assert run_tool("--verify", "--family", "alpha").returncode == 1


def test_cu13_without_nvcc_names_the_site_and_the_option(tree, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NVCC"}
    result = run_tool(
        "--src",
        tree / "kernels_src",
        "--out",
        tree / "cubins",
        "--flavour",
        "cu13",
        "--cu13-site",
        tmp_path / "no-site",
        env=env,
    )
    assert result.returncode == 1
    assert "no nvcc in the cu13 site" in result.stderr and "--install-sites" in result.stderr
    assert f"--nvcc /usr/local/cuda/bin/nvcc (a toolkit whose nvcc is {toolchains.NVCC_VERSION})" in result.stderr


def _script(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text + "\n")
    path.chmod(0o755)
    return path


def test_an_explicit_nvcc_must_be_the_pinned_version_inside_a_toolkit(tmp_path, monkeypatch):
    monkeypatch.delenv("NVCC", raising=False)
    newer = _script(tmp_path / "tk" / "bin" / "nvcc", 'echo "Cuda compilation tools, release 13.1, V13.1.80"')
    _script(tmp_path / "tk" / "bin" / "nvlink", "exit 1")
    _script(tmp_path / "tk" / "nvvm" / "bin" / "cicc", "exit 1")
    with pytest.raises(
        build_cubins.BuildError,
        match=rf"pinned to nvcc {toolchains.NVCC_VERSION} \(SITE_PINS\); "
        rf".*tk/bin/nvcc is 13\.1\.80",
    ):
        toolchains.Toolchain("cu13", tmp_path / "site", [], nvcc=str(newer))
    wrapper = _script(tmp_path / "wrap" / "nvcc", f'exec {newer} "$@"')
    with pytest.raises(build_cubins.BuildError, match="is not inside a CUDA toolkit .* no bin/nvlink, nvvm/bin/cicc"):
        toolchains.Toolchain("cu13", tmp_path / "site", [], nvcc=str(wrapper))
    with pytest.raises(build_cubins.BuildError, match=r"\(from --nvcc\) is not an executable file"):
        toolchains.Toolchain("cu13", tmp_path / "site", [], nvcc=str(tmp_path / "none"))


# Both put-with-signal variants and a signal op, as include/ep_rt/net.cuh calls them (cu13 only, for now).
PUT_SIGNAL_CU = """\
// ep_rt-build: nvshmem min_arch=sm_90
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
extern "C" __global__ void put_signal_block(void *d, const void *s, size_t n, uint64_t *sig, uint64_t v, int pe) {
    nvshmemx_putmem_signal_nbi_block(d, s, n, sig, v, NVSHMEM_SIGNAL_ADD, pe);
}
extern "C" __global__ void put_signal_warp(void *d, const void *s, size_t n, uint64_t *sig, uint64_t v, int pe) {
    nvshmemx_putmem_signal_nbi_warp(d, s, n, sig, v, NVSHMEM_SIGNAL_ADD, pe);
}
extern "C" __global__ void signal_add(uint64_t *sig, uint64_t v, int pe) { nvshmemx_signal_op(sig, v, NVSHMEM_SIGNAL_ADD, pe); }
"""
# The library's definitions (nvcc, glibc: uint64_t is unsigned long, `m`); threadgroup 1 = warp, 3 = block
PUT_SIGNAL = "_Z28nvshmemi_transfer_put_signalIL13threadgroup_t{}EEvPvS1_mS1_{}14nvshmemi_amo_tib"


@pytest.mark.parametrize("stdint_shim", ["cuda_std", "lp64"])
def test_nvrtc_stdint_shim_decides_whether_put_with_signal_links(tmp_path, monkeypatch, stdint_shim):
    """cubin_toolchains.STDINT_SHIM: with libcu++'s prelude (uint64_t = unsigned long long, what the shipped cu12
    cubins use) NVRTC's calls name a put_signal the library does not have; with the LP64 shim they link."""
    if not site_ready("cu12", nvshmem=True):
        pytest.skip(f"no cu12 site with NVSHMEM at {SITES['cu12']} (python tools/build_cubins.py --install-sites)")
    src = write_sources(tmp_path, {"probe": PUT_SIGNAL_CU})
    monkeypatch.setattr(toolchains, "SHIMS", toolchains.shims(stdint_shim))
    build = lambda: build_cubins.build(src, tmp_path / "cubins", flavours=["cu12"], sites=SITES)  # noqa: E731
    if stdint_shim == "cuda_std":
        with pytest.raises(build_cubins.BuildError) as error:
            build()
        assert f"Undefined reference to '{PUT_SIGNAL.format('3', 'y')}'" in str(error.value)
        assert f"Undefined reference to '{PUT_SIGNAL.format('1', 'y')}'" in str(error.value)
        return
    build()
    for arch in ("sm_90", "sm_100"):
        cubin = (tmp_path / "cubins" / "cu12" / arch / "default" / "probe.cubin").read_bytes()
        for group in ("1", "3"):
            assert PUT_SIGNAL.format(group, "m").encode() + b"\0" in cubin, (arch, group)
        assert build_cubins.kernel_symbols(cubin) == ["put_signal_block", "put_signal_warp", "signal_add"]


# ---------------------------------------------------------------- the repo's own cubins


def test_repo_cubins_are_current():
    if not (REPO / "cubins" / "manifest.json").is_file():
        pytest.skip("cubins/manifest.json does not exist yet (run python tools/build_cubins.py)")
    result = run_tool("--check")  # every flavour
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("cubins up to date:")


# The shipped cubins whose bytes ran on a GPU (cubins/hardware_runs.json says how each was traced to a run).
# (Every LL cubin was rebuilt on 2026-12-07, twenty-ninth session: the default build's staging after the credit
# check, the packed send's cell starts from one histogram; the eight sm_90 ones ran at c0ad898. The four packed
# ones again on 2026-12-07, thirtieth session: the scanless build, whose cu13 bytes ran as the experiment at c3b5026
# and whose cu12 bytes ran at b95848c, thirty-first session.)
REPO_MARKED = {
    "cu13/sm_90/default/low_latency.cubin",
    "cu12/sm_90/default/low_latency.cubin",
    "cu13/sm_90/chaos/low_latency.cubin",
    "cu12/sm_90/chaos/low_latency.cubin",
    "cu13/sm_90/packed/low_latency.cubin",
    "cu13/sm_90/packed_chaos/low_latency.cubin",
    "cu12/sm_90/packed/low_latency.cubin",
    "cu12/sm_90/packed_chaos/low_latency.cubin",
    "cu12/sm_90/aggressive/intranode.cubin",
    "cu12/sm_90/default/layout.cubin",
    "cu12/sm_90/safe/intranode.cubin",
    "cu13/sm_90/aggressive/intranode.cubin",
    "cu13/sm_90/safe/intranode.cubin",
    "cu13/sm_90/tma/intranode.cubin",
    "cu12/sm_90/tma/intranode.cubin",
    "cu12/sm_90/safe/internode.cubin",
    "cu12/sm_90/aggressive/internode.cubin",
    "cu12/sm_90/chaos/internode.cubin",
    "cu13/sm_90/aggressive/internode.cubin",
    "cu13/sm_90/chaos/internode.cubin",
    "cu13/sm_90/default/layout.cubin",
    "cu13/sm_90/safe/internode.cubin",
}


def test_repo_cubin_set():
    """Both flavours; layout and intranode for sm_80/90/100, LL from sm_90; aggressive and LL's chaos and packed
    variants only on sm_90; NVSHMEM linked against the lower bound of the matching extra; the hardware mark exactly where a mark in
    cubins/hardware_runs.json names the shipped bytes."""
    manifest = load_manifest(REPO / "cubins" / "manifest.json")
    have = {(e["family"], e["flavour"], e["arch"], e["variant"]) for e in manifest["cubins"]}
    want = set()
    for fl in ("cu12", "cu13"):
        for arch in ("sm_80", "sm_90", "sm_100"):
            want |= {("layout", fl, arch, "default"), ("intranode", fl, arch, "safe")}
            if arch != "sm_80":
                want.add(("low_latency", fl, arch, "default"))
        want.add(("intranode", fl, "sm_90", "aggressive"))
        want.add(("intranode", fl, "sm_90", "tma"))
        want.add(("low_latency", fl, "sm_90", "chaos"))
        want |= {("low_latency", fl, "sm_90", "packed"), ("low_latency", fl, "sm_90", "packed_chaos")}
        want |= {
            ("internode", fl, "sm_90", "safe"),
            ("internode", fl, "sm_90", "aggressive"),
            ("internode", fl, "sm_90", "chaos"),
            ("internode", fl, "sm_100", "safe"),
        }
    assert have == want
    from ep_rt.transport.nvshmem_dist import EXTRAS

    for e in manifest["cubins"]:
        ran = e["path"] in REPO_MARKED
        assert e["ran_on_hardware"] is ran, e["path"]
        if e["needs_nvshmem"]:
            assert EXTRAS[e["flavour"]].startswith(f"nvidia-nvshmem-{e['flavour']}>={e['nvshmem']},"), e["path"]
        assert (
            set(e["kernels"])
            >= {
                "layout": {"ep_rt_get_dispatch_layout"},
                "intranode": {"ep_rt_intranode_dispatch", "ep_rt_intranode_combine"},
                "low_latency": {"ep_rt_ll_dispatch_send", "ep_rt_ll_combine_recv"},
                "internode": {
                    f"ep_rt_internode_{k}"
                    for k in (
                        "notify",
                        "send",
                        "forward",
                        "recv",
                        "combine_publish",
                        "combine_forward",
                        "combine_reduce",
                        "barrier",
                    )
                },
            }[e["family"]]
        )


# ---------------------------------------------------------------- pieces that need no compiler


def test_directives(tmp_path):
    cu = tmp_path / "f.cu"
    cu.write_text("// ep_rt-build: variants=safe, aggressive\n// ep_rt-build: nvshmem min_arch=sm_90\n")
    assert build_cubins.read_directives(cu) == (("safe", "aggressive"), True, "sm_90")
    cu.write_text('extern "C" __global__ void k() {}\n')
    assert build_cubins.read_directives(cu) == (("default",), False, "sm_80")
    for bad in ("// ep_rt-build: variants=fast\n", "// ep_rt-build: lto\n", "// ep_rt-build: min_arch=sm_89\n"):
        cu.write_text(bad)
        with pytest.raises(build_cubins.BuildError, match="f.cu:1"):
            build_cubins.read_directives(cu)


def test_targets_follow_min_arch_and_keep_aggressive_on_sm90(tmp_path):
    fam = build_cubins.Family("f", tmp_path / "f.cu", ("safe", "aggressive"), True, "sm_90")
    keys = [t.key for t in build_cubins.targets([fam])]
    assert keys == [
        ("f", fl, a, v)
        for fl in ("cu12", "cu13")
        for a, v in (("sm_90", "safe"), ("sm_90", "aggressive"), ("sm_100", "safe"))
    ]
    assert build_cubins.targets([fam], ["cu13"])[0].path == "cu13/sm_90/safe/f.cubin"


def test_header_parsing():
    assert build_cubins.parse_structs(PARAMS_H) == {"Inner": ["a", "b"], "Outer": ["ptrs", "inner", "n", "m"]}
    assert build_cubins.parse_constants(PARAMS_H) == ["EP_RT_TEST_RANKS", "EP_RT_TEST_WORDS"]


def test_source_digest_ignores_checkout_folder_but_not_flags_arch_or_toolchain(tmp_path):
    digests = []
    for folder in ("a", "b/c"):
        root = tmp_path / folder
        src = write_sources(root, {"beta": BETA_CU})
        includes = sorted((src / "include").rglob("*.h*"))
        digests.append(source_digest(root, src / "beta.cu", includes, ["-O3"], "sm_90", ["nvcc 13.x"]))
    assert digests[0] == digests[1]
    assert source_digest(root, src / "beta.cu", includes, ["-O2"], "sm_90", ["nvcc 13.x"]) != digests[0]
    assert source_digest(root, src / "beta.cu", includes, ["-O3"], "sm_100", ["nvcc 13.x"]) != digests[0]
    assert source_digest(root, src / "beta.cu", includes, ["-O3"], "sm_90", ["nvcc 12.x"]) != digests[0]


def _fake_cubin(symbols):
    """A minimal ELF64 with one symbol table: (name, info, other, shndx) per symbol."""
    strtab, names = b"\0", []
    for name, *_ in symbols:
        names.append(len(strtab))
        strtab += name.encode() + b"\0"
    symtab = bytes(24) + b"".join(
        struct.pack("<IBBHQQ", off, info, other, shndx, 0, 0) for off, (_, info, other, shndx) in zip(names, symbols)
    )
    shstrtab = b"\0.strtab\0.symtab\0.shstrtab\0"
    data = strtab + symtab + shstrtab
    shoff = 64 + len(data)
    sections = [
        bytes(64),
        struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(strtab), 0, 0, 1, 0),
        struct.pack("<IIQQQQIIQQ", 9, 2, 0, 0, 64 + len(strtab), len(symtab), 1, 1, 8, 24),
        struct.pack("<IIQQQQIIQQ", 17, 3, 0, 0, 64 + len(strtab) + len(symtab), len(shstrtab), 0, 0, 1, 0),
    ]
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 4, 3)
    return header + data + b"".join(sections)


def test_kernel_symbols_keep_only_defined_global_entry_functions():
    func_global, func_local, object_global = 0x12, 0x02, 0x11
    cubin = _fake_cubin(
        [
            ("kernel_b", func_global, 0x10, 1),
            ("kernel_a", func_global, 0x10, 1),
            ("device_fn", func_global, 0x00, 1),
            ("vprintf", func_global, 0x00, 0),
            ("local_fn", func_local, 0x10, 1),
            ("state_d", object_global, 0x00, 1),
        ]
    )
    assert build_cubins.kernel_symbols(cubin) == ["kernel_a", "kernel_b"]
    with pytest.raises(build_cubins.BuildError):
        build_cubins.kernel_symbols(b"not an elf")
