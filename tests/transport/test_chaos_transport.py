"""The chaos transport test mode (kernels_src/include/ep_rt/net.cuh, docs/CHAOS_TRANSPORT.md), on the CPU: the build
declares and builds the variant where it should, the shipped manifest has it, EP_RT_CHAOS_TRANSPORT picks it (and
only for families with network traffic), the LL kernels send remote traffic only through net.cuh, and the probe's
mirror in the GPU test matches the kernel. Its behaviour on a GPU: tests/gpu/test_chaos_transport_gpu.py."""

import importlib.util
import re

import pytest

from ep_rt import env
from ep_rt.errors import CubinNotFoundError
from ep_rt.runtime import choice
from ep_rt.runtime.manifest import load_manifest

from ..repo import REPO

R580 = 13000


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_cubins = _load("_build_cubins_chaos", REPO / "tools" / "build_cubins.py")


def entry(family, flavour, arch, variant="default", nvshmem=False):
    return {
        "family": family,
        "flavour": flavour,
        "arch": arch,
        "variant": variant,
        "needs_nvshmem": nvshmem,
        "min_driver": 13000 if flavour == "cu13" else 12000,
        "path": f"{flavour}/{arch}/{variant}/{family}.cubin",
    }


FAKE = {
    "cubins": [
        entry("layout", "cu13", "sm_90"),
        entry("intranode", "cu13", "sm_90", "safe"),
        entry("low_latency", "cu13", "sm_90", nvshmem=True),
        entry("low_latency", "cu13", "sm_90", "chaos", nvshmem=True),
        entry("low_latency", "cu13", "sm_100", nvshmem=True),
        entry("internode", "cu13", "sm_90", nvshmem=True),
    ]
}


def pick(family, cc=(9, 0), chaos=False, manifest=FAKE):
    return choice.choose_entry(manifest, family, cc, False, R580, None, "cu13", chaos)["variant"]


def test_choice_takes_the_chaos_variant_only_when_asked():
    assert pick("low_latency") == "default"  # the chaos variant is never a fallback nor a preference
    assert pick("low_latency", chaos=True) == "chaos"
    # Families without NVSHMEM have no network traffic: the knob does not concern them.
    assert pick("layout", chaos=True) == "default" and pick("intranode", chaos=True) == "safe"


def test_a_missing_chaos_variant_is_an_error_not_the_real_transport():
    with pytest.raises(
        CubinNotFoundError,
        match=r"EP_RT_CHAOS_TRANSPORT=1, but 'low_latency' has no chaos variant "
        r"for cu13/sm_100 .*unset EP_RT_CHAOS_TRANSPORT",
    ):
        pick("low_latency", cc=(10, 0), chaos=True)
    with pytest.raises(
        CubinNotFoundError,
        match=r"'internode' has no chaos variant .*variants= of the ep_rt-build "
        r"line of kernels_src/internode.cu",
    ):
        pick("internode", chaos=True)


def test_knob(monkeypatch):
    monkeypatch.delenv("EP_RT_CHAOS_TRANSPORT", raising=False)
    assert env.chaos_transport() is False
    for value, want in (("1", True), ("yes", True), ("0", False), ("", False), ("off", False)):
        monkeypatch.setenv("EP_RT_CHAOS_TRANSPORT", value)
        assert env.chaos_transport() is want
    assert "EP_RT_CHAOS_TRANSPORT" in env.KNOBS


def test_the_ll_op_loads_the_chaos_cubin_under_the_knob(monkeypatch):
    """LowLatencyOp.cubin_entry (what Buffer loads) on a faked H200 with a CUDA 13 driver, shipped manifest."""
    from ep_rt.ops.low_latency import LowLatencyOp
    from ep_rt.runtime import modules

    monkeypatch.setattr(modules.driver, "compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(modules.driver, "driver_version", lambda: R580)
    monkeypatch.delenv("EP_RT_CUBIN_FLAVOUR", raising=False)
    monkeypatch.delenv("EP_RT_CHAOS_TRANSPORT", raising=False)
    assert LowLatencyOp.cubin_entry(0, "cu13")["path"] == "cu13/sm_90/default/low_latency.cubin"
    monkeypatch.setenv("EP_RT_CHAOS_TRANSPORT", "1")
    for flavour in ("cu13", "cu12"):
        assert LowLatencyOp.cubin_entry(0, flavour)["path"] == f"{flavour}/sm_90/chaos/low_latency.cubin"
    assert LowLatencyOp.cubin_entry(0, "cu13", chaos=False)["variant"] == "default"
    monkeypatch.setattr(modules.driver, "compute_capability", lambda device: (10, 0))
    with pytest.raises(CubinNotFoundError, match="no chaos variant for cu13/sm_100"):
        LowLatencyOp.cubin_entry(0, "cu13")


def test_shipped_chaos_cubins():
    manifest = load_manifest(REPO / "cubins" / "manifest.json")
    ll = {(e["flavour"], e["arch"], e["variant"]): e for e in manifest["cubins"] if e["family"] == "low_latency"}
    chaos_variants = ("chaos", "packed_chaos")  # the packed layout's test-transport build is one too
    assert {k for k in ll if k[2] in chaos_variants} == {
        (fl, "sm_90", v) for fl in ("cu12", "cu13") for v in chaos_variants
    }
    for (flavour, arch, variant), e in ll.items():
        assert ("-DEP_RT_CHAOS_TRANSPORT=1" in e["flags"]) is (variant in chaos_variants), e["path"]
        assert ("-DEP_RT_LL_PACKED=1" in e["flags"]) is variant.startswith("packed"), e["path"]
        assert "ep_rt_ll_net_probe" in e["kernels"] and "ep_rt_ll_dispatch_send" in e["kernels"], e["path"]
        assert {"ep_rt_ll_dispatch", "ep_rt_ll_combine"} <= set(e["kernels"]), e["path"]  # one kernel per call
        assert "kernels_src/include/ep_rt/net.cuh" in e["sources"], e["path"]
        if variant in chaos_variants:
            # (which chaos cubins ran on a GPU: tests/tools/test_manifest.py's REPO_MARKED, from the marks)
            # The queues are .bss (zero-filled at load): the cubin stays the size of the default one, not +29 MiB.
            assert (REPO / "cubins" / e["path"]).stat().st_size < 1_500_000, e["path"]


def test_build_declares_chaos_for_nvshmem_families_on_sm90_only(tmp_path):
    cu = tmp_path / "f.cu"
    cu.write_text("// ep_rt-build: nvshmem min_arch=sm_90 variants=default,chaos\n")
    assert build_cubins.read_directives(cu) == (("default", "chaos"), True, "sm_90")
    fam = build_cubins.Family("f", cu, ("default", "chaos"), True, "sm_90")
    keys = {t.key for t in build_cubins.targets([fam])}
    assert keys == {
        ("f", fl, a, v)
        for fl in ("cu12", "cu13")
        for a, v in (("sm_90", "default"), ("sm_90", "chaos"), ("sm_100", "default"))
    }
    assert build_cubins.VARIANT_DEFINES["chaos"] == ["-DEP_RT_CHAOS_TRANSPORT=1"]
    cu.write_text("// ep_rt-build: variants=default,chaos\n")
    with pytest.raises(build_cubins.BuildError, match="chaos variant .* needs the nvshmem option"):
        build_cubins.read_directives(cu)


def test_ll_kernels_reach_other_nodes_only_through_net_cuh():
    """Every network operation of low_latency.cu is a net.cuh call (so the chaos variant sees all of them): no
    direct NVSHMEM call is left, the data are put-with-signals and the flags signal ops
    (tests/transport/test_network_rules.py holds the rest of the network rules)."""
    source = re.sub(r"//[^\n]*", "", (REPO / "kernels_src" / "low_latency.cu").read_text())
    assert sorted(set(re.findall(r"\b(nvshmemx?_\w+)\s*\(", source))) == []
    assert len(re.findall(r"\bnet_put_signal_warp\s*\(", source)) >= 2
    assert len(re.findall(r"\bnet_signal_set\s*\(", source)) >= 1
    assert len(re.findall(r"\bnet_flush\s*\(", source)) >= 4


def test_probe_mirror_matches_the_kernel():
    from tests.gpu import chaos_workers

    net = (REPO / "kernels_src" / "include" / "ep_rt" / "net.cuh").read_text()
    slots = int(re.search(r"#define EP_RT_NET_CHAOS_SLOTS (\d+)", net).group(1))
    ll = (REPO / "kernels_src" / "low_latency.cu").read_text()
    line = re.search(
        r"constexpr int kProbeLate = (\d+), kProbePairs = (\d+), kProbeRow = (\d+), "
        r"kProbeFlood = EP_RT_NET_CHAOS_SLOTS \+ (\d+);",
        ll,
    )
    assert line, "the probe's sizes moved: update tests/gpu/chaos_workers.py and this test"
    late, pairs, row, extra = map(int, line.groups())
    assert chaos_workers.CHAOS_SLOTS == slots
    assert chaos_workers.PROBE == {"late": late, "pairs": pairs, "row": row, "flood": slots + extra}
    areas = chaos_workers.probe_areas()
    assert [name for name, _, _ in areas] == ["late", "order", "overtake", "own", "flood", "sink"]
    end = areas[-1][1] + areas[-1][2]
    sources = late + 2 * pairs * row + 8 * pairs + 16 * (slots + extra)
    assert chaos_workers.SEND_OFF + sources <= chaos_workers.RECV_OFF  # sources and destinations do not overlap
    assert chaos_workers.RECV_OFF + end <= chaos_workers.PROBE_RDMA_BYTES
