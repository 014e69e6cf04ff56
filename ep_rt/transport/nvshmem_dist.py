"""Which NVSHMEM this process has, and whether it can run an NVSHMEM-linked cubin.

nvidia-nvshmem-cu12 and -cu13 install the same file names (nvidia/nvshmem/lib/libnvshmem_host.so.3), so the
flavour of the host library is found from the distribution whose RECORD lists that file with the file's own
sha256 (the one installed last, if both are). The version rule is NVSHMEM's own (release notes since 3.0.6): a
host library runs device code linked against the same major and an older or equal minor version, except that
3.5.19 changed the RC queue-pair layout, which breaks older device code on the IBGDA transport (peers on other
nodes). Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
from pathlib import Path

from .. import installing

HOST_LIBRARY = "libnvshmem_host.so.3"
RECORD_PATH = f"nvidia/nvshmem/lib/{HOST_LIBRARY}"
PACKAGES = {"cu12": "nvidia-nvshmem-cu12", "cu13": "nvidia-nvshmem-cu13"}
# What pyproject.toml's extras [cu12] / [cu13] ask for (a CPU test keeps the two equal): from the
# device library the shipped cubins are linked against (the oldest a supported torch pins) up to the next major.
EXTRAS = {"cu12": "nvidia-nvshmem-cu12>=3.3.20,<4", "cu13": "nvidia-nvshmem-cu13>=3.3.24,<4"}
IBGDA_LAYOUT_CHANGE = (3, 5, 19)


def parse_version(text: str) -> tuple[int, int, int]:
    """'3.4.5' -> (3, 4, 5); raises ValueError on anything else."""
    parts = text.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not an NVSHMEM version (major.minor.patch): {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def compatibility_problem(host: str, device: str, ibgda: bool) -> str | None:
    """Why a host library of version `host` cannot run device code linked against `device`, or None if it can."""
    h, d = parse_version(host), parse_version(device)
    if h[0] != d[0]:
        return f"NVSHMEM keeps its ABI only within a major version (host {h[0]}.x, device {d[0]}.x)"
    if h[1] < d[1]:
        return (
            f"a host library runs device code of its own or an older minor version only (NVSHMEM's rule: same "
            f"major, host minor >= device minor; here {h[0]}.{h[1]} < {d[0]}.{d[1]})"
        )
    if ibgda and d < IBGDA_LAYOUT_CHANGE <= h:
        return (
            "NVSHMEM 3.5.19 changed the layout of its RC queue pairs, so device code linked against an older "
            "library cannot use a newer host's IBGDA transport (peers on other nodes)"
        )
    return None


def host_range(device: str, ibgda: bool) -> str:
    """The host library versions that can run device code linked against `device`, as a pip specifier."""
    d = parse_version(device)
    upper = ".".join(map(str, IBGDA_LAYOUT_CHANGE)) if ibgda and d < IBGDA_LAYOUT_CHANGE else f"{d[0] + 1}"
    return f">={d[0]}.{d[1]},<{upper}"


def install_hint(flavour: str | None) -> str:
    """What to install for a flavour (both, each beside its torch, when unknown): ep_rt with the extra, from the
    wheel file or the checkout (ep_rt.installing; ep-rt is on no index)."""
    if flavour:
        return f"{installing.extra_hint(flavour)}, which brings {EXTRAS[flavour]}"
    return "; ".join(f"beside a CUDA {f[2:]} torch: {installing.extra_hint(f)}" for f in sorted(PACKAGES))


def torch_flavour() -> str | None:
    """cu12 / cu13 from the CUDA version torch was built for; None for a CPU build."""
    import torch

    cuda = torch.version.cuda
    return f"cu{cuda.split('.')[0]}" if cuda and f"cu{cuda.split('.')[0]}" in PACKAGES else None


def loaded_library(maps_file: str = "/proc/self/maps") -> Path | None:
    """The libnvshmem_host.so.3 already mapped into this process (torch may have loaded one), if any."""
    try:
        maps = Path(maps_file).read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) == 6 and fields[5].endswith("/" + HOST_LIBRARY):
            return Path(fields[5])
    return None


def _record_hash(path: Path) -> str:
    """A file's sha256 as RECORD writes it (urlsafe base64, no padding)."""
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def owners(path: Path, search_path: list[str] | None = None) -> list[tuple[str, bool]]:
    """(flavour, whether RECORD's sha256 matches the file) for each NVSHMEM distribution that installed `path`."""
    found = []
    actual = None
    search = {} if search_path is None else {"path": search_path}
    for dist in importlib.metadata.distributions(**search):
        name = (dist.metadata["Name"] or "").lower()
        flavour = next((f for f, p in PACKAGES.items() if p == name), None)
        if flavour is None:
            continue
        for file in dist.files or []:
            if file.as_posix() != RECORD_PATH:
                continue
            located = Path(dist.locate_file(file))
            if located.exists() and located.resolve() == path.resolve():
                if actual is None:
                    actual = _record_hash(path)
                found.append((flavour, file.hash is not None and f"{file.hash.mode}={file.hash.value}" == actual))
    return found


def pick_owner(found: list[tuple[str, bool]]) -> str | None:
    """The flavour of the file: its only owner, or the only owner whose recorded hash matches; else None."""
    flavours = {f for f, _ in found}
    if len(flavours) == 1:
        return flavours.pop()
    matching = {f for f, ok in found if ok}
    return matching.pop() if len(matching) == 1 else None


def library_flavour(path: Path, search_path: list[str] | None = None) -> str | None:
    return pick_owner(owners(path, search_path))
