"""README "Installing": the install command for each torch release (2.9 to 2.15) and CUDA major, from
ep_rt/installing.py, checked against the recorded torch pins (test_requirements.TORCH_BUILDS) and pyproject.toml's
extras; every command installs the wheel file or the checkout (ep-rt is on no index), and no hint in the code says
otherwise."""

import re

import pytest

from ep_rt import installing

from ..package.test_requirements import BASE, CUDA_BINDINGS_RELEASES, EXTRAS, FLAVOUR_OF, TORCH_BUILDS, overlap, project
from ..repo import REPO

SpecifierSet = pytest.importorskip("packaging.specifiers").SpecifierSet
Version = pytest.importorskip("packaging.version").Version

SERIES = ["2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]


def series(version):
    return ".".join(version.split(".")[:2])


def cuda_major(build):
    """'cu128 (PyPI default)' -> 12, 'CUDA 13.2 (...)' -> 13."""
    m = re.match(r"cu(\d\d)\d", build) or re.match(r"CUDA (\d+)\.", build)
    return int(m.group(1))


def table_row(torch_series, cuda):
    (row,) = [r for r in installing.ROWS if (r.series, r.cuda) == (torch_series, cuda)]
    return row


def matches(build, row):
    """Whether a recorded build (TORCH_BUILDS) is the one a table row names."""
    if row.build is None or cuda_major(build.build) != row.cuda or series(build.torch) != row.series:
        return False
    return "PyPI default" in build.build if row.default else build.build.split()[0] == row.build


def test_versions_agree():
    import ep_rt

    assert installing.VERSION == ep_rt.__version__ == project()["version"]


def test_one_row_per_release_and_cuda_major():
    assert [(r.series, r.cuda) for r in installing.ROWS] == [(s, c) for s in SERIES for c in (12, 13)]


@pytest.mark.parametrize("build", TORCH_BUILDS, ids=lambda b: f"{b.torch}-{b.build.split()[0]}")
def test_the_row_of_each_recorded_build_installs_what_its_pins_allow(build):
    row = table_row(series(build.torch), cuda_major(build.build))
    flavour = FLAVOUR_OF[build.nvshmem]
    assert row.extra == flavour, f"torch {build.torch} {build.build} pins {build.nvshmem}; the table says [{row.extra}]"
    command = row.command()
    assert f'"{installing.WHEEL}[{flavour}]"' in command, command
    assert Version(build.nvshmem_pin.lstrip("=")) in EXTRAS[flavour][build.nvshmem].specifier
    torch_spec = re.search(r'"torch==([0-9.*]+)"', command)
    if row.build is not None:
        assert torch_spec and Version(build.torch) in SpecifierSet(f"=={torch_spec.group(1)}"), command
    extra_bindings = str(EXTRAS[flavour]["cuda-bindings"].specifier)
    admitted = overlap(str(BASE["cuda-bindings"].specifier), extra_bindings, build.cuda_bindings)
    assert admitted, f"[{flavour}]'s cuda-bindings ({extra_bindings}) cannot sit beside torch {build}"
    if flavour == "cu12":  # cuda-bindings 13 refuses drivers below r580: the cu12 extra must keep 12.9.x
        assert admitted and all(v.startswith("12.9.") for v in admitted), admitted
    else:
        assert all(Version(v).major == 13 for v in admitted), admitted


def test_a_plain_install_beside_torch_2_9_cu12_would_take_cuda_bindings_13():
    """Why the table names an extra for torch 2.9's CUDA 12 builds: they pin no cuda-bindings, so the base
    requirement alone admits 13.x (pip takes the newest)."""
    (build,) = [b for b in TORCH_BUILDS if b.torch == "2.9.1"]
    assert build.cuda_bindings is None
    newest = overlap(str(BASE["cuda-bindings"].specifier), build.cuda_bindings)[-1]
    assert Version(newest).major == 13 and newest == CUDA_BINDINGS_RELEASES[-1]


@pytest.mark.parametrize("row", installing.ROWS, ids=lambda r: f"{r.series}-cu{r.cuda}")
def test_recorded_flag_index_and_note(row):
    recorded = [b for b in TORCH_BUILDS if matches(b, row)]
    assert row.recorded == bool(recorded), (row, recorded)
    command = row.command()
    if row.build is None or row.default:
        assert "--index-url" not in command
    else:
        assert f"--index-url https://download.pytorch.org/whl/{row.build} " in command
    note = row.note()
    assert ("unverified" in note) == (not row.recorded), note
    assert f'"{installing.WHEEL}[{row.extra}]"' in command
    assert row.command(checkout=True).endswith(f'".[{row.extra}]"')


def test_the_readme_shows_this_table():
    readme = (REPO / "README.md").read_text()
    assert installing.markdown_table() in readme
    assert readme.index("## Installing") < readme.index(installing.markdown_table())


def test_doctor_and_the_hints_name_the_tables_command():
    row = table_row("2.10", 12)
    assert installing.command_for("2.10.0+cu128", "12.8") == row.command()
    assert installing.command_for("2.16.0+cu130", "13.0") == installing.extra_hint("cu13")
    assert "CUDA build of torch" in installing.command_for("2.13.0+cpu", None)


INDEX_INSTALL = re.compile(r"""pip install ['"]?ep-rt(\[|\b)""")


def test_no_hint_says_install_ep_rt_from_an_index():
    """ep-rt is on no package index: `pip install 'ep-rt[cu12]'` cannot work anywhere."""
    files = [*sorted((REPO / "ep_rt").rglob("*.py")), REPO / "_ep_rt_deep_ep.py", REPO / "README.md"]
    found = [
        f"{f.relative_to(REPO)}:{n}"
        for f in files
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if INDEX_INSTALL.search(line)
    ]
    assert not found, found
