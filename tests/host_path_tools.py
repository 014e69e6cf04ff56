"""Loads tools/host_path_stub.py (not a package) for the host-path tests."""

import importlib.util
import sys
from pathlib import Path

from .repo import REPO


def repo_root() -> Path:
    return REPO


def load_stub():
    name = "host_path_stub"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, repo_root() / "tools" / "host_path_stub.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
