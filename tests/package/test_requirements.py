"""ep-rt's requirements (pyproject.toml) against the pins of every supported torch release, so that a torch whose
pins ep-rt cannot follow fails here first: the base install must resolve beside each torch build, the extra of the
build's NVSHMEM flavour must too, and the shipped NVSHMEM-linked cubin of that flavour must run on the NVSHMEM
host library that torch pins (NVSHMEM's version rule). To support a new torch, add its row with its source."""

import sys
from typing import NamedTuple, Optional

import pytest

from ..repo import REPO

packaging = pytest.importorskip("packaging", reason="the [test] extra brings packaging")
from packaging.requirements import Requirement  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

from ep_rt.runtime.manifest import load_manifest  # noqa: E402
from ep_rt.transport import nvshmem_dist  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

PYPI_METADATA = "PyPI wheel METADATA read with pip install --dry-run --no-deps --report (HARDWARE_REACH.md §1.1)"


class TorchBuild(NamedTuple):
    torch: str
    build: str  # CUDA variant of the wheel
    cuda_bindings: Optional[str]  # torch's own requirement on cuda-bindings, if any
    nvshmem: str  # the NVSHMEM distribution torch pins
    nvshmem_pin: str  # and its specifier
    source: str


TORCH_BUILDS = [
    TorchBuild("2.9.0", "cu128 (PyPI default)", None, "nvidia-nvshmem-cu12", "==3.3.20", PYPI_METADATA),
    TorchBuild("2.9.1", "cu128 (PyPI default)", None, "nvidia-nvshmem-cu12", "==3.3.20", PYPI_METADATA),
    TorchBuild(
        "2.9.0",
        "cu126",
        None,
        "nvidia-nvshmem-cu12",
        "==3.3.20",
        "2.9-era generate_binary_build_matrix.py in the stored code index (HARDWARE_REACH.md §1.1)",
    ),
    TorchBuild(
        "2.9.0",
        "cu130",
        None,
        "nvidia-nvshmem-cu13",
        "==3.3.24",
        "2.9-era generate_binary_build_matrix.py in the stored code index (HARDWARE_REACH.md §1.1)",
    ),
    TorchBuild("2.10.0", "cu128 (PyPI default)", "==12.9.4", "nvidia-nvshmem-cu12", "==3.4.5", PYPI_METADATA),
    TorchBuild("2.11.0", "cu130 (PyPI default)", None, "nvidia-nvshmem-cu13", "==3.4.5", PYPI_METADATA),
    TorchBuild(
        "2.11.0",
        "cu128",
        ">=12.9.4,<13",
        "nvidia-nvshmem-cu12",
        "==3.4.5",
        "a third-party pip log of the 2.11.0+cu128 METADATA (HARDWARE_REACH.md §1.1)",
    ),
    TorchBuild("2.12.0", "cu130 (PyPI default)", None, "nvidia-nvshmem-cu13", "==3.4.5", PYPI_METADATA),
    TorchBuild("2.12.1", "cu130 (PyPI default)", None, "nvidia-nvshmem-cu13", "==3.4.5", PYPI_METADATA),
    TorchBuild(
        "2.12.0",
        "cu126",
        ">=12.9.4,<13",
        "nvidia-nvshmem-cu12",
        "==3.4.5",
        "a 2.12-dev generated workflow (HARDWARE_REACH.md §1.1)",
    ),
    TorchBuild("2.13.0", "cu130 (PyPI default)", None, "nvidia-nvshmem-cu13", "==3.4.5", PYPI_METADATA),
    TorchBuild("2.14.0", "cu130 (PyPI default)", None, "nvidia-nvshmem-cu13", "==3.4.5", PYPI_METADATA),
    TorchBuild("2.14.1", "cu130 (PyPI default)", None, "nvidia-nvshmem-cu13", "==3.4.5", PYPI_METADATA),
    TorchBuild(
        "2.15.0",
        "CUDA 13.2 (PyPI default, cuda-toolkit==13.2.2)",
        None,
        "nvidia-nvshmem-cu13",
        "==3.7.2",
        PYPI_METADATA,
    ),
]
# Released cuda-bindings versions (pip index versions cuda-bindings, 2026-12-01), to test specifier overlap.
CUDA_BINDINGS_RELEASES = [f"12.9.{i}" for i in range(11)] + [
    "13.0.0",
    "13.0.1",
    "13.0.2",
    "13.0.3",
    "13.1.0",
    "13.1.1",
    "13.2.0",
    "13.3.0",
    "13.3.1",
    "13.4.1",
    "13.4.2",
    "13.4.3",
    "13.4.4",
    "13.5.0",
]
FLAVOUR_OF = {"nvidia-nvshmem-cu12": "cu12", "nvidia-nvshmem-cu13": "cu13"}


def project():
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def requirements(lines):
    return {Requirement(line).name: Requirement(line) for line in lines}


BASE = requirements(project()["dependencies"])
EXTRAS = {name: requirements(lines) for name, lines in project()["optional-dependencies"].items()}


def overlap(*specs):
    """Released cuda-bindings versions every specifier admits."""
    sets = [SpecifierSet(s or "") for s in specs]
    return [v for v in CUDA_BINDINGS_RELEASES if all(Version(v) in s for s in sets)]


def device_versions():
    manifest = load_manifest(REPO / "cubins" / "manifest.json")
    return {(e["flavour"], e["nvshmem"]) for e in manifest["cubins"] if e["needs_nvshmem"]}


# The one exact pin: the kernels' formatter, a stand-alone binary nothing else requires, whose output can change
# from version to version (the test command checks the layout with it).
EXACT_PINS = {("test", "clang-format")}


def test_no_pin_fights_torch():
    for name, extra in [("base", BASE), *EXTRAS.items()]:
        for dist_name, req in extra.items():
            if (name, dist_name) in EXACT_PINS:
                continue
            assert not any(s.operator in ("==", "===") for s in req.specifier), (name, str(req))


def test_base_names_no_nvshmem_and_the_extras_name_one_each():
    assert not [n for n in BASE if n.startswith("nvidia-nvshmem")]
    assert {n for n in EXTRAS["cu12"] if n.startswith("nvidia-nvshmem")} == {"nvidia-nvshmem-cu12"}
    assert {n for n in EXTRAS["cu13"] if n.startswith("nvidia-nvshmem")} == {"nvidia-nvshmem-cu13"}
    # The runtime's install hints quote the extras.
    for flavour in ("cu12", "cu13"):
        assert EXTRAS[flavour][f"nvidia-nvshmem-{flavour}"] == Requirement(nvshmem_dist.EXTRAS[flavour])
    assert set(EXTRAS["test"]) >= {"pytest", "pytest-benchmark", "packaging"}


@pytest.mark.parametrize("row", TORCH_BUILDS, ids=lambda r: f"{r.torch}-{r.build.split()[0]}")
def test_requirements_fit_torch(row):
    assert Version(row.torch) in BASE["torch"].specifier, f"ep-rt's torch requirement excludes {row}"
    base = overlap(str(BASE["cuda-bindings"].specifier), row.cuda_bindings)
    assert base, f"no cuda-bindings satisfies both ep-rt ({BASE['cuda-bindings']}) and torch {row}"
    flavour = FLAVOUR_OF[row.nvshmem]
    extra = EXTRAS[flavour]
    pinned = Version(row.nvshmem_pin.lstrip("="))
    assert pinned in extra[row.nvshmem].specifier, f"ep-rt[{flavour}] excludes {row.nvshmem}=={pinned} ({row})"
    assert not any(n.startswith("nvidia-nvshmem") and n != row.nvshmem for n in extra), row
    both = overlap(str(BASE["cuda-bindings"].specifier), str(extra["cuda-bindings"].specifier), row.cuda_bindings)
    assert both, f"ep-rt[{flavour}]'s cuda-bindings cannot sit beside torch {row}"


@pytest.mark.parametrize("row", TORCH_BUILDS, ids=lambda r: f"{r.torch}-{r.build.split()[0]}")
def test_shipped_cubin_runs_on_the_nvshmem_torch_pins(row):
    flavour, host = FLAVOUR_OF[row.nvshmem], row.nvshmem_pin.lstrip("=")
    devices = [v for fl, v in device_versions() if fl == flavour]
    assert devices, f"no NVSHMEM-linked {flavour} cubin in the manifest"
    for device in devices:  # over NVLink (one node); IBGDA adds the 3.5.19 caveat (nvshmem_dist)
        problem = nvshmem_dist.compatibility_problem(host, device, ibgda=False)
        assert problem is None, f"torch {row} pins NVSHMEM {host}; the {flavour} cubin needs {device}: {problem}"


def test_extras_admit_exactly_the_hosts_the_cubins_run_on():
    """The extras' lower bound is the device version the cubins link, so pip never installs a host too old."""
    for flavour, device in device_versions():
        spec = EXTRAS[flavour][f"nvidia-nvshmem-{flavour}"].specifier
        lower = [Version(s.version) for s in spec if s.operator == ">="]
        assert lower == [Version(device)], (flavour, str(spec), device)
        assert nvshmem_dist.compatibility_problem(device, device, ibgda=False) is None
