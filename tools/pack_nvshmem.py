#!/usr/bin/env python3
"""Pack an NVSHMEM host library wheel into a folder small enough to carry to the GPU machine (which has no network),
the inverse of tools/unpack_nvshmem.py (HARDWARE_REACH.md section 6): FOLDER gets libnvshmem_host.so.3.xz (xz with
the x86 branch filter and a 128 MiB dictionary at the strongest preset: the cu12 3.4.5 library goes from 160 MB to
about 20 MB, which leaves room beside the tracked tree under the device tool's 64 MiB), nvshmem_bootstrap_uid.so.3
and the wheel's .dist-info, so that the unpacked files are checked against the wheel's RECORD.

    python3 tools/pack_nvshmem.py WHEEL FOLDER
    e.g. pip download --no-deps nvidia-nvshmem-cu12==3.4.5 -d /tmp/w && \\
         python3 tools/pack_nvshmem.py /tmp/w/nvidia_nvshmem_cu12-3.4.5-*.whl .cu12nvshmem

Then carry FOLDER (device tool: carry=[".cu12nvshmem"]; .gitignore keeps it out of the tree and its digest) and run
`STEPS="cu12_internode_each" bash tools/gpu_run.sh ...`. Standard library only.
"""

import lzma
import shutil
import sys
import zipfile
from pathlib import Path

LIB = "nvidia/nvshmem/lib/"
FILES = ("libnvshmem_host.so.3", "nvshmem_bootstrap_uid.so.3")
# The x86 branch filter turns relative call targets absolute, so repeated calls compress (about 15% smaller than
# plain LZMA2 on this library); xz records the chain in the file, so lzma.open reads it back with no arguments.
XZ_FILTERS = (
    {"id": lzma.FILTER_X86},
    {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": 1 << 27},
)


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    wheel, folder = Path(argv[0]), Path(argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist_info = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")})
        if len(dist_info) != 1 or not dist_info[0].startswith("nvidia_nvshmem_"):
            raise SystemExit(f"pack_nvshmem: {wheel} is not an nvidia-nvshmem wheel (dist-info: {dist_info})")
        for f in FILES:
            if LIB + f not in names:
                raise SystemExit(f"pack_nvshmem: {wheel} has no {LIB + f}")
        with (
            z.open(LIB + FILES[0]) as src,
            lzma.open(folder / (FILES[0] + ".xz"), "wb", filters=XZ_FILTERS) as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 24)
        with z.open(LIB + FILES[1]) as src, open(folder / FILES[1], "wb") as dst:
            shutil.copyfileobj(src, dst)
        for n in names:
            if n.startswith(dist_info[0] + "/") and not n.endswith("/"):
                out = folder / n
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(n))
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"packed {dist_info[0][: -len('.dist-info')]} into {folder} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
