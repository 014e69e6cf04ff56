"""The cubin manifest (cubins/manifest.json): reading it and the source digest it records.

Shared by tools/build_cubins.py (which writes the manifest and checks it in CI) and the
runtime (which finds cubins through it). Standard library only, so the build tool can load
this file without the rest of ep_rt and without torch.

Schema 2: every entry has a `flavour` (cu12: NVRTC/nvJitLink 12.9 build, cu13: nvcc 13 build) and the
`min_driver` (cuDriverGetVersion) it needs; paths are <flavour>/<arch>/<variant>/<family>.cubin. `blocks` maps each
kernel to the threads per block it is compiled for (its __launch_bounds__, read from the cubin's .nv.info): the one
source of block sizes, the runtime launches with it.
"""

import hashlib
import json
import os

SCHEMA = 2


class ManifestError(Exception):
    """The manifest is missing, unreadable or of an unknown schema."""


def load_manifest(path):
    """Read manifest.json at `path` and return it as a dict."""
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ManifestError(f"no cubin manifest at {path}: build one with python tools/build_cubins.py") from None
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read cubin manifest {path}: {e}") from None
    if manifest.get("schema") != SCHEMA:
        raise ManifestError(
            f"cubin manifest {path} has schema {manifest.get('schema')!r}, this ep_rt reads "
            f"schema {SCHEMA}: rebuild with python tools/build_cubins.py"
        )
    return manifest


def file_sha256(path):
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_digest(src_root, family_file, include_files, flags, arch, toolchain):
    """Hex sha256 identifying what one cubin was built from.

    Covers, for each file in sorted order, its path relative to `src_root` (the repo root,
    so paths read like ``kernels_src/intranode.cu``), a NUL and its bytes; then the compiler
    flags, the arch and the toolchain (the pinned compiler and NVSHMEM packages, as strings).
    Paths are hashed relative and with ``/`` separators, so the digest is the same on every
    machine and in every checkout folder.
    """
    rel_paths = sorted(_relative(src_root, p) for p in [family_file, *include_files])
    h = hashlib.sha256()
    for rel in rel_paths:
        h.update(rel.encode() + b"\0")
        with open(os.path.join(src_root, *rel.split("/")), "rb") as f:
            h.update(f.read())
    h.update(b"\0flags\0" + "\0".join(flags).encode())
    h.update(b"\0arch\0" + arch.encode())
    h.update(b"\0toolchain\0" + "\0".join(toolchain).encode())
    return h.hexdigest()


def find_cubin_entries(manifest, family, arch=None, variant=None, flavour=None):
    """Manifest entries of `family`, narrowed to `arch` / `variant` / `flavour` when given, sorted by path."""
    return sorted(
        (
            e
            for e in manifest.get("cubins", [])
            if e["family"] == family
            and (arch is None or e["arch"] == arch)
            and (variant is None or e["variant"] == variant)
            and (flavour is None or e["flavour"] == flavour)
        ),
        key=lambda e: e["path"],
    )


def kernel_block(entry, name):
    """The threads per block kernel `name` of a manifest entry is compiled for; ManifestError when the entry has none
    (a manifest from before block sizes were recorded, or a kernel the build did not see)."""
    block = entry.get("blocks", {}).get(name)
    if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
        raise ManifestError(
            f"the cubin manifest entry {entry.get('path')!r} has no block size for kernel {name!r} (its 'blocks' "
            f"field: {entry.get('blocks')!r}): rebuild the manifest with python tools/build_cubins.py"
        )
    return block


def _relative(root, path):
    path = os.fspath(path)
    if os.path.isabs(path):
        path = os.path.relpath(path, root)
    return path.replace(os.sep, "/")
