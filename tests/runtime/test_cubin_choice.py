"""ep_rt/runtime/choice.py: which cubin (flavour, arch, variant) a machine gets, fed with fake driver versions,
compute capabilities, NVSHMEM flavours and EP_RT_CUBIN_FLAVOUR values; and the knob itself."""

import pytest

from ep_rt import env
from ep_rt.errors import CubinNotFoundError, CudaDriverError
from ep_rt.runtime import choice
from ep_rt.runtime.manifest import load_manifest

from ..repo import REPO


def entry(family, flavour, arch, variant="default", nvshmem=False):
    min_driver = {"cu13": 13000, "cu12": 12080 if arch.startswith("sm_10") else 12000}[flavour]
    return {
        "family": family,
        "flavour": flavour,
        "arch": arch,
        "variant": variant,
        "min_driver": min_driver,
        "needs_nvshmem": nvshmem,
        "path": f"{flavour}/{arch}/{variant}/{family}.cubin",
    }


def fake_manifest(archs=("sm_80", "sm_90", "sm_100")):
    cubins = []
    for fl in ("cu12", "cu13"):
        for arch in archs:
            cubins += [entry("layout", fl, arch), entry("intranode", fl, arch, "safe")]
            if arch != "sm_80":
                cubins.append(entry("low_latency", fl, arch, nvshmem=True))
        cubins.append(entry("intranode", fl, "sm_90", "aggressive"))
        cubins.append(entry("intranode", fl, "sm_90", "tma"))
        if "sm_90" in archs:
            cubins += [entry("low_latency", fl, "sm_90", v, nvshmem=True) for v in ("chaos", "packed", "packed_chaos")]
    return {"cubins": cubins}


M = fake_manifest()
R580, R570, R535 = 13000, 12080, 12020


def pick(family, cc, driver, aggressive=False, forced=None, nvshmem=None, manifest=M):
    e = choice.choose_entry(manifest, family, cc, aggressive, driver, forced, nvshmem)
    return e["flavour"], e["arch"], e["variant"]


@pytest.mark.parametrize(
    "cc, driver, want",
    [
        ((9, 0), R580, ("cu13", "sm_90")),  # H100/H200 on r580: the flavour that has run on hardware
        ((9, 0), R535, ("cu12", "sm_90")),  # H100 on r535: only CUDA 12 cubins load
        ((10, 0), R580, ("cu13", "sm_100")),
        ((10, 0), R570, ("cu12", "sm_100")),  # B200 on r570 (CUDA 12.8)
        ((10, 3), R580, ("cu13", "sm_100")),  # B300 runs plain sm_100 cubins (same major, higher minor)
        ((8, 0), R535, ("cu12", "sm_80")),  # A100
        ((8, 6), R580, ("cu13", "sm_80")),  # an sm_86 GPU runs the sm_80 cubin
        ((8, 9), R535, ("cu12", "sm_80")),
    ],
)
def test_flavour_and_arch_from_driver_and_gpu(cc, driver, want):
    assert pick("layout", cc, driver)[:2] == want
    assert pick("intranode", cc, driver) == (*want, "safe")


def test_cu12_sm100_needs_a_cuda_12_8_driver():
    with pytest.raises(CubinNotFoundError, match=r"compute capability 10.0.*cu12: sm_80, sm_90, sm_100"):
        pick("layout", (10, 0), R535)


def test_the_closest_minor_wins_and_a_targets_are_exact():
    m = {
        "cubins": [
            entry("layout", "cu13", "sm_80"),
            entry("layout", "cu13", "sm_86"),
            entry("layout", "cu13", "sm_89a"),
        ]
    }
    assert pick("layout", (8, 7), R580, manifest=m)[1] == "sm_86"
    assert pick("layout", (8, 9), R580, manifest=m)[1] == "sm_89a"
    assert pick("layout", (8, 5), R580, manifest=m)[1] == "sm_80"
    assert choice.arch_distance("sm_100a", (10, 3)) is None
    assert choice.arch_distance("sm_100", (10, 3)) == 3
    assert choice.arch_distance("sm_90", (10, 0)) is None  # never across majors
    assert choice.arch_distance("sm_100", (9, 0)) is None


def test_missing_arch_lists_what_exists():
    with pytest.raises(CubinNotFoundError) as e:
        pick("intranode", (12, 0), R580)  # consumer Blackwell: major 12, nothing shipped
    text = str(e.value)
    assert "compute capability 12.0, sm_120" in text
    assert "cu12: sm_80, sm_90, sm_100; cu13: sm_80, sm_90, sm_100" in text
    with pytest.raises(CubinNotFoundError, match="has cubins|it has cu12: sm_90, sm_100"):
        pick("low_latency", (8, 0), R580, nvshmem="cu13")
    with pytest.raises(CubinNotFoundError, match="no kernel family 'nope'"):
        pick("nope", (9, 0), R580)


def test_aggressive_variant_only_where_built():
    assert pick("intranode", (9, 0), R580, aggressive=True) == ("cu13", "sm_90", "aggressive")
    assert pick("layout", (10, 0), R580, aggressive=True) == ("cu13", "sm_100", "default")  # one variant only
    with pytest.raises(CubinNotFoundError, match="no aggressive variant for cu13/sm_100.*unset EP_RT_AGGRESSIVE_PTX"):
        pick("intranode", (10, 0), R580, aggressive=True)


def test_tma_variant_only_when_asked_and_where_built():
    """EP_RT_TMA (issue 23 item 5's A/B): the tma variant is never a preference nor a fallback."""

    def tma_pick(family, cc, aggressive=False):
        e = choice.choose_entry(M, family, cc, aggressive, R580, None, None, False, True)
        return e["flavour"], e["arch"], e["variant"]

    assert pick("intranode", (9, 0), R580) == ("cu13", "sm_90", "safe")
    assert tma_pick("intranode", (9, 0)) == ("cu13", "sm_90", "tma")
    assert tma_pick("layout", (9, 0)) == ("cu13", "sm_90", "default")  # no tma variant anywhere: ignored
    with pytest.raises(CubinNotFoundError, match="no tma variant for cu13/sm_100.*unset EP_RT_TMA"):
        tma_pick("intranode", (10, 0))
    with pytest.raises(CubinNotFoundError, match="EP_RT_TMA=1 and EP_RT_AGGRESSIVE_PTX=1"):
        tma_pick("intranode", (9, 0), aggressive=True)


def test_packed_variant_only_when_asked_and_where_built():
    """EP_RT_LL_PACKED (issue 22's LL buffer): the packed layout is never a preference nor a fallback; with the
    chaos transport it is packed_chaos; families without a packed variant ignore it."""

    def packed_pick(family, cc, chaos=False, driver=R580, nvshmem="cu13"):
        e = choice.choose_entry(M, family, cc, False, driver, None, nvshmem, chaos, False, True)
        return e["flavour"], e["arch"], e["variant"]

    assert pick("low_latency", (9, 0), R580, nvshmem="cu13") == ("cu13", "sm_90", "default")
    assert packed_pick("low_latency", (9, 0)) == ("cu13", "sm_90", "packed")
    assert packed_pick("low_latency", (9, 0), chaos=True) == ("cu13", "sm_90", "packed_chaos")
    assert packed_pick("low_latency", (9, 0), driver=R535, nvshmem="cu12") == ("cu12", "sm_90", "packed")
    assert packed_pick("intranode", (9, 0), nvshmem=None) == ("cu13", "sm_90", "safe")  # none anywhere: ignored
    with pytest.raises(CubinNotFoundError, match="no packed variant for cu13/sm_100.*unset EP_RT_LL_PACKED"):
        packed_pick("low_latency", (10, 0))
    with pytest.raises(CubinNotFoundError, match="EP_RT_LL_PACKED=1 and EP_RT_CHAOS_TRANSPORT=1.*packed_chaos"):
        packed_pick("low_latency", (10, 0), chaos=True)


def test_the_shipped_manifest_has_the_packed_variants_on_sm90_in_both_flavours():
    manifest = load_manifest(REPO / "cubins" / "manifest.json")
    packed = {(e["flavour"], e["arch"], e["variant"]) for e in manifest["cubins"] if "packed" in e["variant"]}
    assert packed == {(fl, "sm_90", v) for fl in ("cu12", "cu13") for v in ("packed", "packed_chaos")}
    for e in manifest["cubins"]:
        if "packed" in e["variant"]:
            assert e["family"] == "low_latency" and "-DEP_RT_LL_PACKED=1" in e["flags"], e["path"]
            assert {"ep_rt_ll_dispatch", "ep_rt_ll_combine", "ep_rt_ll_dispatch_recv"} <= set(e["kernels"])
        else:
            assert "-DEP_RT_LL_PACKED=1" not in e["flags"], e["path"]


def test_packed_knob(monkeypatch):
    monkeypatch.delenv("EP_RT_LL_PACKED", raising=False)
    assert env.ll_packed() is False
    monkeypatch.setenv("EP_RT_LL_PACKED", "1")
    assert env.ll_packed() is True
    assert "EP_RT_LL_PACKED" in env.KNOBS


def test_tma_knob(monkeypatch):
    monkeypatch.delenv("EP_RT_TMA", raising=False)
    assert env.tma() is False
    monkeypatch.setenv("EP_RT_TMA", "1")
    assert env.tma() is True


def test_forced_flavour():
    assert pick("layout", (9, 0), R580, forced="cu12") == ("cu12", "sm_90", "default")
    assert pick("layout", (9, 0), R580, forced="cu13")[0] == "cu13"
    with pytest.raises(CubinNotFoundError, match="EP_RT_CUBIN_FLAVOUR=cu13 needs a driver for CUDA 13.*CUDA 12.2"):
        pick("layout", (9, 0), R535, forced="cu13")


def test_nvshmem_family_follows_the_host_library():
    assert pick("low_latency", (9, 0), R580, nvshmem="cu12") == ("cu12", "sm_90", "default")
    assert pick("low_latency", (9, 0), R580, nvshmem="cu13") == ("cu13", "sm_90", "default")
    assert pick("low_latency", (10, 3), R570, nvshmem="cu12") == ("cu12", "sm_100", "default")
    with pytest.raises(CubinNotFoundError, match="nvidia-nvshmem-cu13 .CUDA 13., but this driver runs only cu12"):
        pick("low_latency", (9, 0), R535, nvshmem="cu13")
    with pytest.raises(CubinNotFoundError, match="EP_RT_CUBIN_FLAVOUR=cu12, but .* nvidia-nvshmem-cu13"):
        pick("low_latency", (9, 0), R580, forced="cu12", nvshmem="cu13")
    # An unknown owner: the knob says which flavour it is.
    assert pick("low_latency", (9, 0), R580, forced="cu12", nvshmem=None)[0] == "cu12"
    with pytest.raises(CubinNotFoundError, match="set EP_RT_CUBIN_FLAVOUR"):
        pick("low_latency", (9, 0), R580, nvshmem=None)
    # Families without NVSHMEM ignore the host library's flavour.
    assert pick("layout", (9, 0), R580, nvshmem="cu12")[0] == "cu13"


def test_drivers_older_than_cuda_12_are_refused():
    with pytest.raises(CudaDriverError, match="supports CUDA 11.8; ep_rt needs a driver for CUDA 12.0"):
        pick("layout", (9, 0), 11080)


@pytest.mark.parametrize(
    "bindings, driver, ok",
    [
        ("12.9.4", R535, True),
        ("12.9.4", R580, True),
        ("13.5.0", R580, True),
        ("13.0.0", 13020, True),
        ("13.5.0", R570, False),
        ("13.0.0", R535, False),
    ],
)
def test_cuda_bindings_must_fit_the_driver(bindings, driver, ok):
    if ok:
        choice.check_bindings(bindings, driver)
    else:
        with pytest.raises(CudaDriverError, match=rf"cuda-bindings {bindings} needs a driver for CUDA 13.*'cuda-bind"):
            choice.check_bindings(bindings, driver)


def test_driver_and_arch_names():
    assert choice.describe_driver(12080) == "CUDA 12.8" and choice.describe_driver(13000) == "CUDA 13.0"
    assert choice.parse_arch("sm_100") == (10, 0, "") and choice.parse_arch("sm_103a") == (10, 3, "a")
    assert choice.arch_name((10, 3)) == "sm_103"
    with pytest.raises(CubinNotFoundError, match="unreadable arch"):
        choice.parse_arch("compute_90")


def test_the_shipped_manifest_serves_every_supported_machine():
    manifest = load_manifest(REPO / "cubins" / "manifest.json")
    for cc in ((8, 0), (8, 6), (9, 0), (10, 0), (10, 3)):
        for driver in (R535, R570, R580):
            if cc[0] == 10 and driver < R570:
                continue  # Blackwell needs r570
            e = choice.choose_entry(manifest, "intranode", cc, False, driver)
            assert e["min_driver"] <= driver and e["flavour"] == ("cu13" if driver >= 13000 else "cu12")
            if cc >= (9, 0):
                for nv in ("cu12", "cu13") if driver >= 13000 else ("cu12",):
                    assert choice.choose_entry(manifest, "low_latency", cc, False, driver, None, nv)["flavour"] == nv


def test_cubin_flavour_knob(monkeypatch):
    monkeypatch.delenv("EP_RT_CUBIN_FLAVOUR", raising=False)
    assert env.cubin_flavour() is None
    for value, want in (("cu12", "cu12"), (" CU13 ", "cu13"), ("", None)):
        monkeypatch.setenv("EP_RT_CUBIN_FLAVOUR", value)
        assert env.cubin_flavour() == want
    monkeypatch.setenv("EP_RT_CUBIN_FLAVOUR", "cu11")
    with pytest.raises(ValueError, match="EP_RT_CUBIN_FLAVOUR must be one of cu12, cu13"):
        env.cubin_flavour()


def test_low_latency_needs_sm90():
    from ep_rt.errors import EpRtError
    from ep_rt.ops.low_latency import LowLatencyOp

    LowLatencyOp.require_arch((9, 0))
    LowLatencyOp.require_arch((10, 3))
    with pytest.raises(EpRtError, match=r"compute capability 9.0 or newer.*this GPU is 8.0 \(sm_80\).*intranode mode"):
        LowLatencyOp.require_arch((8, 0))
