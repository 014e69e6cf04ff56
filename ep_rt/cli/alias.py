"""python -m ep_rt alias [status|install|remove]: the startup hook that lets unchanged DeepEP clients import ep_rt.

`install` writes one .pth line into site-packages; from then on every Python process of this environment whose
environment has EP_RT_DEEP_EP_ALIAS=1 resolves `import deep_ep` (deep_ep.buffer, deep_ep.utils) to ep_rt, unless a
real DeepEP is installed, which always wins (a warning says the alias was refused). Without the variable the line
only reads os.environ (no import). The file is added to the RECORD of the ep-rt installed in that site-packages,
so `pip uninstall ep-rt` removes it too; `remove` deletes it (and its RECORD line) at once. In one process,
`ep_rt.install_deep_ep_alias()` does the same without any file.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata
import io
import os
import sysconfig
from pathlib import Path

import _ep_rt_deep_ep as hook

DISTRIBUTION = "ep-rt"


def default_site_dir() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def hook_path(site_dir: Path) -> Path:
    return Path(site_dir) / hook.PTH_NAME


def record_file(site_dir: Path) -> Path | None:
    """The RECORD of the ep-rt distribution installed in `site_dir` (what pip uninstall reads), or None (a checkout
    on PYTHONPATH, another site-packages)."""
    for dist in importlib.metadata.distributions(path=[str(site_dir)]):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") != DISTRIBUTION:
            continue
        for f in dist.files or []:
            if f.name == "RECORD" and f.parent.name.endswith(".dist-info"):
                path = Path(dist.locate_file(f))
                if path.is_file() and path.parent.parent.resolve() == Path(site_dir).resolve():
                    return path
    return None


def _rows(record: Path) -> list[list[str]]:
    return [row for row in csv.reader(io.StringIO(record.read_text(encoding="utf-8"))) if row]


def _write_rows(record: Path, rows: list[list[str]]) -> None:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    tmp = record.with_name(record.name + ".ep_rt_tmp")
    tmp.write_text(out.getvalue(), encoding="utf-8")
    os.replace(tmp, record)  # never a half-written RECORD


def is_registered(site_dir: Path) -> bool:
    record = record_file(site_dir)
    return record is not None and any(row[0] == hook.PTH_NAME for row in _rows(record))


def install(site_dir: Path) -> Path:
    """Write the .pth line and list it in ep-rt's RECORD (where ep-rt is installed in `site_dir`)."""
    path = hook_path(site_dir)
    path.write_text(hook.PTH_LINE, encoding="utf-8")
    record = record_file(site_dir)
    if record is not None:
        data = path.read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows = [row for row in _rows(record) if row[0] != hook.PTH_NAME]
        _write_rows(record, rows + [[hook.PTH_NAME, f"sha256={digest}", str(len(data))]])
    return path


def remove(site_dir: Path) -> bool:
    """Delete the .pth line and its RECORD entry; True if there was a file."""
    record = record_file(site_dir)
    if record is not None:
        rows = _rows(record)
        kept = [row for row in rows if row[0] != hook.PTH_NAME]
        if len(kept) != len(rows):
            _write_rows(record, kept)
    path = hook_path(site_dir)
    if path.is_file():
        path.unlink()
        return True
    return False


def status_lines(site_dir: Path) -> list[str]:
    path = hook_path(site_dir)
    real = hook.real_deep_ep()
    value = os.environ.get(hook.ENV)
    lines = [f"startup hook: {'installed at ' + str(path) if path.is_file() else 'not installed (' + str(path) + ')'}"]
    if path.is_file():
        lines.append(
            "  removed by `pip uninstall ep-rt` (listed in its RECORD) or `alias remove`"
            if is_registered(site_dir)
            else "  no ep-rt installed there lists it: only `alias remove` removes it"
        )
    lines += [
        f"{hook.ENV}: {value!r}" if value is not None else f"{hook.ENV}: unset (the hook does nothing)",
        f"real DeepEP: {real if real else 'not installed'}",
    ]
    if real:
        lines.append("=> `import deep_ep` gives the real DeepEP; ep_rt never shadows it")
    elif path.is_file() and value not in (None, "", "0"):
        lines.append("=> `import deep_ep` gives ep_rt in new processes of this environment")
    else:
        lines.append("=> `import deep_ep` gives ep_rt only after ep_rt.install_deep_ep_alias() in that process")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ep_rt alias", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", nargs="?", default="status", choices=("status", "install", "remove"))
    parser.add_argument(
        "--site-dir",
        type=Path,
        default=None,
        help="where the .pth line goes (default: this interpreter's site-packages)",
    )
    args = parser.parse_args(argv)
    site_dir = args.site_dir or default_site_dir()
    if args.action == "install":
        print(
            f"wrote {install(site_dir)}; set {hook.ENV}=1 in the environment of the processes that should get "
            f"ep_rt for `import deep_ep`"
        )
        if hook.real_deep_ep():
            print(f"note: a real DeepEP is installed ({hook.real_deep_ep()}): it keeps winning over the alias")
    elif args.action == "remove":
        print(f"removed {hook_path(site_dir)}" if remove(site_dir) else f"nothing to remove at {hook_path(site_dir)}")
    for line in status_lines(site_dir):
        print(line)
    return 0
