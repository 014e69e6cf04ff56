"""Format the sources, or check that they are formatted (--check: what the test command runs).

Python: `ruff format` (pyproject.toml's [tool.ruff]). Kernels: clang-format on kernels_src (.clang-format), the
version pinned in the `test` extra, since another version can format the same source differently. Reformatting a
kernel source changes its digest in the manifest: rebuild the cubins (tools/build_cubins.py) and compare their bytes.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_SUFFIXES = (".cu", ".cuh", ".h")


def kernel_sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / "kernels_src").rglob("*") if p.suffix in KERNEL_SUFFIXES)


def clang_format() -> str:
    """The clang-format of this environment (the pip package's, next to this Python, first)."""
    beside = Path(sys.executable).parent / "clang-format"
    found = str(beside) if beside.exists() else shutil.which("clang-format")
    if found is None:
        raise SystemExit("tools/format.py: no clang-format; pip install the test extra (pip install '.[test]')")
    return found


def commands(check: bool, root: Path = ROOT) -> list[list[str]]:
    ruff = [sys.executable, "-m", "ruff", "format", *(["--check"] if check else []), str(root)]
    clang = [clang_format(), *(["--dry-run", "--Werror"] if check else ["-i"]), *map(str, kernel_sources(root))]
    return [ruff, clang]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; fail if a file is not formatted")
    args = ap.parse_args(argv)
    failed = False
    for cmd in commands(args.check):
        failed |= subprocess.run(cmd, cwd=ROOT).returncode != 0
    if failed and args.check:
        print(
            "tools/format.py: some files are not formatted; run `python tools/format.py` and commit the result",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
