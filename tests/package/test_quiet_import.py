"""A clean install prints nothing it should not: importing ep_rt and asking the CLI for help write nothing to
stderr (torch warns "Failed to initialize NumPy" without numpy, hence numpy among the dependencies)."""

import importlib.util
import os
import subprocess
import sys

import pytest

from ..repo import REPO as ROOT


@pytest.mark.skipif(
    importlib.util.find_spec("numpy") is None,
    reason="this environment predates numpy as a dependency (reinstall with pip install '.[test]')",
)
@pytest.mark.parametrize("args", [["-c", "import ep_rt"], ["-m", "ep_rt", "--help"]], ids=["import", "cli help"])
def test_no_warnings(args, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-W", "default", *args], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
