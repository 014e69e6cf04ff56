"""The checkout's root, for tests that read its files (README, pyproject.toml, kernels_src/, tools/): one place, so
a test's depth in the tests/ tree never decides what it reads. And the test ids pytest collects there (the tests
of the GPU tests' items and of the steps that select them)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_tool(file_name: str, module_name: str):
    """tools/<file_name> loaded as a fresh module named module_name (registered in sys.modules, where a tool's
    dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / "tools" / file_name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


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
