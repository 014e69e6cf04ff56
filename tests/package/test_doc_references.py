"""The modules, files and names that ep_rt's docstrings, tools and docs point at exist (issue 26: docstrings named
modules from before the layout change). Dotted names `ep_rt.x.y` must import (then each further part is an
attribute); paths under ep_rt/, kernels_src/ and tools/ must be files (kernel headers also as included,
`ep_rt/net.cuh`). docs/GPU_RESULTS.md is a record of past runs and keeps the names of its time."""

import importlib
import re

from ..repo import REPO

SOURCES = [
    *sorted((REPO / "ep_rt").rglob("*.py")),
    *sorted((REPO / "tools").glob("*.py")),
    REPO / "README.md",
    *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "GPU_RESULTS.md"),
]
DOTTED = re.compile(r"(?<![\w/.])ep_rt((?:\.[A-Za-z_]\w*)+)(?![\w*-])")  # (not "ep_rt.reference.internode_*")
PATH = re.compile(r"(?<![\w/.])((?:ep_rt|kernels_src|tools)/[\w/]+\.(?:py|cuh|cu|h|sh|json|md))\b")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for name in parts[k:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_dotted_names_resolve():
    bad = []
    for path in SOURCES:
        for match in DOTTED.finditer(path.read_text()):
            name = "ep_rt" + match.group(1).rstrip(".")
            if not _resolves(name):
                bad.append(f"{path.relative_to(REPO)}: {name}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_paths_exist():
    bad = []
    for path in SOURCES:
        for match in PATH.finditer(path.read_text()):
            ref = match.group(1)
            if not ((REPO / ref).exists() or (REPO / "kernels_src" / "include" / ref).exists()):
                bad.append(f"{path.relative_to(REPO)}: {ref}")
    assert not bad, "\n".join(sorted(set(bad)))
