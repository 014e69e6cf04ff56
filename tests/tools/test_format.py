"""tools/format.py: the layout check of the test command fails on a Python file or a kernel source that is not
formatted, passes once `tools/format.py` has formatted them, and covers every kernel source."""

import shutil
import subprocess
import sys

import pytest

from ..repo import REPO

sys.path.insert(0, str(REPO / "tools"))
import format as fmt  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("clang-format") is None and not (fmt.Path(sys.executable).parent / "clang-format").exists(),
    reason="clang-format (the test extra) is not installed",
)


def _run(root, check):
    return [
        subprocess.run(cmd, cwd=root, capture_output=True, text=True).returncode for cmd in fmt.commands(check, root)
    ]


def test_the_check_fails_on_unformatted_sources_and_passes_after_formatting(tmp_path):
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(REPO / ".clang-format", tmp_path / ".clang-format")
    (tmp_path / "kernels_src").mkdir()
    (tmp_path / "a.py").write_text("x = [1,2,\n  3]\n")
    (tmp_path / "kernels_src" / "k.cu").write_text("__global__ void k(int*p){if(p)p[0]=1;}\n")
    assert _run(tmp_path, check=True) == [1, 1]
    assert (tmp_path / "a.py").read_text() == "x = [1,2,\n  3]\n"  # --check changes nothing
    assert _run(tmp_path, check=False) == [0, 0]
    assert _run(tmp_path, check=True) == [0, 0]
    assert (tmp_path / "a.py").read_text() == "x = [1, 2, 3]\n"


def test_every_kernel_source_is_checked():
    names = {p.relative_to(REPO).as_posix() for p in fmt.kernel_sources()}
    on_disk = {p.relative_to(REPO).as_posix() for p in (REPO / "kernels_src").rglob("*") if p.is_file()}
    assert names == on_disk and "kernels_src/include/ep_rt/params.h" in names


def test_the_shipped_sources_are_formatted():
    assert _run(REPO, check=True) == [0, 0]
