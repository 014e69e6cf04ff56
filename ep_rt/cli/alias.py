"""python -m ep_rt alias [status|install|remove]: the startup hook that lets unchanged DeepEP clients import ep_rt.

`install` writes one .pth line into site-packages; from then on every Python process of this environment whose
environment has EP_RT_DEEP_EP_ALIAS=1 resolves `import deep_ep` (deep_ep.buffer, deep_ep.utils) to ep_rt, unless a
real DeepEP is installed, which always wins (a warning says the alias was refused). Without the variable the hook
does nothing. `remove` deletes the line again. In one process, `ep_rt.install_deep_ep_alias()` does the same
without any file.
"""
from __future__ import annotations

import argparse
import os
import sysconfig
from pathlib import Path

import _ep_rt_deep_ep as hook


def default_site_dir() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def hook_path(site_dir: Path) -> Path:
    return Path(site_dir) / hook.PTH_NAME


def install(site_dir: Path) -> Path:
    path = hook_path(site_dir)
    path.write_text(hook.PTH_LINE, encoding="utf-8")
    return path


def remove(site_dir: Path) -> bool:
    path = hook_path(site_dir)
    if path.is_file():
        path.unlink()
        return True
    return False


def status_lines(site_dir: Path) -> list[str]:
    path = hook_path(site_dir)
    real = hook.real_deep_ep()
    value = os.environ.get(hook.ENV)
    lines = [f"startup hook: {'installed at ' + str(path) if path.is_file() else 'not installed (' + str(path) + ')'}",
             f"{hook.ENV}: {value!r}" if value is not None else f"{hook.ENV}: unset (the hook does nothing)",
             f"real DeepEP: {real if real else 'not installed'}"]
    if real:
        lines.append("=> `import deep_ep` gives the real DeepEP; ep_rt never shadows it")
    elif path.is_file() and value not in (None, "", "0"):
        lines.append("=> `import deep_ep` gives ep_rt in new processes of this environment")
    else:
        lines.append("=> `import deep_ep` gives ep_rt only after ep_rt.install_deep_ep_alias() in that process")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ep_rt alias", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", nargs="?", default="status", choices=("status", "install", "remove"))
    parser.add_argument("--site-dir", type=Path, default=None,
                        help="where the .pth line goes (default: this interpreter's site-packages)")
    args = parser.parse_args(argv)
    site_dir = args.site_dir or default_site_dir()
    if args.action == "install":
        print(f"wrote {install(site_dir)}; set {hook.ENV}=1 in the environment of the processes that should get "
              f"ep_rt for `import deep_ep`")
        if hook.real_deep_ep():
            print(f"note: a real DeepEP is installed ({hook.real_deep_ep()}): it keeps winning over the alias")
    elif args.action == "remove":
        print(f"removed {hook_path(site_dir)}" if remove(site_dir) else f"nothing to remove at {hook_path(site_dir)}")
    for line in status_lines(site_dir):
        print(line)
    return 0
