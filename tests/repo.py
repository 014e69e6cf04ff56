"""The checkout's root, for tests that read its files (README, pyproject.toml, kernels_src/, tools/): one place, so
a test's depth in the tests/ tree never decides what it reads. And the test ids pytest collects there (the tests
of the GPU tests' items and of the steps that select them)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def collect_ids(*args) -> list:
    """The node ids `pytest --collect-only` lists in the checkout with these arguments (files, -m), in order."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]
