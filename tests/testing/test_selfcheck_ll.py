"""CPU tests of the LogFMT checking helpers in ep_rt.testing.selfcheck_ll: the LogFMT cases' expert outputs cover every
division kind, and check_logfmt_combined accepts what lg2/ex2.approx can do to a combine (rare one-step code
changes and bf16 roundings, at the rate tools/logfmt_rate_model.py derives, and that model's own emulation of the
kernels) but not real errors (a rounding offset of 1.5, a systematic off-by-one, a wrong high bit or sign, any
change of a bf16 division). The "GPU" outputs here are reference combines over altered LogFMT round trips."""

import importlib.util
import sys

import pytest
import torch

from ep_rt import reference_ll
from ep_rt.testing.checker import Checker
from ep_rt.testing.selfcheck_ll import (
    LOGFMT_ALLOWED_FACTOR,
    LOGFMT_BF16_KINDS,
    LOGFMT_KINDS,
    LOGFMT_MIN_ALLOWED,
    LOGFMT_PAIR_RATE,
    LLCase,
    _bf16_ulp,
    calc_diff,
    check_logfmt_combined,
    ll_inputs,
    logfmt_allowed_differing,
    logfmt_bf16_channels,
    logfmt_error_bound,
    logfmt_expert_outputs,
    logfmt_num_pairs,
    to_packed,
)

from ..repo import REPO

R, T, H, E = 2, 64, 768, 16  # 6 divisions per row: one of each kind
CASE = LLCase("cpu", max_tokens=T, num_tokens=64, hidden=H, num_topk=8, num_experts=E, use_fp8=False, use_logfmt=True)
SMALL = LOGFMT_KINDS.index("small")
LARGE = LOGFMT_KINDS.index("large")
CODED = int((~logfmt_bf16_channels(H, "cpu")).sum())


def _model():
    path = REPO / "tools" / "logfmt_rate_model.py"
    spec = importlib.util.spec_from_file_location("_logfmt_rate_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


model = _model()


def test_expert_outputs_have_every_division_kind():
    y = logfmt_expert_outputs(3, 0, E // R, R, T, H, "cpu")
    castable = reference_ll.logfmt_encode(y)["castable"]
    want = torch.tensor([k not in LOGFMT_BF16_KINDS for k in LOGFMT_KINDS])
    assert torch.equal(castable, want.expand_as(castable))
    assert torch.equal(logfmt_bf16_channels(H, "cpu"), (~want).repeat_interleave(128))
    d = y.float().reshape(*y.shape[:-1], len(LOGFMT_KINDS), 128)
    kind = LOGFMT_KINDS.index
    assert (d[..., kind("zero"), :] == 0).all()
    assert (d[..., kind("small with zeros"), :] == 0).any()
    assert (d[..., kind("constant"), :].abs() == 0.25).all()
    assert (d[..., LARGE, :].abs().amax(-1) >= 1).all()
    wide = d[..., kind("wide range"), :].abs()
    nonzero_min = torch.where(wide > 0, wide, torch.full_like(wide, float("inf"))).amin(-1)
    assert (torch.log2(wide.amax(-1)) - torch.log2(nonzero_min) > 32).any()  # log_amin gets clipped


def test_bf16_ulp_and_calc_diff():
    assert _bf16_ulp(torch.tensor([1.0, 0.0, 3.0, -0.5])).tolist() == [2.0**-7, 0.0, 2.0**-6, 2.0**-8]
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    assert calc_diff(x, x) == 0.0
    assert calc_diff(x, -x) == pytest.approx(2.0)
    assert calc_diff(x, 1.01 * x) == pytest.approx(0.01**2 / (2 + 2 * 0.01 + 0.01**2), rel=1e-4)  # f32 x


@pytest.fixture(scope="module")
def combine():
    """Rank 0's reference LogFMT combine, its error bound, its number of (element, coded term) pairs, and
    `output(roundtrip)`: rank 0's combine over roundtrip(y) of every rank's expert outputs y (the reference
    combine applies logfmt_roundtrip; roundtrip stands for what the kernels' codec made of y)."""
    xs, idxs, ws = ll_inputs(CASE, 5, R, "cpu")
    want = reference_ll.low_latency_dispatch(xs, idxs, T, E, use_fp8=False)
    ys = [logfmt_expert_outputs(5, r, E // R, R, T, H, "cpu") for r in range(R)]
    ref_in = [
        to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T) for r in range(R)
    ]
    ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want, use_logfmt=True)[0]["combined_x"]
    bound = logfmt_error_bound(ref_in, idxs, ws, want, 0)

    def output(roundtrip):
        return reference_ll.low_latency_combine([roundtrip(y) for y in ref_in], idxs, ws, want)[0]["combined_x"]

    return ref, bound, logfmt_num_pairs(idxs[0], CODED), output


def altered(alter):
    """A round trip whose encoding alter(enc) changed in place."""

    def roundtrip(y):
        enc = reference_ll.logfmt_encode(y)
        alter(enc)
        return reference_ll.logfmt_decode(enc)

    return roundtrip


def check(got, ref, bound, pairs):
    chk = Checker(CASE)
    check_logfmt_combined(chk, "combined_x", got, ref, bound, logfmt_bf16_channels(H, "cpu"), pairs)
    assert chk.checks == 4 and len(chk.notes) == 1
    return chk


def failures(got, ref, bound, pairs):
    return check(got, ref, bound, pairs).failures


def test_allowance_floor_and_factor():
    assert logfmt_allowed_differing(0) == LOGFMT_MIN_ALLOWED
    assert logfmt_allowed_differing(10_000) == LOGFMT_MIN_ALLOWED  # expected 0.2: the floor
    assert LOGFMT_ALLOWED_FACTOR * LOGFMT_PAIR_RATE * 3_000_000 == pytest.approx(300)
    assert logfmt_allowed_differing(3_000_000) == 300  # the LL reference shape's order of pairs
    assert logfmt_allowed_differing(3_000_001) == 301  # rounded up
    with pytest.raises(ValueError, match="num_pairs"):
        logfmt_allowed_differing(-1)
    idx = torch.tensor([[0, -1, 3], [-1, -1, -1], [2, 2, 1]])
    assert logfmt_num_pairs(idx, 384) == 5 * 384


def test_reference_itself_passes_and_is_logged(combine):
    ref, bound, pairs, output = combine
    got = output(reference_ll.logfmt_roundtrip)
    assert torch.equal(got, ref)
    chk = check(got, ref, bound, pairs)
    assert chk.failures == []
    assert chk.notes[0].startswith(f"combined_x: 0 of {64 * CODED} LogFMT elements differ from the reference (0.0000%")
    assert f"allowed {logfmt_allowed_differing(pairs)}" in chk.notes[0]


def test_changes_at_the_expected_rate_pass(combine):
    """What the approximate instructions do, at 2.5x the per-term rate of the model (about 4e-5): codes one step
    up or down (code 0 <-> 1 included) and decoded values one bf16 ulp off."""
    ref, bound, pairs, output = combine
    g = torch.Generator().manual_seed(1)

    def roundtrip(y):
        enc = reference_ll.logfmt_encode(y)
        codes = enc["codes"]
        pick = (torch.rand(codes.shape, generator=g) < 5e-5) & enc["castable"].unsqueeze(-1)
        step = torch.where(torch.rand(codes.shape, generator=g) < 0.5, -1, 1).to(codes.dtype)
        enc["codes"] = torch.where(pick, (codes + step).clamp(0, 511), codes)
        dec = reference_ll.logfmt_decode(enc)
        coded = enc["castable"].repeat_interleave(128, dim=-1) & (dec != 0)
        ulp = (torch.rand(dec.shape, generator=g) < 5e-5) & coded
        return torch.where(ulp, (dec.view(torch.int16) + 1).view(torch.bfloat16), dec)

    got = output(roundtrip)
    assert not torch.equal(got, ref)
    assert failures(got, ref, bound, pairs) == []


def test_the_model_of_the_kernels_passes(combine):
    """tools/logfmt_rate_model.py's emulation of logfmt.cuh (lg2/ex2 off by up to 2^-22)."""
    ref, bound, pairs, output = combine
    approx = model.Approx(torch.Generator().manual_seed(2), 2.0**-22, 2.0**-22)
    got = output(lambda y: model.emulated_roundtrip(y, approx))
    assert failures(got, ref, bound, pairs) == []
    # and without errors the emulation is the reference, but for the kernels' own float32 order (1/step, ...)
    exact = output(lambda y: model.emulated_roundtrip(y, model.Approx(torch.Generator(), 0.0, 0.0)))
    assert int((exact.view(torch.int16) != ref.view(torch.int16)).sum()) <= LOGFMT_MIN_ALLOWED


def test_rounding_offset_of_1_5_fails(combine):
    """The audit's surviving oracle mutant: rho = 1.5 (exact otherwise) is far over the allowance."""
    ref, bound, pairs, output = combine
    got = output(lambda y: model.reference_with_offset(y, 1.5))
    found = failures(got, ref, bound, pairs)
    assert any("differ from the reference" in f for f in found), found
    differing = int((got.view(torch.int16) != ref.view(torch.int16)).sum())
    assert differing > 3 * logfmt_allowed_differing(pairs)


def test_systematic_off_by_one_fails(combine):
    ref, bound, pairs, output = combine

    def off_by_one(enc):
        enc["codes"] = torch.where(enc["codes"] > 0, (enc["codes"] + 1).clamp(max=511), enc["codes"])

    found = failures(output(altered(off_by_one)), ref, bound, pairs)
    assert any("differ from the reference" in f for f in found)
    assert any("calc_diff" in f for f in found)


@pytest.mark.parametrize("field", ["high bit", "sign"])
def test_one_wrong_channel_fails(combine, field):
    ref, bound, pairs, output = combine

    def corrupt(enc):  # channel 5 of the first 'small' division, in every row
        if field == "high bit":
            enc["codes"][..., SMALL, 5] ^= 256
        else:
            enc["signs"][..., SMALL, 5] = ~enc["signs"][..., SMALL, 5]

    assert any("beyond one LogFMT step" in f for f in failures(output(altered(corrupt)), ref, bound, pairs))


def test_any_change_of_a_bf16_division_fails(combine):
    ref, bound, pairs, output = combine

    def one_ulp(enc):  # channel 3 of the 'large' division (sent as bf16), in every row
        col = LARGE * 128 + 3
        v = enc["fallback"][..., col]
        enc["fallback"][..., col] = (v.view(torch.int16) + 1).view(torch.bfloat16)

    assert any("channels sent as bf16" in f for f in failures(output(altered(one_ulp)), ref, bound, pairs))
