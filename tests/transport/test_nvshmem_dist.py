"""ep_rt/transport/nvshmem_dist.py: NVSHMEM's host/device version rule, the flavour of a host library from the
distribution that installed it (fake site folders with dist-info RECORDs), and the install hints."""

import base64
import hashlib
import importlib.util
from pathlib import Path

import pytest

from ep_rt.transport import nvshmem_dist as nd


@pytest.mark.parametrize(
    "host, device, ibgda, ok",
    [
        ("3.4.5", "3.4.5", False, True),
        ("3.4.5", "3.3.24", False, True),  # newer host minor runs older device code
        ("3.4.0", "3.4.5", False, True),  # the rule is on minors: same minor, any patch
        ("3.7.2", "3.3.20", False, True),  # torch 2.15's host with the shipped cu12 cubin, over NVLink
        ("3.3.20", "3.4.5", False, False),  # older host minor
        ("2.11.0", "3.3.20", False, False),  # other major
        ("4.0.0", "3.3.20", False, False),
        ("3.7.2", "3.3.20", True, False),  # IBGDA: 3.5.19 changed the RC queue-pair layout
        ("3.5.18", "3.3.20", True, True),
        ("3.7.2", "3.5.19", True, True),
    ],
)
def test_compatibility_rule(host, device, ibgda, ok):
    problem = nd.compatibility_problem(host, device, ibgda)
    assert (problem is None) is ok, problem


def test_compatibility_messages():
    assert "host minor >= device minor; here 3.3 < 3.4" in nd.compatibility_problem("3.3.20", "3.4.5", False)
    assert "only within a major version (host 2.x, device 3.x)" in nd.compatibility_problem("2.0.0", "3.4.5", False)
    assert "3.5.19 changed the layout" in nd.compatibility_problem("3.6.5", "3.4.5", True)
    assert nd.host_range("3.3.20", False) == ">=3.3,<4"
    assert nd.host_range("3.3.20", True) == ">=3.3,<3.5.19"
    assert nd.host_range("3.6.5", True) == ">=3.6,<4"
    with pytest.raises(ValueError, match="not an NVSHMEM version"):
        nd.parse_version("3.4")


def test_install_hints_name_the_extras():
    """From the wheel file or the checkout (ep-rt is on no index), with what the extra brings."""
    assert nd.install_hint("cu12") == (
        'pip install "./ep_rt-0.1.0-py3-none-any.whl[cu12]" (from a checkout: '
        'pip install ".[cu12]"), which brings nvidia-nvshmem-cu12>=3.3.20,<4'
    )
    both = nd.install_hint(None)
    assert 'beside a CUDA 12 torch: pip install "./ep_rt-0.1.0-py3-none-any.whl[cu12]"' in both
    assert 'beside a CUDA 13 torch: pip install "./ep_rt-0.1.0-py3-none-any.whl[cu13]"' in both


def _record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def fake_site(root, installs):
    """A site folder in which each (flavour, bytes) of `installs` was pip-installed in order (same file names)."""
    lib = root / nd.RECORD_PATH
    lib.parent.mkdir(parents=True, exist_ok=True)
    for flavour, data in installs:
        lib.write_bytes(data)
        name = nd.PACKAGES[flavour]
        info = root / f"{name.replace('-', '_')}-3.4.5.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 3.4.5\n")
        (info / "RECORD").write_text(f"{nd.RECORD_PATH},{_record_hash(data)},{len(data)}\n{info.name}/METADATA,,\n")
    return lib


def test_flavour_from_the_owning_distribution(tmp_path):
    lib = fake_site(tmp_path / "one", [("cu12", b"cu12 host library")])
    assert nd.library_flavour(lib, [str(tmp_path / "one")]) == "cu12"
    # Both installed: the file is the one whose RECORD hash matches (the later install overwrote the other).
    lib = fake_site(tmp_path / "both", [("cu12", b"cu12 host library"), ("cu13", b"cu13 host library")])
    assert nd.library_flavour(lib, [str(tmp_path / "both")]) == "cu13"
    # No distribution owns it (a library from elsewhere): unknown.
    other = tmp_path / "elsewhere" / nd.HOST_LIBRARY
    other.parent.mkdir()
    other.write_bytes(b"x")
    assert nd.library_flavour(other, [str(tmp_path / "one")]) is None


def test_pick_owner():
    assert nd.pick_owner([("cu13", False)]) == "cu13"
    assert nd.pick_owner([("cu12", False), ("cu13", True)]) == "cu13"
    assert nd.pick_owner([("cu12", False), ("cu13", False)]) is None
    assert nd.pick_owner([]) is None


def test_loaded_library_reads_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 123 /usr/lib/libc.so.6\n"
        "7f02-7f03 rw-p 00000000 00:00 0\n"
        "7f04-7f05 r-xp 00000000 08:01 456 /site packages/nvidia/nvshmem/lib/libnvshmem_host.so.3\n"
    )
    assert nd.loaded_library(str(maps)) == Path("/site packages/nvidia/nvshmem/lib/libnvshmem_host.so.3")
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 123 /usr/lib/libc.so.6\n")
    assert nd.loaded_library(str(maps)) is None
    assert nd.loaded_library(str(tmp_path / "missing")) is None


def test_session_check_names_both_versions_and_what_to_install(monkeypatch, tmp_path):
    from ep_rt.errors import EpRtError
    from ep_rt.transport import nvshmem

    monkeypatch.setattr(nvshmem, "host_version", lambda: "3.3.20")
    monkeypatch.setattr(nvshmem, "library_path", lambda: tmp_path / nd.HOST_LIBRARY)
    monkeypatch.setattr(nvshmem.nvshmem_dist, "library_flavour", lambda path: "cu12")
    nvshmem.check_compatible("3.3.20", ibgda=False)
    nvshmem.check_compatible("3.2.5", ibgda=True)
    with pytest.raises(EpRtError) as e:
        nvshmem.check_compatible("3.4.5", ibgda=False)
    text = str(e.value)
    assert "host library 3.3.20 (nvidia-nvshmem-cu12," in text and "device library 3.4.5" in text
    assert "Install 'nvidia-nvshmem-cu12>=3.4,<4'" in text
    assert 'pip install "./ep_rt-0.1.0-py3-none-any.whl[cu12]"' in text


def _nvshmem_package_installed() -> bool:
    try:
        return importlib.util.find_spec("nvidia.nvshmem") is not None
    except ModuleNotFoundError:  # not even the nvidia namespace
        return False


def test_the_installed_host_library_has_a_flavour():
    from ep_rt.transport import nvshmem

    if nd.loaded_library() is None and not _nvshmem_package_installed():
        pytest.skip("no NVSHMEM here: no nvidia.nvshmem package and no host library loaded (a CPU torch brings none)")
    path = nvshmem.library_path()  # installed: any error now is a real one (a package without its library, say)
    assert nvshmem.host_flavour() in ("cu12", "cu13"), path
