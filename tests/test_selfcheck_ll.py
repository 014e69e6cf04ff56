"""CPU tests of the LogFMT checking helpers in ep_rt.selfcheck_ll: the LogFMT cases' expert outputs cover every
division kind, and check_logfmt_combined accepts what lg2/ex2.approx can do to a combine (rare one-step code
changes) but not real errors (a systematic off-by-one, a wrong high bit or sign, any change of a bf16 division).
The "GPU" outputs here are reference combines over altered LogFMT encodings."""
import pytest
import torch

from ep_rt import reference_ll
from ep_rt.testing.checker import Checker
from ep_rt.testing.selfcheck_ll import (LOGFMT_BF16_KINDS, LOGFMT_KINDS, LLCase, _bf16_ulp, calc_diff, check_logfmt_combined,
                                ll_inputs, logfmt_bf16_channels, logfmt_error_bound, logfmt_expert_outputs, to_packed)

R, T, H, E = 2, 16, 768, 8  # 6 divisions per row: one of each kind
CASE = LLCase("cpu", max_tokens=T, num_tokens=12, hidden=H, num_topk=4, num_experts=E, use_fp8=False,
              use_logfmt=True)
SMALL = LOGFMT_KINDS.index("small")
LARGE = LOGFMT_KINDS.index("large")


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
    assert _bf16_ulp(torch.tensor([1.0, 0.0, 3.0, -0.5])).tolist() == [2.0 ** -7, 0.0, 2.0 ** -6, 2.0 ** -8]
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    assert calc_diff(x, x) == 0.0
    assert calc_diff(x, -x) == pytest.approx(2.0)
    assert calc_diff(x, 1.01 * x) == pytest.approx(0.01 ** 2 / (2 + 2 * 0.01 + 0.01 ** 2), rel=1e-4)  # f32 x


@pytest.fixture(scope="module")
def combine():
    """Rank 0's reference LogFMT combine, its error bound, and `output(alter)`: rank 0's combine over the
    decoded LogFMT encodings of every rank's expert outputs after alter(encoding) changed them in place."""
    xs, idxs, ws = ll_inputs(CASE, 5, R, "cpu")
    want = reference_ll.low_latency_dispatch(xs, idxs, T, E, use_fp8=False)
    ys = [logfmt_expert_outputs(5, r, E // R, R, T, H, "cpu") for r in range(R)]
    ref_in = [to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T)
              for r in range(R)]
    ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want, use_logfmt=True)[0]["combined_x"]
    bound = logfmt_error_bound(ref_in, idxs, ws, want, 0)

    def output(alter):
        decoded = []
        for y in ref_in:
            enc = reference_ll.logfmt_encode(y)
            alter(enc)
            decoded.append(reference_ll.logfmt_decode(enc))
        return reference_ll.low_latency_combine(decoded, idxs, ws, want)[0]["combined_x"]

    return ref, bound, output


def failures(got, ref, bound):
    chk = Checker(CASE)
    check_logfmt_combined(chk, "combined_x", got, ref, bound, logfmt_bf16_channels(H, "cpu"))
    assert chk.checks == 4
    return chk.failures


def test_reference_itself_passes(combine):
    ref, bound, output = combine
    got = output(lambda enc: None)
    assert torch.equal(got, ref)
    assert failures(got, ref, bound) == []


def test_rare_one_step_changes_pass(combine):
    """What the approximate instructions do: a few codes one step up or down (code 0 <-> 1 included)."""
    ref, bound, output = combine
    g = torch.Generator().manual_seed(1)

    def nudge(enc):
        codes = enc["codes"]
        pick = (torch.rand(codes.shape, generator=g) < 2e-3) & enc["castable"].unsqueeze(-1)
        step = torch.where(torch.rand(codes.shape, generator=g) < 0.5, -1, 1).to(codes.dtype)
        enc["codes"] = torch.where(pick, (codes + step).clamp(0, 511), codes)

    got = output(nudge)
    assert not torch.equal(got, ref)
    assert failures(got, ref, bound) == []


def test_systematic_off_by_one_fails(combine):
    ref, bound, output = combine

    def off_by_one(enc):
        enc["codes"] = torch.where(enc["codes"] > 0, (enc["codes"] + 1).clamp(max=511), enc["codes"])

    found = failures(output(off_by_one), ref, bound)
    assert any("differ from the reference" in f for f in found)
    assert any("calc_diff" in f for f in found)


@pytest.mark.parametrize("field", ["high bit", "sign"])
def test_one_wrong_channel_fails(combine, field):
    ref, bound, output = combine

    def corrupt(enc):  # channel 5 of the first 'small' division, in every row
        if field == "high bit":
            enc["codes"][..., SMALL, 5] ^= 256
        else:
            enc["signs"][..., SMALL, 5] = ~enc["signs"][..., SMALL, 5]

    assert any("beyond one LogFMT step" in f for f in failures(output(corrupt), ref, bound))


def test_any_change_of_a_bf16_division_fails(combine):
    ref, bound, output = combine

    def one_ulp(enc):  # channel 3 of the 'large' division (sent as bf16), in every row
        col = LARGE * 128 + 3
        v = enc["fallback"][..., col]
        enc["fallback"][..., col] = (v.view(torch.int16) + 1).view(torch.bfloat16)

    assert any("channels sent as bf16" in f for f in failures(output(one_ulp), ref, bound))
