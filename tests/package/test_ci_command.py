"""The README's test command and .ci/run's are one command: .ci/run runs the README's verbatim."""

import re

import pytest

from ..repo import REPO


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("Run the tests") :]
    command = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()
    ci_lines = [
        line
        for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci_lines == [command]
    assert "build_cubins.py --install-sites --verify" in command


def _readme_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return re.search(r"```bash\n(.+?)\n```", readme[readme.index("Run the tests") :], re.S).group(1).strip()


def test_the_test_command_lints_with_the_pinned_ruff():
    """`python -m ruff check .` runs before the long cubin rebuild; ruff comes from the `test` extra, held to one
    minor series (a new one may add rules), and its rules live in pyproject.toml."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10 (as tests/package/test_requirements.py)
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")
    steps = [s.strip() for s in _readme_command().split("&&")]
    assert "python -m ruff check ." in steps
    assert steps.index("python -m ruff check .") < steps.index("python tools/build_cubins.py --install-sites --verify")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    ruff = [r for r in project["project"]["optional-dependencies"]["test"] if r.startswith("ruff")]
    assert len(ruff) == 1 and "<" in ruff[0] and ">=" in ruff[0], ruff
    config = project["tool"]["ruff"]
    assert config["line-length"] == 120
    assert {"F", "E7", "E9"} <= set(config["lint"]["select"])


def test_ruffs_cache_is_ignored():
    """ruff writes .ruff_cache/ (with a .gitignore inside) in the checkout: the root .gitignore must ignore it, or
    tools/tree_digest.py (the GPU run's tree check) refuses the tree, and pytest runs after ruff."""
    lines = (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/.ruff_cache/" in lines


def test_the_test_command_checks_the_layout_of_python_and_kernels():
    """`python tools/format.py --check` (ruff format --check, clang-format --dry-run --Werror on every kernel source)
    runs before the long cubin rebuild, with the exact clang-format of the `test` extra."""
    try:
        import tomllib
    except ModuleNotFoundError:
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")
    steps = [s.strip() for s in _readme_command().split("&&")]
    assert "python tools/format.py --check" in steps
    assert steps.index("python tools/format.py --check") < steps.index(
        "python tools/build_cubins.py --install-sites --verify"
    )
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    clang = [r for r in project["project"]["optional-dependencies"]["test"] if r.startswith("clang-format")]
    assert clang == ["clang-format==19.1.7"]
    assert (REPO / ".clang-format").is_file()
