"""Block sizes have one source: each kernel's __launch_bounds__, compiled into its cubin (.nv.info), recorded per
cubin and kernel in cubins/manifest.json by tools/build_cubins.py, and checked there by --check. The runtime takes
them from the manifest (tests/runtime/test_launch_blocks.py)."""

import json
import re
import shutil
import struct
import subprocess
import sys

import pytest

from ..repo import REPO, load_tool

SRC, CUBINS = REPO / "kernels_src", REPO / "cubins"
TOOL = REPO / "tools" / "build_cubins.py"


build_cubins = load_tool("build_cubins.py", "_build_cubins_blocks")


def launch_bounds_by_hand(family):
    """{kernel: first __launch_bounds__ number} of kernels_src/<family>.cu, read line by line (not the tool's
    parser: the expected values must come from elsewhere)."""
    out = {}
    for line in (SRC / f"{family}.cu").read_text().splitlines():
        m = re.search(r'extern "C" __global__ void __launch_bounds__\((\d+)(?:, *\d+)?\) (\w+)\(', line)
        if m:
            out[m.group(2)] = int(m.group(1))
    return out


def shipped():
    return json.loads((CUBINS / "manifest.json").read_text())


def test_every_shipped_kernel_has_the_block_size_of_its_launch_bounds():
    entries = shipped()["cubins"]
    assert len(entries) >= 28
    for entry in entries:
        bounds = launch_bounds_by_hand(entry["family"])
        assert sorted(entry["blocks"]) == entry["kernels"], entry["path"]  # every kernel has one
        assert entry["blocks"] == {k: bounds[k] for k in entry["kernels"]}, entry["path"]
    # a few by name, as the kernels say them today
    ll = next(e for e in entries if e["path"] == "cu13/sm_90/default/low_latency.cubin")["blocks"]
    assert (ll["ep_rt_ll_dispatch_send"], ll["ep_rt_ll_combine_recv"]) == (512, 256)
    intra = next(e for e in entries if e["path"] == "cu12/sm_80/safe/intranode.cubin")["blocks"]
    assert (intra["ep_rt_intranode_notify"], intra["ep_rt_intranode_barrier"]) == (1024, 32)


def test_the_block_sizes_are_read_from_the_cubins():
    for entry in shipped()["cubins"]:
        assert build_cubins.kernel_blocks((CUBINS / entry["path"]).read_bytes()) == entry["blocks"], entry["path"]


def _record(fmt, attribute, value, payload=b""):
    return struct.pack("<BBH", fmt, attribute, value) + payload


def test_nv_info_records():
    section = (
        _record(1, 0x35, 0)
        + _record(3, 0x1B, 255)
        + _record(2, 0x4C, 1)
        + _record(4, 0x05, 12, struct.pack("<III", 128, 1, 1))
        + _record(4, 0x1E, 4, b"\0" * 4)
    )
    attributes = build_cubins.nv_info_attributes(section)
    assert attributes[0x1B] == 255 and attributes[0x4C] == 1
    assert struct.unpack("<III", attributes[build_cubins.EIATTR_MAX_THREADS]) == (128, 1, 1)
    for bad in (section[:-2], _record(4, 0x05, 12, b"\0" * 8), _record(9, 0x05, 0)):
        with pytest.raises(build_cubins.BuildError):
            build_cubins.nv_info_attributes(bad)


def test_block_problems(tmp_path):
    cu = tmp_path / "f.cu"
    cu.write_text(
        'extern "C" __global__ void __launch_bounds__(128, 2) a(int x) {}\n'
        '// extern "C" __global__ void __launch_bounds__(64) b(int x) {}\n'
        'extern "C" __global__ void c(int x) {}\n'
        'extern "C" __global__ __launch_bounds__(32) void d(int x) {}\n'
    )
    fam = build_cubins.Family("f", cu, ("default",), False)
    assert build_cubins.source_launch_bounds(cu) == {"a": 128, "d": 32}  # b is commented out
    assert build_cubins.block_problems(fam, ["a", "c", "d"], {"a": 128, "d": 32}) == []
    problems = build_cubins.block_problems(fam, ["a", "b", "c", "d"], {"a": 256, "b": 64, "c": 64})
    assert len(problems) == 4
    assert "kernel a: the cubin is compiled for 256 threads per block, f.cu says __launch_bounds__(128)" in problems
    assert "kernel b: the cubin is compiled for 64 threads per block, f.cu has no __launch_bounds__" in problems[1]
    assert "kernel d: f.cu gives it __launch_bounds__(32), the cubin carries no block size" in problems
    cu.write_text('extern "C" __global__ void __launch_bounds__(kThreads) a(int x) {}\n')
    with pytest.raises(build_cubins.BuildError, match="integer literal"):
        build_cubins.source_launch_bounds(cu)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """The shipped sources and cubins, copied: tests tamper with the copy (docs/ linked: the hardware marks name
    logs there)."""
    root = tmp_path_factory.mktemp("blocks")
    shutil.copytree(SRC, root / "kernels_src")
    shutil.copytree(CUBINS, root / "cubins")
    (root / "docs").symlink_to(REPO / "docs")
    return root


TAMPERED = "cu13/sm_90/default/layout.cubin"


def _tamper(root, change):
    path = root / "cubins" / "manifest.json"
    original = path.read_text()
    manifest = json.loads(original)
    change(next(e for e in manifest["cubins"] if e["path"] == TAMPERED))
    path.write_text(json.dumps(manifest, sort_keys=True, indent=1) + "\n")
    return original


@pytest.mark.parametrize(
    "change",
    [
        lambda e: e["blocks"].update(ep_rt_get_dispatch_layout=512),
        lambda e: e.pop("blocks"),
        lambda e: e["blocks"].pop("ep_rt_get_dispatch_layout"),
        lambda e: e["blocks"].update(ep_rt_no_such_kernel=64),
    ],
    ids=["other number", "no blocks", "kernel missing", "extra kernel"],
)
def test_check_fails_on_a_tampered_block_size(checkout, change):
    problems, _ = build_cubins.check(checkout / "kernels_src", checkout / "cubins")
    assert problems == []
    original = _tamper(checkout, change)
    try:
        problems, _ = build_cubins.check(checkout / "kernels_src", checkout / "cubins")
        assert len(problems) == 1 and problems[0].startswith(f"{TAMPERED}: the manifest's block sizes "), problems
        cubins = "the cubin's {'ep_rt_check_topk_idx': 256, 'ep_rt_get_dispatch_layout': 256}"
        assert cubins in problems[0] and "rebuild" in problems[0]
        cli = subprocess.run(
            [
                sys.executable,
                str(TOOL),
                "--check",
                "--src",
                str(checkout / "kernels_src"),
                "--out",
                str(checkout / "cubins"),
            ],
            capture_output=True,
            text=True,
        )
        assert cli.returncode == 1 and "block sizes" in cli.stderr, cli.stderr
    finally:
        (checkout / "cubins" / "manifest.json").write_text(original)
