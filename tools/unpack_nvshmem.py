#!/usr/bin/env python3
"""Unpack a carried NVSHMEM host library into a site folder (the GPU machine has no network; HARDWARE_REACH.md
section 6): FOLDER holds libnvshmem_host.so.3.xz, nvshmem_bootstrap_uid.so.3 and the wheel's .dist-info (so that
ep_rt tells the library's flavour from the distribution's RECORD, as for an installed wheel).

    python3 tools/unpack_nvshmem.py FOLDER SITE

Afterwards: PYTHONPATH=SITE and EP_RT_NVSHMEM_HOST_LIBRARY=SITE/nvidia/nvshmem/lib/libnvshmem_host.so.3. Standard
library only; every unpacked file is checked against the RECORD's sha256.
"""

import base64
import csv
import hashlib
import lzma
import shutil
import sys
from pathlib import Path

LIB = "nvidia/nvshmem/lib"


def record_hashes(dist_info: Path) -> dict:
    with open(dist_info / "RECORD", newline="") as f:
        return {row[0]: row[1] for row in csv.reader(f) if len(row) >= 2 and row[1]}


def check(path: Path, name: str, hashes: dict) -> None:
    want = hashes.get(name)
    if want is None:
        raise SystemExit(f"unpack_nvshmem: {name} is not in the RECORD")
    digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    if digest != want:
        raise SystemExit(f"unpack_nvshmem: {name}: sha256 {digest} differs from the RECORD's {want}")


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    folder, site = Path(argv[0]), Path(argv[1])
    dist_infos = sorted(folder.glob("nvidia_nvshmem_*.dist-info"))
    if len(dist_infos) != 1:
        raise SystemExit(f"unpack_nvshmem: {folder} must hold exactly one nvidia_nvshmem_*.dist-info")
    hashes = record_hashes(dist_infos[0])
    lib = site / LIB
    lib.mkdir(parents=True, exist_ok=True)
    with lzma.open(folder / "libnvshmem_host.so.3.xz") as src, open(lib / "libnvshmem_host.so.3", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
    check(lib / "libnvshmem_host.so.3", f"{LIB}/libnvshmem_host.so.3", hashes)
    shutil.copy2(folder / "nvshmem_bootstrap_uid.so.3", lib / "nvshmem_bootstrap_uid.so.3")
    check(lib / "nvshmem_bootstrap_uid.so.3", f"{LIB}/nvshmem_bootstrap_uid.so.3", hashes)
    shutil.copytree(dist_infos[0], site / dist_infos[0].name, dirs_exist_ok=True)
    print(f"unpacked {dist_infos[0].name[: -len('.dist-info')]} into {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
