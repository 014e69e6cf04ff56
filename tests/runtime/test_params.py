"""ep_rt/runtime/abi.py (ctypes mirrors) against params.h: the manifest's recorded layouts, and the header itself."""

import ctypes
import sys

import pytest

from ..repo import REPO, load_tool

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ep_rt.runtime import abi as params  # noqa: E402
from ep_rt.runtime.manifest import load_manifest  # noqa: E402

MANIFEST = REPO / "cubins" / "manifest.json"
SRC = REPO / "kernels_src"
HEADER = SRC / "include" / "ep_rt" / "params.h"


build_cubins = load_tool("build_cubins.py", "_build_cubins")


def mirror_structs():
    return {
        name: cls
        for name, cls in vars(params).items()
        if isinstance(cls, type)
        and issubclass(cls, ctypes.Structure)
        and cls.__module__ == params.__name__
        and cls is not params.Mirror
    }


def layout_mismatches(structs, constants):
    """Differences between recorded layouts {name: {size, align, fields}} / constants and params.py."""
    problems = []
    mirrors = mirror_structs()
    for name, rec in sorted(structs.items()):
        cls = mirrors.get(name)
        if cls is None:
            problems.append(f"struct {name} has no ctypes mirror in ep_rt/runtime/abi.py")
            continue
        names = [f[0] for f in cls._fields_]
        if set(names) != set(rec["fields"]):
            problems.append(f"{name}: fields {sorted(names)} != params.h {sorted(rec['fields'])}")
            continue
        if ctypes.sizeof(cls) != rec["size"]:
            problems.append(f"{name}: sizeof {ctypes.sizeof(cls)} != params.h {rec['size']}")
        if ctypes.alignment(cls) != rec["align"]:
            problems.append(f"{name}: alignment {ctypes.alignment(cls)} != params.h {rec['align']}")
        problems += [
            f"{name}.{field}: offset {getattr(cls, field).offset} != params.h {offset}"
            for field, offset in sorted(rec["fields"].items())
            if getattr(cls, field).offset != offset
        ]
    problems += [
        f"constant {name}: {getattr(params, name, None)} != params.h {value}"
        for name, value in sorted(constants.items())
        if getattr(params, name, None) != value
    ]
    return problems


@pytest.fixture(scope="module")
def manifest():
    assert MANIFEST.is_file(), f"{MANIFEST.relative_to(REPO)} is committed and must be there"
    return load_manifest(MANIFEST)


def test_structs_match_manifest(manifest):
    assert manifest["structs"], "the manifest records no structs"
    assert layout_mismatches(manifest["structs"], {}) == []


def test_constants_match_manifest(manifest):
    assert manifest["constants"], "the manifest records no constants"
    assert layout_mismatches({}, manifest["constants"]) == []


def test_mirror_has_every_struct_and_field_of_header():
    """Needs no compiler: struct and field names, in order, and constant names read from params.h."""
    text = HEADER.read_text()
    header_structs = build_cubins.parse_structs(text)
    mirrors = mirror_structs()
    assert sorted(mirrors) == sorted(header_structs)
    for name, fields in header_structs.items():
        assert [f[0] for f in mirrors[name]._fields_] == fields, name
    missing = [c for c in build_cubins.parse_constants(text) if not hasattr(params, c)]
    assert missing == []


def test_layouts_match_header_compiled_now():
    """Measures params.h with the host compiler now, so the mirror is checked before any cubin build."""
    try:
        build_cubins.find_host_compiler()
    except build_cubins.BuildError:
        pytest.skip("no host C++ compiler (c++, g++, clang++ or nvcc) to measure params.h with")
    structs, constants = build_cubins.measure_params(SRC)
    assert structs and constants
    assert layout_mismatches(structs, constants) == []
