"""CPU tests of ep_rt.reference_ll: hand-worked LL dispatch / combine cases and the LogFMT-10 codec."""

import math

import pytest
import torch

from ep_rt import reference as ref
from ep_rt import reference_ll as ll

from .exact import T as Tn, assert_eq

i32, i64, f32, f64, bf16, fp8 = (
    torch.int32,
    torch.int64,
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float8_e4m3fn,
)


def rng(begin, count):
    return (begin << 32) | count


# ----------------------------------------------------------------------------------------
# Hand-worked case: R=2, E=4 (L=2: rank 0 owns experts 0,1; rank 1 owns 2,3), T=4, H=128, K=2
#   rank 0 (N=3): t0 -> [1, 2]    rank 1 (N=2): t0 -> [3, 0]
#                 t1 -> [2, 2]  (duplicate)     t1 -> [0, -1]
#                 t2 -> [-1, 0]
# Receive side (blocks by source ascending, rows by (t, k) ascending):
#   rank 0, l0 (e0): src0: t2 | src1: t0, t1    -> src_info [2, 0, 1], ranges (0,1), (1,2)
#   rank 0, l1 (e1): src0: t0 | src1: -         -> src_info [0],       ranges (0,1), (1,0)
#   rank 1, l0 (e2): src0: t0, t1, t1 | src1: - -> src_info [0, 1, 1], ranges (0,3), (3,0)
#   rank 1, l1 (e3): src0: - | src1: t0         -> src_info [0],       ranges (0,0), (0,1)
# ----------------------------------------------------------------------------------------
R, E, L, TMAX, H = 2, 4, 2, 4, 128
IDX = [Tn([[1, 2], [2, 2], [-1, 0]], i64), Tn([[3, 0], [0, -1]], i64)]
BASE = (torch.arange(H) % 4 + 1).to(f32)  # channel pattern 1,2,3,4,1,2,...
V = [[1.0, 2.0, -1.0], [0.5, 3.0]]  # xs[r][t] = V[r][t] * BASE
XS = [torch.stack([v * BASE for v in vs]).to(bf16) for vs in V]
# (source rank, token) of every valid row, per receiving rank and local expert.
ROWS = {(0, 0): [(0, 2), (1, 0), (1, 1)], (0, 1): [(0, 0)], (1, 0): [(0, 0), (0, 1), (0, 1)], (1, 1): [(1, 0)]}


def hand_dispatch(**kw):
    return ll.low_latency_dispatch(XS, IDX, TMAX, E, **kw)


def test_dispatch_layout_fields():
    out = hand_dispatch(use_fp8=False)
    assert len(out) == 2
    assert_eq(out[0]["packed_recv_count"], Tn([3, 1], i32))
    assert_eq(out[1]["packed_recv_count"], Tn([3, 1], i32))
    assert_eq(out[0]["num_recv_per_expert_and_source"], Tn([[1, 2], [1, 0]], i32))
    assert_eq(out[1]["num_recv_per_expert_and_source"], Tn([[3, 0], [0, 1]], i32))
    assert_eq(out[0]["packed_recv_layout_range"], Tn([[rng(0, 1), rng(1, 2)], [rng(0, 1), rng(1, 0)]], i64))
    assert_eq(out[1]["packed_recv_layout_range"], Tn([[rng(0, 3), rng(3, 0)], [rng(0, 0), rng(0, 1)]], i64))
    assert int(out[0]["packed_recv_layout_range"][0, 1]) == 4294967298  # (1 << 32) | 2
    assert_eq(out[0]["packed_recv_src_info"], Tn([[2, 0, 1, 0, 0, 0, 0, 0], [0] * 8], i32))
    assert_eq(out[1]["packed_recv_src_info"], Tn([[0, 1, 1, 0, 0, 0, 0, 0], [0] * 8], i32))
    assert out[0]["packed_recv_x_scales"] is None


def test_dispatch_bf16_payload():
    out = hand_dispatch(use_fp8=False)
    for me in range(R):
        x = out[me]["packed_recv_x"]
        assert x.dtype == bf16 and x.shape == (L, R * TMAX, H)
        for l in range(L):
            expected = torch.zeros(R * TMAX, H, dtype=bf16)
            for row, (s, t) in enumerate(ROWS[(me, l)]):
                expected[row] = XS[s][t]
            assert_eq(x[l], expected)
    # One row spelled out: rank 0, expert 0, row 2 is rank 1's token 1 = 3 * BASE.
    assert_eq(out[0]["packed_recv_x"][0, 2, :4], Tn([3, 6, 9, 12], bf16))


def test_dispatch_fp8_payload_and_scales():
    out = hand_dispatch(use_fp8=True)
    for me in range(R):
        x, sc = out[me]["packed_recv_x"], out[me]["packed_recv_x_scales"]
        assert x.dtype == fp8 and x.shape == (L, R * TMAX, H)
        assert sc.dtype == f32 and sc.shape == (L, R * TMAX, H // 128)
        for l in range(L):
            rows = ROWS[(me, l)]
            for row, (s, t) in enumerate(rows):
                v, s_inv = ref.per_token_cast_to_fp8(XS[s][t : t + 1])  # the cast of that one token
                assert_eq(x[l, row], v[0])
                assert_eq(sc[l, row], s_inv[0])
            assert not x[l, len(rows) :].view(torch.uint8).any()
            assert not sc[l, len(rows) :].any()
    # Rank 0, expert 0, row 1 = rank 1's token 0 = 0.5 * BASE: amax = 2 -> scale_inv = 2 * f32(1/448),
    # values 448 / 2 * x = 112 * BASE -> e4m3 112, 224, 320 (336 is a tie between 320 and 352 -> even), 448.
    expected_scale = Tn([2.0], f32) * Tn([1 / 448], f32)
    assert_eq(out[0]["packed_recv_x_scales"][0, 1], expected_scale)
    assert_eq(out[0]["packed_recv_x"][0, 1, :4].float(), Tn([112, 224, 320, 448], f32))


def test_dispatch_round_scale_f32_values():
    out = hand_dispatch(use_fp8=True, round_scale=True)
    # Rank 1 expert 0 rows: rank 0 tokens 0, 1, 1 with amax 4, 8, 8.
    # 4/448 -> 2**ceil(log2(0.00893)) = 2**-6;  8/448 -> 2**-5.
    assert_eq(out[1]["packed_recv_x_scales"][0, :4], Tn([[2.0**-6], [2.0**-5], [2.0**-5], [0.0]], f32))
    # Values are x * 2**6 = 64 * BASE for token 0: 64, 128, 192, 256 (all exact in e4m3).
    assert_eq(out[1]["packed_recv_x"][0, 0, :4].float(), Tn([64, 128, 192, 256], f32))


def test_dispatch_ue8m0_packed_h512():
    # H = 512 (4 groups of 128). One token on rank 0 -> expert 3 (rank 1, local 1); group amaxes
    # 1, 2, 0.5, 448 -> scale_inv 2**ceil(log2(amax/448)) = 2**-8, 2**-7, 2**-9, 2**0
    # -> UE8M0 bytes 119, 120, 118, 127 packed little-endian into one int32.
    H4 = 512
    x0 = torch.zeros(1, H4)
    for g, amax in enumerate([1.0, 2.0, 0.5, 448.0]):
        x0[0, g * 128] = amax
        x0[0, g * 128 + 1] = -amax / 2
    xs = [x0.to(bf16), torch.zeros(0, H4, dtype=bf16)]
    idx = [Tn([[3]], i64), torch.zeros(0, 1, dtype=i64)]
    out = ll.low_latency_dispatch(xs, idx, 2, 4, use_fp8=True, round_scale=True, use_ue8m0=True)
    sc = out[1]["packed_recv_x_scales"]
    assert sc.dtype == i32 and sc.shape == (2, 4, 1)
    word = 119 | (120 << 8) | (118 << 16) | (127 << 24)
    word = word - (1 << 32) if word >= 1 << 31 else word
    assert_eq(sc[1], Tn([[word], [0], [0], [0]], i32))
    assert not sc[0].any()
    assert_eq(ref.unpack_ue8m0(sc[1, 0]), Tn([2.0**-8, 2.0**-7, 2.0**-9, 1.0], f32))
    x = out[1]["packed_recv_x"][1, 0].float()
    # x * 2**8 = 256, -128 in group 0; x * 2**7 = 256, -128 in group 1; 256, -128; 448, -224.
    assert_eq(x[[0, 1, 128, 129, 256, 257, 384, 385]], Tn([256, -128, 256, -128, 256, -128, 448, -224], f32))
    assert_eq(out[1]["packed_recv_layout_range"], Tn([[0, 0], [rng(0, 1), rng(1, 0)]], i64))
    assert_eq(out[0]["packed_recv_count"], Tn([0, 0], i32))


def test_dispatch_fp8_h128_allowed_without_ue8m0():
    out = hand_dispatch(use_fp8=True, round_scale=True)
    assert out[0]["packed_recv_x_scales"].shape == (L, R * TMAX, 1)
    with pytest.raises(ValueError, match="512"):
        hand_dispatch(use_fp8=True, round_scale=True, use_ue8m0=True)


def test_dispatch_masked_rank():
    out = hand_dispatch(use_fp8=False, masked_ranks=(1,))
    # Rank 1's tokens are not received anywhere; rank 0's still are (also by the masked rank 1).
    assert_eq(out[0]["packed_recv_count"], Tn([1, 1], i32))
    assert_eq(out[0]["packed_recv_src_info"][:, :2], Tn([[2, 0], [0, 0]], i32))
    assert_eq(out[0]["packed_recv_layout_range"], Tn([[rng(0, 1), rng(1, 0)], [rng(0, 1), rng(1, 0)]], i64))
    assert_eq(out[1]["packed_recv_count"], Tn([3, 0], i32))
    assert_eq(out[1]["num_recv_per_expert_and_source"], Tn([[3, 0], [0, 0]], i32))
    assert not out[0]["packed_recv_x"][0, 1:].any()
    out = hand_dispatch(use_fp8=False, masked_ranks=(0,))
    assert_eq(out[0]["packed_recv_count"], Tn([2, 0], i32))
    assert_eq(out[0]["packed_recv_layout_range"][0], Tn([rng(0, 0), rng(0, 2)], i64))
    assert_eq(out[1]["packed_recv_count"], Tn([0, 1], i32))


# ----------------------------------------------------------------------------------------
# Combine
# ----------------------------------------------------------------------------------------
W = [Tn([[0.5, 0.25], [0.5, 0.25], [0.75, 0.5]], f32), Tn([[0.25, 0.5], [1.0, 0.125]], f32)]


def scaled_expert_outs(disp):
    """Expert e multiplies its rows by (e + 1)."""
    outs = []
    for me in range(R):
        x = disp[me]["packed_recv_x"].float()
        mult = Tn([me * L + l + 1 for l in range(L)], f32).view(L, 1, 1)
        outs.append((x * mult).to(bf16))
    return outs


def test_combine_hand_values():
    disp = hand_dispatch(use_fp8=False)
    out = ll.low_latency_combine(scaled_expert_outs(disp), IDX, W, disp)
    # rank0 t0: 1 * (0.5*2 + 0.25*3) = 1.75       t1: 2 * (0.5*3 + 0.25*3) = 4.5
    #       t2: -1 * (0.5*1) = -0.5 (k0 is -1)    rank1 t0: 0.5 * (0.25*4 + 0.5*1) = 0.75
    # rank1 t1: 3 * (1.0*1) = 3 (k1 is -1)
    assert_eq(out[0]["combined_x"], (Tn([1.75, 4.5, -0.5], f32).view(3, 1) * BASE).to(bf16))
    assert_eq(out[1]["combined_x"], (Tn([0.75, 3.0], f32).view(2, 1) * BASE).to(bf16))


def test_combine_row_per_selection():
    # Fill every valid row with its own constant, so each (t, k) must hit its own row (duplicates too).
    disp = hand_dispatch(use_fp8=False)
    consts = {(0, 0): [1.0, 2.0, 4.0], (0, 1): [8.0], (1, 0): [16.0, 32.0, 64.0], (1, 1): [128.0]}
    outs = []
    for me in range(R):
        o = torch.full((L, R * TMAX, H), float("nan"), dtype=bf16)  # garbage past the counts
        for l in range(L):
            for row, c in enumerate(consts[(me, l)]):
                o[l, row] = c
        outs.append(o)
    out = ll.low_latency_combine(outs, IDX, W, disp)
    # rank0 t0: e1 row0 (8) * 0.5 + e2 row0 (16) * 0.25 = 8
    #       t1: e2 row1 (32) * 0.5 + e2 row2 (64) * 0.25 = 32
    #       t2: e0 row0 (1) * 0.5 = 0.5
    # rank1 t0: e3 row0 (128) * 0.25 + e0 row1 (2) * 0.5 = 33
    #       t1: e0 row2 (4) * 1.0 = 4
    assert_eq(out[0]["combined_x"], Tn([[8.0], [32.0], [0.5]], f32).expand(3, H).to(bf16))
    assert_eq(out[1]["combined_x"], Tn([[33.0], [4.0]], f32).expand(2, H).to(bf16))


def test_combine_masked_rank():
    disp = hand_dispatch(use_fp8=False, masked_ranks=(1,))
    out = ll.low_latency_combine(scaled_expert_outs(disp), IDX, W, disp, masked_ranks=(1,))
    # rank0 t0: only e1 (rank 0) -> 1 * 0.5 * 2 = 1;  t1: both on rank 1 -> 0;  t2: -1 * 0.5 * 1 = -0.5
    assert_eq(out[0]["combined_x"], (Tn([1.0, 0.0, -0.5], f32).view(3, 1) * BASE).to(bf16))
    assert out[1]["combined_x"] is None


def test_combine_with_fp8_dispatch_uses_rows():
    disp = hand_dispatch(use_fp8=True)
    outs = [ref.per_token_cast_back(d["packed_recv_x"], d["packed_recv_x_scales"]) for d in disp]
    out = ll.low_latency_combine(outs, IDX, W, disp)
    # Identity experts: token t * (sum of its valid weights), on the fp8 round trip of the token (the
    # weights 0.5, 0.25 make every product and sum exact in f32).
    coef = [[0.75, 0.75, 0.5], [0.75, 1.0]]
    for me in range(R):
        back = ref.per_token_cast_back(*ref.per_token_cast_to_fp8(XS[me])).float()
        assert_eq(out[me]["combined_x"], (Tn(coef[me], f32).view(-1, 1) * back).to(bf16))
    assert not torch.equal(out[0]["combined_x"], (Tn(coef[0], f32).view(-1, 1) * XS[0].float()).to(bf16))


def _loop_combine(outs, idx, w, disp, me):
    """Scalar loop: acc = acc + (w * y) with f32 0-d tensors, k ascending."""
    N, K = idx[me].shape
    res = torch.zeros(N, H, dtype=bf16)
    for t in range(N):
        for c in range(H):
            acc = torch.tensor(0.0, dtype=f32)
            for k in range(K):
                e = int(idx[me][t, k])
                if e < 0:
                    continue
                o, l = e // L, e % L
                begin = int(disp[o]["packed_recv_layout_range"][l, me]) >> 32
                before = [
                    (tt, kk) for tt in range(N) for kk in range(K) if int(idx[me][tt, kk]) == e and (tt, kk) < (t, k)
                ]
                y = outs[o][l, begin + len(before), c].float()
                prod = w[me][t, k] * y
                acc = acc + prod
            res[t, c] = acc.to(bf16)
    return res


def test_combine_no_fma_and_order():
    # K = 3. Token 0 (rank 0): k0 -> e0 with w=1, y=-1; k1 -> e2 with w, y such that w*y is not exact
    # in f32. Separate multiply/add gives exactly 1 + 2**-8 (a bf16 tie -> 1.0); a fused multiply-add
    # would round 1 + 2**-8 + delta up to 1 + 2**-7.
    # Token 1 (rank 0): k0 -> e1 with w*y = (1 + 2**-8) * 1, k1/k2 -> e2/e3 with 2**-24 * 1 each. Ascending order:
    # (1 + 2**-8) + 2**-24 ties back to 1 + 2**-8 twice -> bf16 1.0; reversed order would give
    # 2**-23 + (1 + 2**-8) -> bf16 1 + 2**-7.
    w_fma = Tn([1072902964], i32).view(f32)[0]  # f32 ~1.9000001
    y_fma = 1.0546875  # bf16
    idx = [Tn([[0, 2, -1], [1, 2, 3]], i64), torch.zeros(0, 3, dtype=i64)]
    w = [
        torch.stack([torch.stack([Tn(1.0, f32), w_fma, Tn(0.0, f32)]), Tn([1 + 2.0**-8, 2.0**-24, 2.0**-24], f32)]),
        torch.zeros(0, 3, dtype=f32),
    ]
    xs = [torch.zeros(2, H, dtype=bf16), torch.zeros(0, H, dtype=bf16)]
    disp = ll.low_latency_dispatch(xs, idx, 2, 4, use_fp8=False)
    outs = [torch.zeros(L, R * 2, H, dtype=bf16) for _ in range(R)]
    outs[0][0, 0] = -1.0  # e0 row of (0, t0, k0)
    outs[0][1, 0] = 1.0  # e1 row of (0, t1, k0)
    outs[1][0, 0] = y_fma  # e2 row of (0, t0, k1)
    outs[1][0, 1] = 1.0  # e2 row of (0, t1, k1)
    outs[1][1, 0] = 1.0  # e3 row of (0, t1, k2)
    out = ll.low_latency_combine(outs, idx, w, disp)
    got = out[0]["combined_x"]
    assert_eq(got, Tn([[1.0], [1.0]], f32).expand(2, H).to(bf16))
    assert_eq(got, _loop_combine(outs, idx, w, disp, 0))
    # The case discriminates: a fused multiply-add / the reversed order would differ.
    fused = torch.tensor(-1.0 + float(w_fma) * y_fma, dtype=f64).to(f32).to(bf16)
    assert float(fused) == 1 + 2.0**-7
    rev = (Tn(2.0**-24, f32) + Tn(2.0**-24, f32)) + Tn(1 + 2.0**-8, f32)
    assert float(rev.to(bf16)) == 1 + 2.0**-7


def test_combine_random_matches_loop():
    g = torch.Generator().manual_seed(0)
    Rr, Ee, Tt, Hh, K = 2, 4, 3, 128, 3
    idx = [torch.randint(-1, Ee, (n, K), generator=g) for n in (3, 2)]
    xs = [torch.randn(n, Hh, generator=g).to(bf16) for n in (3, 2)]
    w = [torch.rand(n, K, generator=g) for n in (3, 2)]
    disp = ll.low_latency_dispatch(xs, idx, Tt, Ee, use_fp8=False)
    outs = [torch.randn(2, Rr * Tt, Hh, generator=g).to(bf16) for _ in range(Rr)]
    out = ll.low_latency_combine(outs, idx, w, disp)
    for me in range(Rr):
        assert_eq(out[me]["combined_x"], _loop_combine(outs, idx, w, disp, me))


def test_combine_for_chosen_ranks_only():
    """ranks=(me,): rank me's sum as the hand loop computes it, every other rank None (what a test rank that
    checks only its own output asks for)."""
    g = torch.Generator().manual_seed(1)
    Rr, Ee, Tt, Hh, K = 4, 8, 3, 128, 3
    ns = (3, 2, 0, 3)
    idx = [torch.randint(-1, Ee, (n, K), generator=g) for n in ns]
    xs = [torch.randn(n, Hh, generator=g).to(bf16) for n in ns]
    w = [torch.rand(n, K, generator=g) for n in ns]
    disp = ll.low_latency_dispatch(xs, idx, Tt, Ee, use_fp8=False)
    outs = [torch.randn(Ee // Rr, Rr * Tt, Hh, generator=g).to(bf16) for _ in range(Rr)]
    for me in range(Rr):
        out = ll.low_latency_combine(outs, idx, w, disp, ranks=(me,))
        assert [o["combined_x"] is None for o in out] == [r != me for r in range(Rr)]
        assert_eq(out[me]["combined_x"], _loop_combine(outs, idx, w, disp, me))
    both = ll.low_latency_combine(outs, idx, w, disp, masked_ranks=(1,), ranks=(0, 1))
    assert both[1]["combined_x"] is None and both[2]["combined_x"] is None and both[0]["combined_x"] is not None


def test_combine_logfmt_applies_roundtrip():
    disp = hand_dispatch(use_fp8=False)
    g = torch.Generator().manual_seed(1)
    outs = [(torch.rand(L, R * TMAX, H, generator=g) * 0.9).to(bf16) for _ in range(R)]
    got = ll.low_latency_combine(outs, IDX, W, disp, use_logfmt=True)
    want = ll.low_latency_combine([ll.logfmt_roundtrip(o) for o in outs], IDX, W, disp)
    plain = ll.low_latency_combine(outs, IDX, W, disp)
    for me in range(R):
        assert_eq(got[me]["combined_x"], want[me]["combined_x"])
    assert not torch.equal(got[0]["combined_x"], plain[0]["combined_x"])


# ----------------------------------------------------------------------------------------
# LogFMT-10
# ----------------------------------------------------------------------------------------
def _code(x, log_amax, log_amin):
    step = (log_amax - log_amin) / 510
    rho = 2 - math.log2((1 + 2**step) / 2) / step
    return min(math.floor(max((math.log2(abs(x)) - log_amin) / step + rho, 0)), 511) if x != 0 else 0


def test_logfmt_hand_codes():
    # One division: amax = 0.5 (log2 = -1), amin = 2**-11 -> log_amin = -11, step = 10/510 = 1/51,
    # rho = 2 - log2((1 + 2**(1/51)) / 2) * 51 ~ 1.498.
    vals = {0: 0.5, 1: -0.125, 2: 0.25, 3: 2.0**-11, 4: 0.30078125, 5: 0.0, 6: -0.0}
    x = torch.zeros(1, 128)
    for c, v in vals.items():
        x[0, c] = v
    x = x.to(bf16)
    enc = ll.logfmt_encode(x)
    assert_eq(enc["castable"], Tn([[True]], torch.bool))
    assert_eq(enc["amax"], Tn([[0.5]], bf16))
    assert_eq(enc["amin"], Tn([[2.0**-11]], bf16))
    rho = 2 - math.log2((1 + 2 ** (1 / 51)) / 2) * 51
    assert 1.49 < rho < 1.51
    # 0.5: 10*51 + rho -> 511; 0.125: 8*51 + rho -> 409; 0.25: 9*51 + rho -> 460; 2**-11: rho -> 1;
    # 0.30078125: (log2(0.30078125) + 11) * 51 + rho = 474.15 -> 474; zeros -> 0.
    expected = [511, 409, 460, 1, 474, 0, 0]
    assert expected == [_code(vals[c], -1.0, -11.0) for c in range(7)]
    assert enc["codes"][0, 0, :7].tolist() == expected
    assert not enc["codes"][0, 0, 7:].any()
    assert enc["signs"][0, 0, :7].tolist() == [False, True, False, False, False, False, True]
    dec = ll.logfmt_decode(enc)
    # Powers of two come back exactly (2**((code-1)/51 - 11)); 0.30078125 -> 2**(473/51 - 11) = 0.30198
    # -> bf16 0.302734375; zeros stay zero.
    assert dec[0, :7].float().tolist() == [0.5, -0.125, 0.25, 2.0**-11, 0.302734375, 0.0, 0.0]
    assert not dec[0, 7:].any()
    assert_eq(ll.logfmt_roundtrip(x), dec)


# Codes that depend on the exact rounding offset rho = 2 - log2((1 + 2**step) / 2) / step. With u =
# (log2|x| - log_amin) / step, code = floor(u + rho): floor(u) + 1 while frac(u) < 2 - rho, floor(u) + 2 from there.
# 2 - rho is a little above 1/2 (0.50544 for step 32/510, 0.50338 for the second division), so values with frac(u)
# in [0.5, 2 - rho) get floor(u) + 1 here but floor(u) + 2 with an offset of 1.5, and the values just above 2 - rho
# or just below 0.5 pin it from the other side. Worked out in double precision (math.log2); every frac(u) lies at
# least 5e-4 from 2 - rho and from 0.5, far beyond the float32 error of the reference's u (about 1e-5 here).
#   division 0: amax 0.5, amin 2**-40: log_amin = max(-40, -1 - 32) = -33, step = 32/510, rho = 1.494564
#     x             log2 x      u          frac     code   (offset 1.5)
#     0.376953125   -1.407543   503.50478  0.50478  504    505       504 = 0x1f8: low byte 0xf8, bit 8 set
#     5.0735e-4     -10.944718  351.50606  0.50606  353    353       (= 0.000507354736328125)
#     0.0042724609  -7.870717   400.49795  0.49795  401    401       (= 0.0042724609375)
#     2**-33        -33         0          0        1      1         2**-40: below 2**log_amin, code 0
#     -> rho pinned to [2 - 0.50606, 2 - 0.50478) = [1.49394, 1.49522)
#   division 1: amax 0.9375, amin 2**-20: log_amin = -20, step = (log2 0.9375 + 20) / 510 = 0.0390331, rho = 1.496618
#     0.07470703125  -3.742612  416.50240  0.50240  417    418
#     0.12158203125  -3.039998  434.50286  0.50286  435    436
#     0.018798828125 -5.733213  365.50465  0.50465  367    367
#     0.43359375     -1.205584  481.49921  0.49921  482    482
#     -> rho pinned to [2 - 0.50465, 2 - 0.50286) = [1.49535, 1.49714)
LOGFMT_OFFSET_CASE = [  # (division, channel, x, code)
    (0, 0, 0.5, 511),
    (0, 1, 2.0**-40, 0),
    (0, 2, 0.376953125, 504),
    (0, 3, -0.000507354736328125, 353),
    (0, 4, 0.0042724609375, 401),
    (0, 5, -(2.0**-33), 1),
    (1, 0, -0.9375, 511),
    (1, 1, 2.0**-20, 1),
    (1, 2, 0.07470703125, 417),
    (1, 3, -0.12158203125, 435),
    (1, 4, 0.018798828125, 367),
    (1, 5, 0.43359375, 482),
]


def test_logfmt_codes_pin_the_rounding_offset():
    x = torch.zeros(1, 256)
    for d, c, v, _ in LOGFMT_OFFSET_CASE:
        x[0, 128 * d + c] = v
    x = x.to(bf16)
    assert [float(x[0, 128 * d + c]) for d, c, v, _ in LOGFMT_OFFSET_CASE] == [v for _, _, v, _ in LOGFMT_OFFSET_CASE]
    enc = ll.logfmt_encode(x)
    assert_eq(enc["castable"], Tn([[True, True]], torch.bool))
    assert [int(enc["codes"][0, d, c]) for d, c, _, _ in LOGFMT_OFFSET_CASE] == [k for *_, k in LOGFMT_OFFSET_CASE]
    assert [bool(enc["signs"][0, d, c]) for d, c, _, _ in LOGFMT_OFFSET_CASE] == [
        v < 0 for _, _, v, _ in LOGFMT_OFFSET_CASE
    ]
    assert not enc["codes"][0, :, 6:].any()
    # The case discriminates (plain double-precision formula, not the reference): an offset of 1.5, or one at
    # either end of the pinned intervals, changes some code.
    params = {0: (-33.0, 32 / 510), 1: (-20.0, (math.log2(0.9375) + 20) / 510)}

    def codes(offset):
        out = []
        for d, _, v, _ in LOGFMT_OFFSET_CASE:
            log_amin, step = params[d]
            u = (math.log2(abs(v)) - log_amin) / step
            out.append(min(math.floor(u + offset(step)), 511) if u >= 0 else 0)
        return out

    def rho(step):
        return 2 - math.log2((1 + 2**step) / 2) / step

    assert codes(rho) == [k for *_, k in LOGFMT_OFFSET_CASE]
    for wrong in (lambda s: 1.5, lambda s: rho(s) + 7e-4, lambda s: rho(s) - 7e-4, lambda s: 1.4999):
        assert codes(wrong) != codes(rho)


def test_logfmt_log_range_clamp():
    # amax = 0.5, amin = 2**-40: log_amin = max(-40, -1 - 32) = -33, step = 32/510. 2**-40 -> code 0.
    x = torch.zeros(1, 128)
    x[0, 0], x[0, 1], x[0, 2] = 0.5, 2.0**-40, 2.0**-33
    enc = ll.logfmt_encode(x.to(bf16))
    assert enc["codes"][0, 0, :3].tolist() == [511, 0, 1] == [_code(v, -1.0, -33.0) for v in (0.5, 2.0**-40, 2.0**-33)]
    dec = ll.logfmt_decode(enc)
    assert dec[0, :3].float().tolist() == [0.5, 0.0, 2.0**-33]


def test_logfmt_non_castable_divisions():
    g = torch.Generator().manual_seed(2)
    x = (torch.rand(4, 128, generator=g) - 0.5).to(bf16)  # 4 divisions of one row each
    x = x.reshape(1, 512).clone()
    x[0, 5] = 1.0  # division 0: |x| >= 1 -> not encoded
    x[0, 128:256] = 0.0  # division 1: all zero -> not encoded
    x[0, 256:384] = 0.0  # division 2: amin == amax (only +-0.25 present) -> not encoded
    x[0, 256], x[0, 300] = 0.25, -0.25
    x[0, 400] = -0.7  # division 3: castable
    enc = ll.logfmt_encode(x)
    assert_eq(enc["castable"], Tn([[False, False, False, True]], torch.bool))
    rt = ll.logfmt_roundtrip(x)
    assert_eq(rt[0, :384], x[0, :384])  # bit-exact bf16 passthrough
    assert not torch.equal(rt[0, 384:], x[0, 384:])
    assert_eq(ll.logfmt_roundtrip(torch.zeros(2, 3, 256, dtype=bf16)), torch.zeros(2, 3, 256, dtype=bf16))
    # Non-finite values make a division non-castable (kept as is).
    y = torch.full((1, 128), 0.5, dtype=bf16)
    y[0, 1] = float("inf")
    assert_eq(ll.logfmt_roundtrip(y), y)


def test_logfmt_roundtrip_relative_error():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 1024, generator=g) * 0.2).clamp(-0.99, 0.99).to(bf16)
    rt = ll.logfmt_roundtrip(x)
    assert rt.dtype == bf16 and rt.shape == x.shape
    assert bool(ll.logfmt_encode(x)["castable"].all())
    xf, rf = x.float(), rt.float()
    nz = xf != 0
    rel = ((rf - xf).abs() / xf.abs())[nz]
    assert float(rel.max()) < 0.04, float(rel.max())
    assert float(rel.mean()) < 0.01, float(rel.mean())
    assert torch.equal(torch.sign(rf), torch.sign(xf))
    assert not rf[~nz].any()


# ----------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mutate,exc,match",
    [
        (lambda a: a.update(xs=[XS[0].float(), XS[1]]), TypeError, "dtype"),
        (lambda a: a.update(xs=[XS[0].unsqueeze(0), XS[1]]), ValueError, "2-D"),
        (lambda a: a.update(xs=[XS[0][:, :64], XS[1][:, :64]]), ValueError, "multiple of 128"),
        (lambda a: a.update(xs=[XS[0][:, :128], XS[1][:, :64]]), ValueError, "hidden"),
        (lambda a: a.update(num_max_dispatch_tokens_per_rank=2), ValueError, "num_max_dispatch_tokens"),
        (lambda a: a.update(num_experts=3), ValueError, "divisible"),
        (lambda a: a.update(topk_idxs=[IDX[0].to(torch.int16), IDX[1]]), TypeError, "dtype"),
        (lambda a: a.update(topk_idxs=[IDX[0][:, 0], IDX[1]]), ValueError, "2-D"),
        (lambda a: a.update(topk_idxs=[IDX[0][:2], IDX[1]]), ValueError, "rows"),
        (lambda a: a.update(topk_idxs=[IDX[0], IDX[1][:, :1]]), ValueError, "top-k"),
        (lambda a: a.update(topk_idxs=[IDX[0], Tn([[4, 0], [0, -1]], i64)]), ValueError, r"\[-1, 4\)"),
        (lambda a: a.update(topk_idxs=[IDX[0], Tn([[-2, 0], [0, -1]], i64)]), ValueError, r"\[-1, 4\)"),
        (lambda a: a.update(topk_idxs=[IDX[0]]), ValueError, "one entry per rank"),
        (lambda a: a.update(use_ue8m0=True), ValueError, "round_scale"),
        (lambda a: a.update(use_ue8m0=True, round_scale=True), ValueError, "512"),
        (lambda a: a.update(masked_ranks=(2,)), ValueError, "masked_ranks"),
        (lambda a: a.update(xs=[]), ValueError, "non-empty"),
    ],
)
def test_dispatch_validation(mutate, exc, match):
    args = dict(xs=XS, topk_idxs=IDX, num_max_dispatch_tokens_per_rank=TMAX, num_experts=E)
    mutate(args)
    with pytest.raises(exc, match=match):
        ll.low_latency_dispatch(**args)


def _combine_args():
    disp = hand_dispatch(use_fp8=False)
    return dict(expert_outs=scaled_expert_outs(disp), topk_idxs=IDX, topk_weights=W, dispatch_results=disp)


@pytest.mark.parametrize(
    "mutate,exc,match",
    [
        (lambda a: a.update(expert_outs=[o.float() for o in a["expert_outs"]]), TypeError, "dtype"),
        (lambda a: a.update(expert_outs=[o[0] for o in a["expert_outs"]]), ValueError, "3-D"),
        (lambda a: a.update(expert_outs=[a["expert_outs"][0], a["expert_outs"][1][:, :4]]), ValueError, "shape"),
        (lambda a: a.update(topk_weights=[W[0].to(bf16), W[1]]), TypeError, "dtype"),
        (lambda a: a.update(topk_weights=[W[0][:, :1], W[1]]), ValueError, "shape"),
        (lambda a: a.update(topk_idxs=[IDX[0].to(torch.int16), IDX[1]]), TypeError, "dtype"),
        (lambda a: a.update(topk_idxs=[IDX[0], Tn([[4, 0], [0, -1]], i64)]), ValueError, r"\[-1, 4\)"),
        (
            lambda a: a.update(
                topk_idxs=[torch.zeros(5, 2, dtype=i64), IDX[1]], topk_weights=[torch.zeros(5, 2), W[1]]
            ),
            ValueError,
            "num_max_dispatch_tokens",
        ),
        (lambda a: a.update(topk_idxs=[Tn([[1, 2], [2, 3], [-1, 0]], i64), IDX[1]]), ValueError, "does not match"),
        (lambda a: a.update(dispatch_results=a["dispatch_results"][:1]), ValueError, "one entry per rank"),
        (lambda a: a.update(masked_ranks=(-1,)), ValueError, "masked_ranks"),
        (lambda a: a.update(ranks=(2,)), ValueError, r"ranks must be one or more ranks in \[0, 2\)"),
        (lambda a: a.update(ranks=()), ValueError, "ranks must be one or more"),
    ],
)
def test_combine_validation(mutate, exc, match):
    args = _combine_args()
    mutate(args)
    with pytest.raises(exc, match=match):
        ll.low_latency_combine(**args)


def test_logfmt_validation():
    with pytest.raises(ValueError, match="multiple of 128"):
        ll.logfmt_encode(torch.zeros(2, 64, dtype=bf16))
    with pytest.raises(TypeError, match="dtype"):
        ll.logfmt_encode(torch.zeros(2, 128))
    with pytest.raises(ValueError, match="multiple of 128"):
        ll.low_latency_combine(
            [torch.zeros(2, 8, 64, dtype=bf16)] * 2, IDX, W, hand_dispatch(use_fp8=False), use_logfmt=True
        )
