"""Kernel experiments waiting for a device (docs/experiments/*.patch, built by tools/build_experiment.sh, run by the
device step exp_ll) must still apply to kernels_src: a patch that no longer does would be measured against code
that is gone."""

import shutil
import subprocess

import pytest

from ..repo import REPO

PATCHES = sorted((REPO / "docs" / "experiments").glob("*.patch"))


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs git and a checkout")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_the_experiment_applies_to_kernels_src(patch):
    result = subprocess.run(
        ["git", "apply", "--check", str(patch)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
