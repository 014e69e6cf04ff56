"""The checkout's root, for tests that read its files (README, pyproject.toml, kernels_src/, tools/): one place, so
a test's depth in the tests/ tree never decides what it reads."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
