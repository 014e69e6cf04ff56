"""The wheel is pure Python (py3-none-any), carries every cubin of both flavours and the manifest, stays small, and
an installed copy finds its cubins in its own package data (not in the checkout)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ..repo import REPO as ROOT

pytestmark = pytest.mark.pypi  # pip's isolated build fetches setuptools


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_wheel_is_pure_python_and_carries_every_cubin(wheel):
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dll"))]
    manifest = json.loads((ROOT / "cubins" / "manifest.json").read_text())
    assert "ep_rt/cubins/manifest.json" in names
    for entry in manifest["cubins"]:
        assert f"ep_rt/cubins/{entry['path']}" in names, entry["path"]
    # Exactly the package's modules: every wing (runtime, transport, ops, reference, testing, cli), nothing stale.
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ep_rt").rglob("*.py")} | {"_ep_rt_deep_ep.py"}
    assert {n for n in names if n.endswith(".py")} == sources
    for wing in ("runtime", "transport", "ops", "reference", "testing", "cli"):
        assert f"ep_rt/{wing}/__init__.py" in names, wing


# Measured with pip wheel --no-deps: 335,280 B with the sm_90 cu13 set alone; 1,141,325 B with both flavours for
# sm_80/90/100 (18 cubins, 4.7 MB, 1.0 MB compressed); 1,603,526 B with the LL family's chaos variant (sm_90, both
# flavours: 345,279 B of it); 4,495,489 B at commit 47fd4f9, 4,500,465 B once call_guard.py and README's "Running
# inside a server" (the README is the wheel's METADATA) came. The bound catches a stray folder or an uncompressed
# blow-up, not a few kB of code and docs.
# 4,683,917 B with the two tma cubins of issue 23 item 5 (2026-12-02); 5,103,597 B once the LL family got its
# one-kernel dispatch and combine beside the hook's send and receive kernels (issue 23 item 3: each LL cubin
# ~0.3 MB larger before zip).
# 6,359,619 B with the LL family's packed and packed_chaos variants (issue 22; sm_90, both flavours: 4 cubins,
# ~1.26 MB compressed).
MAX_WHEEL_BYTES = 6_800_000  # 34 cubins; the NVSHMEM-linked ones (LL, internode) are ~1-2 MB each before zip


def test_wheel_carries_both_flavours_and_stays_small(wheel):
    zf = zipfile.ZipFile(wheel)
    cubins = {i.filename[len("ep_rt/cubins/") :]: i for i in zf.infolist() if i.filename.endswith(".cubin")}
    on_disk = {p.relative_to(ROOT / "cubins").as_posix(): p.stat().st_size for p in (ROOT / "cubins").rglob("*.cubin")}
    assert {name: i.file_size for name, i in cubins.items()} == on_disk
    assert {name.split("/")[0] for name in cubins} == {"cu12", "cu13"}
    assert {name.split("/")[1] for name in cubins} == {"sm_80", "sm_90", "sm_100"}
    assert wheel.stat().st_size < MAX_WHEEL_BYTES, wheel.stat().st_size


def test_installed_wheel_uses_its_own_cubins(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)], check=True
    )
    code = (
        "import ep_rt, ep_rt.runtime.modules as c; r = c.cubin_root(); m = c.manifest(); "
        "e = m['cubins'][0]; c.read_verified(r, e); print(r)"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve() == (target / "ep_rt" / "cubins").resolve()
