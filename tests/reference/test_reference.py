"""CPU tests of ep_rt.reference: hand-worked small cases plus property tests against loops."""

import pytest
import torch

from ep_rt import reference as ref

from .exact import T, assert_eq

i32, i64, f32, bf16, fp8 = torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.float8_e4m3fn


# ----------------------------------------------------------------------------------------
# Hand-worked case: R=2, E=4 (L=2), N=3 per rank, K=2, H=2, C=2
#   rank 0: t0 -> experts [0, 3] (ranks 0,1)   rank 1: t0 -> [3, 2] (rank 1)
#           t1 -> [1, -1]  (rank 0)                     t1 -> [-1, -1] (nowhere)
#           t2 -> [2, 3]   (rank 1)                     t2 -> [0, 2] (ranks 0,1)
# ----------------------------------------------------------------------------------------
IDX = [T([[0, 3], [1, -1], [2, 3]], i64), T([[3, 2], [-1, -1], [0, 2]], i64)]
W = [T([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], f32), T([[0.7, 0.8], [0.9, 1.0], [1.1, 1.2]], f32)]
X = [T([[1, 2], [3, 4], [5, 6]], bf16), T([[7, 8], [9, 10], [11, 12]], bf16)]


def hand_dispatch(**kw):
    return ref.intranode_dispatch(X, IDX, W, num_experts=4, num_channels=2, **kw)


def test_layout_hand():
    per_rank, per_rdma, per_expert, in_rank = ref.dispatch_layout(IDX[0], 4, 2)
    assert_eq(per_rank, T([2, 2], i32))
    assert per_rdma is None
    assert_eq(per_expert, T([1, 1, 1, 2], i32))
    assert_eq(in_rank, T([[True, True], [True, False], [False, True]], torch.bool))
    per_rank, per_rdma, per_expert, in_rank = ref.dispatch_layout(IDX[1], 4, 2)
    assert_eq(per_rank, T([1, 2], i32))
    assert_eq(per_expert, T([1, 0, 2, 1], i32))
    assert_eq(in_rank, T([[False, True], [False, False], [True, True]], torch.bool))


def test_layout_multiplicity_and_rdma():
    # R=16, E=32 (2 experts per rank): nodes are ranks 0-7 and 8-15.
    idx = T([[0, 1, 31], [17, -1, -1], [-1, -1, -1], [2, 30, 16]], i64)
    per_rank, per_rdma, per_expert, in_rank = ref.dispatch_layout(idx, 32, 16)
    expected_expert = [0] * 32
    for e, c in {0: 1, 1: 1, 31: 1, 17: 1, 2: 1, 30: 1, 16: 1}.items():
        expected_expert[e] = c
    assert_eq(per_expert, T(expected_expert, i32))
    expected_rank = [0] * 16
    for r, c in {0: 1, 15: 2, 8: 2, 1: 1}.items():
        expected_rank[r] = c
    assert_eq(per_rank, T(expected_rank, i32))
    assert_eq(per_rdma, T([2, 3], i32))  # node 0: t0, t3; node 1: t0, t1, t3
    assert in_rank.shape == (4, 16) and not in_rank[2].any()
    # Two selections on the same expert count twice for the expert, once for the rank.
    per_rank, _, per_expert, _ = ref.dispatch_layout(T([[1, 1]], i64), 4, 2)
    assert_eq(per_expert, T([0, 2, 0, 0], i32))
    assert_eq(per_rank, T([1, 0], i32))


def test_channel_ranges():
    assert ref.channel_ranges(3, 2) == [(0, 2), (2, 3)]
    assert ref.channel_ranges(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert ref.channel_ranges(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert ref.channel_ranges(0, 2) == [(0, 0), (0, 0)]


def test_dispatch_hand():
    out = hand_dispatch(expert_alignment=1)
    o0, o1 = out
    # Rank 0 receives src0 t0, src0 t1, src1 t2; rank 1 receives src0 t0, t2, src1 t0, t2.
    assert o0["num_recv"] == 3 and o1["num_recv"] == 4
    assert_eq(o0["recv_x"], T([[1, 2], [3, 4], [11, 12]], bf16))
    assert_eq(o1["recv_x"], T([[1, 2], [5, 6], [7, 8], [11, 12]], bf16))
    assert o0["recv_x_scales"] is None
    assert_eq(o0["recv_src_idx"], T([0, 1, 2], i32))
    assert_eq(o1["recv_src_idx"], T([0, 2, 0, 2], i32))
    assert_eq(o0["recv_topk_idx"], T([[0, -1], [1, -1], [0, -1]], i64))
    assert_eq(o1["recv_topk_idx"], T([[-1, 1], [0, 1], [1, 0], [-1, 0]], i64))
    assert_eq(o0["recv_topk_weights"], T([[0.1, 0.0], [0.3, 0.0], [1.1, 0.0]], f32))
    assert_eq(o1["recv_topk_weights"], T([[0.0, 0.2], [0.5, 0.6], [0.7, 0.8], [0.0, 1.2]], f32))
    assert o0["num_recv_tokens_per_expert_list"] == [2, 1]
    assert o1["num_recv_tokens_per_expert_list"] == [3, 3]
    for o in out:
        assert_eq(o["rank_prefix_matrix"], T([[2, 2], [3, 4]], i32))
    assert_eq(o0["channel_prefix_matrix"], T([[2, 2], [1, 2]], i32))
    assert_eq(o1["channel_prefix_matrix"], T([[0, 1], [1, 2]], i32))
    assert_eq(o0["recv_channel_prefix_matrix"], T([[0, 2], [0, 0]], i32))
    assert_eq(o1["recv_channel_prefix_matrix"], T([[0, 1], [0, 1]], i32))
    assert_eq(o0["send_pos"], T([[0, 0], [1, -1], [-1, 1]], i32))
    assert_eq(o1["send_pos"], T([[-1, 0], [-1, -1], [0, 1]], i32))
    assert_eq(o0["is_token_in_rank"], T([[True, True], [True, False], [False, True]], torch.bool))
    assert_eq(o1["is_token_in_rank"], T([[False, True], [False, False], [True, True]], torch.bool))


def test_dispatch_hand_alignment():
    o0, o1 = hand_dispatch(expert_alignment=4)
    assert o0["num_recv_tokens_per_expert_list"] == [4, 4]
    assert o1["num_recv_tokens_per_expert_list"] == [4, 4]
    o0, o1 = hand_dispatch(expert_alignment=2)
    assert o0["num_recv_tokens_per_expert_list"] == [2, 2]
    assert o1["num_recv_tokens_per_expert_list"] == [4, 4]
    assert o0["num_recv"] == 3  # data is not padded by the alignment


def test_dispatch_hand_worst_tokens():
    o0, o1 = hand_dispatch(num_worst_tokens=5)
    assert o0["num_recv"] == 3 and o1["num_recv"] == 4
    assert o0["num_recv_tokens_per_expert_list"] == [] == o1["num_recv_tokens_per_expert_list"]
    assert_eq(o0["recv_x"], T([[1, 2], [3, 4], [11, 12], [0, 0], [0, 0]], bf16))
    assert_eq(o0["recv_topk_idx"], T([[0, -1], [1, -1], [0, -1], [-1, -1], [-1, -1]], i64))
    assert_eq(o0["recv_topk_weights"], T([[0.1, 0.0], [0.3, 0.0], [1.1, 0.0], [0, 0], [0, 0]], f32))
    assert_eq(o0["recv_src_idx"], T([0, 1, 2, 0, 0], i32))
    assert_eq(o1["recv_topk_idx"], T([[-1, 1], [0, 1], [1, 0], [-1, 0], [-1, -1]], i64))
    assert_eq(o1["rank_prefix_matrix"], T([[2, 2], [3, 4]], i32))
    with pytest.raises(ValueError, match="num_worst_tokens"):
        hand_dispatch(num_worst_tokens=3)  # rank 1 receives 4


def test_cached_dispatch_hand():
    out = hand_dispatch()
    cached = ref.intranode_cached_dispatch(X, out)
    for o, c in zip(out, cached):
        assert_eq(c["recv_x"], o["recv_x"])
        assert c["recv_x_scales"] is None
    # Handles from a num_worst_tokens dispatch: cached result = first num_recv rows.
    worst = hand_dispatch(num_worst_tokens=6)
    for o, c in zip(worst, ref.intranode_cached_dispatch(X, worst)):
        assert_eq(c["recv_x"], o["recv_x"][: o["num_recv"]])


# Combine inputs in each rank's receive order:
#   rank 0 rows: (src0,t0) (src0,t1) (src1,t2);  rank 1 rows: (src0,t0) (src0,t2) (src1,t0) (src1,t2)
Y = [T([[1, 2], [3, 4], [5, 6]], bf16), T([[10, 20], [30, 40], [50, 60], [70, 80]], bf16)]


def test_combine_hand_no_bias():
    out = hand_dispatch()
    c0, c1 = ref.intranode_combine(Y, out)
    assert_eq(c0["combined_x"], T([[11, 22], [3, 4], [30, 40]], bf16))
    assert_eq(c1["combined_x"], T([[50, 60], [0, 0], [75, 86]], bf16))
    assert c0["combined_topk_weights"] is None


def test_combine_hand_bias():
    out = hand_dispatch()
    b0 = torch.full((3, 2), 0.5, dtype=bf16)
    b1 = torch.full((3, 2), 0.25, dtype=bf16)
    b = T([[1, 1], [2, 2], [3, 3]], bf16)
    c0, c1 = ref.intranode_combine(Y, out, biases=[(b0, b1), (None, b)])
    assert_eq(c0["combined_x"], T([[11.75, 22.75], [3.75, 4.75], [30.75, 40.75]], bf16))
    assert_eq(c1["combined_x"], T([[51, 61], [2, 2], [78, 89]], bf16))
    c0, c1 = ref.intranode_combine(Y, out, biases=[None, b])  # plain tensor bias
    assert_eq(c0["combined_x"], T([[11, 22], [3, 4], [30, 40]], bf16))
    assert_eq(c1["combined_x"], T([[51, 61], [2, 2], [78, 89]], bf16))


def test_combine_hand_weights_and_extra_rows():
    out = hand_dispatch(num_worst_tokens=5)  # inputs with padding rows beyond num_recv
    ys = [torch.cat([y, torch.full((5 - y.shape[0], 2), 99, dtype=bf16)]) for y in Y]
    res = ref.intranode_combine(ys, out, topk_weights=[o["recv_topk_weights"] for o in out])
    assert_eq(res[0]["combined_x"], T([[11, 22], [3, 4], [30, 40]], bf16))
    # Original weights where the expert is selected, 0 where idx == -1 or the token is not sent.
    assert_eq(res[0]["combined_topk_weights"], T([[0.1, 0.2], [0.3, 0.0], [0.5, 0.6]], f32))
    assert_eq(res[1]["combined_topk_weights"], T([[0.7, 0.8], [0.0, 0.0], [1.1, 1.2]], f32))


def test_dispatch_without_topk():
    routes = [o["is_token_in_rank"] for o in hand_dispatch()]
    out = ref.intranode_dispatch(X, None, None, 4, 2, is_token_in_ranks=routes)
    assert_eq(out[1]["recv_x"], T([[1, 2], [5, 6], [7, 8], [11, 12]], bf16))
    assert out[1]["recv_topk_idx"] is None and out[1]["recv_topk_weights"] is None
    assert out[1]["num_recv_tokens_per_expert_list"] == []
    assert_eq(out[0]["rank_prefix_matrix"], T([[2, 2], [3, 4]], i32))


# ----------------------------------------------------------------------------------------
# FP8 helpers
# ----------------------------------------------------------------------------------------
def test_fp8_cast_hand_row():
    x = torch.zeros(1, 256, dtype=bf16)
    x[0, :4] = T([448, -224, 1, 0.5], bf16)  # group 0: amax 448 -> scale_inv 1
    x[0, 128:130] = T([1, -0.5], bf16)  # group 1: amax 1 -> scale_inv f32(1/448)
    v, s = ref.per_token_cast_to_fp8(x)
    assert s.dtype == f32 and s.shape == (1, 2)
    assert s[0, 0].item() == 1.0
    assert s[0, 1].item() == T(1 / 448, f32).item()
    assert_eq(v[0, :4].float(), T([448, -224, 1, 0.5], f32))
    assert_eq(v[0, 128:130].float(), T([448, -224], f32))
    assert (v[0, 4:128].float() == 0).all()
    # All-zero group: amax clamps at f32(1e-4) = 0x38d1b717 -> scale_inv = rn(0x38d1b717 * 0x3b124925) = 0x346facad.
    v, s = ref.per_token_cast_to_fp8(torch.zeros(2, 128, dtype=bf16))
    assert_eq(s.view(i32), T([[0x346FACAD], [0x346FACAD]], i32))
    assert (v.float() == 0).all()


# ----------------------------------------------------------------------------------------
# FP8 scales at non-power-of-two amax, as f32 bit patterns (the kernels produce them bit for bit).
# Worked out with exact rational arithmetic on the IEEE values (Python fractions, round to nearest even), not with
# the reference: f32(1/448) = 0x3b124925;
#   scale_inv = rn(amax * 0x3b124925)       (amax / 448 as one division would give the "div" column)
#   scale     = rn(448 / amax)              (448 * rn(1 / amax) would give the "recip" column)
#   round_scale: scale_inv = 2**e, e = ceil(log2(rn(amax * 0x3b124925))), scale = 2**-e.
# scale itself is not returned; it shows in the e4m3 bytes of probes x = 0.75 amax (x * 448 / amax = 336, the
# midpoint of e4m3 320 and 352) and, for amax 3.0625, x = 2.953125 (432, the midpoint of 416 and 448): rn(x * scale)
# is that midpoint (a tie, to the even byte) or one f32 ulp beside it, so a scale one ulp off moves the byte (the
# last column says which way: "+" a scale one ulp up, "-" one ulp down).
# Columns: amax (bf16), probe values in channels 0.. of the group, scale_inv, scale, e4m3 bytes of the probes,
# round_scale's scale_inv and bytes, the probes' directions. Mutants, for the record:
#   amax 3.0:        div 0x3bdb6db7, recip 0x43155556 (byte of -2.25: 0xfb)
#   amax 3.0625:     div 0x3be00000, recip 0x43124924 (byte of 2.953125: 0x7d)
#   amax 13.0:       div 0x3cedb6db   amax 0.30078125: div 0x3a300000   amax 100.0: div 0x3e649249
#   amax 0.010009765625: recip 0x472ed44a   amax 5.0: both the same (a control)
# ----------------------------------------------------------------------------------------
FP8_SCALE_CASES = [
    # amax, probes, scale_inv, scale, bytes, round_scale scale_inv, round_scale bytes, directions
    (3.0, [3.0, -2.25], 0x3BDB6DB8, 0x43155555, [0x7E, 0xFA], 0x3C000000, [0x7C, 0xF9], "+"),
    (
        3.0625,
        [3.0625, -2.296875, 2.953125],
        0x3BE00001,
        0x43124925,
        [0x7E, 0xFA, 0x7E],
        0x3C000000,
        [0x7C, 0xF9, 0x7C],
        "+-",
    ),
    (13.0, [13.0, 9.75], 0x3CEDB6DC, 0x4209D89E, [0x7E, 0x7B], 0x3D000000, [0x7D, 0x7A], "-"),
    (
        0.30078125,
        [0.30078125, -0.2255859375, 0.2470703125],
        0x3A300001,
        0x44BA2E8C,
        [0x7E, 0xFA, 0x7C],
        0x3A800000,
        [0x7A, 0xF6, 0x78],
        "+-",
    ),
    (100.0, [100.0, -75.0], 0x3E64924A, 0x408F5C29, [0x7E, 0xFA], 0x3E800000, [0x7C, 0xF9], "+"),
    (
        0.010009765625,
        [0.010009765625, -0.00750732421875],
        0x37BB6DB7,
        0x472ED44B,
        [0x7E, 0xFA],
        0x38000000,
        [0x7A, 0xF7],
        "+",
    ),
    (5.0, [5.0, -3.75], 0x3C36DB6E, 0x42B33333, [0x7E, 0xFA], 0x3C800000, [0x7A, 0xF7], "+"),
    # max |x| = 9.965896606445312e-05 < 1e-4: amax clamps to f32(1e-4) = 0x38d1b717, scale = rn(448 / that) = 4480000
    (9.965896606445312e-05, [9.965896606445312e-05], 0x346FACAD, 0x4A88B800, [0x7E], 0x34800000, [0x7D], ""),
]


def _fp8_case_rows():
    x = torch.zeros(len(FP8_SCALE_CASES), 128, dtype=bf16)
    for i, (_, probes, *_rest) in enumerate(FP8_SCALE_CASES):
        x[i, : len(probes)] = T(probes, bf16)
        assert x[i, : len(probes)].float().tolist() == probes  # every probe is a bf16 value
    return x


@pytest.mark.parametrize("round_scale", [False, True])
def test_fp8_scale_bits_hand(round_scale):
    x = _fp8_case_rows()
    v, s = ref.per_token_cast_to_fp8(x, round_scale=round_scale)
    for i, (amax, probes, inv, _scale, bytes_, rs_inv, rs_bytes, _dirs) in enumerate(FP8_SCALE_CASES):
        want_inv, want_bytes = (rs_inv, rs_bytes) if round_scale else (inv, bytes_)
        assert s[i].view(i32).tolist() == [want_inv], (amax, hex(s[i].view(i32).item()), hex(want_inv))
        assert v[i, : len(probes)].view(torch.uint8).tolist() == want_bytes, (amax, v[i].view(torch.uint8)[:4])
        assert not v[i, len(probes) :].view(torch.uint8).any()
    # The LL dispatch sends exactly these scales and bytes (one token per row, all to expert 0).
    n = len(FP8_SCALE_CASES)
    out = ref.low_latency_dispatch([x], [torch.zeros(n, 1, dtype=i64)], n, 1, round_scale=round_scale)[0]
    assert_eq(out["packed_recv_x_scales"][0].view(i32), s.view(i32))
    assert_eq(out["packed_recv_x"][0].view(torch.uint8), v.view(torch.uint8))


def test_fp8_scale_probes_pin_the_scale():
    # The scale column is the f32 value whose probe bytes are listed (torch's own f32 multiply and e4m3 cast, not
    # the reference), and the probes discriminate: a scale one ulp up / down changes a byte where marked.
    def probe_bytes(probes, scale_bits):
        sc = T([scale_bits], i32).view(f32)
        return (T(probes, bf16).float() * sc).clamp(-448, 448).to(fp8).view(torch.uint8).tolist()

    for amax, probes, _inv, scale, bytes_, _rs_inv, _rs_bytes, dirs in FP8_SCALE_CASES:
        assert probe_bytes(probes, scale) == bytes_, amax
        moved = "".join(d for d, bits in (("+", scale + 1), ("-", scale - 1)) if probe_bytes(probes, bits) != bytes_)
        assert moved == dirs, amax


def test_fp8_ue8m0_packed_bits_hand():
    # H = 512: groups of the first four cases; UE8M0 bytes = exponent field of the round_scale scale_inv:
    # 0x3c000000 -> 0x78, 0x3c000000 -> 0x78, 0x3d000000 -> 0x7a, 0x3a800000 -> 0x75, little-endian in one int32.
    x = _fp8_case_rows()[:4].reshape(1, 512)
    v, packed = ref.per_token_cast_to_fp8(x, round_scale=True, use_ue8m0=True)
    assert_eq(packed, T([[0x757A7878]], i32))


def test_fp8_round_scale_power_of_two():
    x = torch.zeros(4, 128, dtype=bf16)
    x[:, 0] = T([448, 449, 224, 1], bf16)  # 449 in bf16 is 448 -> use 450
    x[1, 0] = 450
    v, s = ref.per_token_cast_to_fp8(x, round_scale=True)
    assert_eq(s[:, 0], T([1.0, 2.0, 0.5, 2.0**-8], f32))
    assert_eq(v[:, 0].float(), T([448, 224, 448, 256], f32))
    torch.manual_seed(0)
    y = torch.randn(16, 512) * torch.logspace(-3, 3, 16).unsqueeze(1)
    _, s = ref.per_token_cast_to_fp8(y.bfloat16(), round_scale=True)
    m, e = torch.frexp(s)
    assert (m == 0.5).all()  # exact powers of two
    amax = y.bfloat16().float().view(16, 4, 128).abs().amax(-1)
    assert (amax / s <= 448).all() and (amax / (s / 2) > 448 * (1 - 1e-6)).all()


def test_ue8m0_pack_unpack_hand():
    packed = ref.pack_ue8m0(T([[1.0, 2.0, 0.5, 4.0], [1.0, 1.0, 1.0, 1.0]], f32))
    # bytes 127, 128, 126, 129 little-endian -> 0x817E807F (as signed int32)
    assert_eq(packed, T([[0x817E807F - 2**32], [0x7F7F7F7F]], i32))
    assert_eq(ref.unpack_ue8m0(packed), T([[1.0, 2.0, 0.5, 4.0], [1.0, 1.0, 1.0, 1.0]], f32))
    s = T([2.0**-127 * 2, 2.0**127, 2.0**-20, 8.0], f32)
    assert_eq(ref.unpack_ue8m0(ref.pack_ue8m0(s)), s)


def test_fp8_ue8m0_cast():
    torch.manual_seed(1)
    x = torch.randn(3, 1024, dtype=bf16)
    v, packed = ref.per_token_cast_to_fp8(x, round_scale=True, use_ue8m0=True)
    v2, s = ref.per_token_cast_to_fp8(x, round_scale=True)
    assert packed.dtype == i32 and packed.shape == (3, 2)
    assert_eq(v, v2)
    assert_eq(ref.unpack_ue8m0(packed), s)
    assert_eq(ref.per_token_cast_back(v, packed), ref.per_token_cast_back(v2, s))


def calc_diff(x, y):
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


@pytest.mark.parametrize("round_scale", [False, True])
def test_fp8_cast_back_error(round_scale):
    torch.manual_seed(2)
    x = (torch.randn(32, 512) * torch.rand(32, 1) * 10).bfloat16()
    v, s = ref.per_token_cast_to_fp8(x, round_scale=round_scale)
    back = ref.per_token_cast_back(v, s)
    assert back.dtype == bf16 and back.shape == x.shape
    assert calc_diff(back, x) < 1e-3
    # e4m3 has 3 mantissa bits: relative error <= 1/16 for normal values.
    big = x.float().abs() > s.repeat_interleave(128, dim=1) * 2**-6 * 2
    assert ((back.float() - x.float()).abs() <= x.float().abs() / 16 + 1e-6)[big].all()


# ----------------------------------------------------------------------------------------
# Property tests on random inputs, compared with explicit loops
# ----------------------------------------------------------------------------------------
def random_case(seed, R=4, E=16, K=4, H=64, ns=(7, 0, 13, 5)):
    g = torch.Generator().manual_seed(seed)
    xs, idxs, ws = [], [], []
    for n in ns:
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)]) if n else torch.empty(0, K, dtype=i64)
        idx = torch.where(torch.rand(n, K, generator=g) < 0.3, torch.full_like(idx, -1), idx)
        idxs.append(idx)
        ws.append(torch.rand(n, K, generator=g))
        xs.append(torch.randn(n, H, generator=g).bfloat16())
    return xs, idxs, ws


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dispatch_random_vs_loops(seed):
    R, E, C = 4, 16, 3
    L = E // R
    xs, idxs, ws = random_case(seed)
    out = ref.intranode_dispatch(xs, idxs, ws, E, C, expert_alignment=3)
    routes = [[[any(int(e) >= 0 and int(e) // L == r for e in row) for r in range(R)] for row in idx] for idx in idxs]
    sent = [[sum(rt[r] for rt in routes[s]) for r in range(R)] for s in range(R)]
    for me in range(R):
        o = out[me]
        src_tok = [(s, t) for s in range(R) for t in range(len(routes[s])) if routes[s][t][me]]
        assert o["num_recv"] == len(src_tok)
        assert o["recv_src_idx"].tolist() == [t for _, t in src_tok]
        for j, (s, t) in enumerate(src_tok):
            assert torch.equal(o["recv_x"][j], xs[s][t])
            for k in range(idxs[s].shape[1]):
                e = int(idxs[s][t, k])
                local = me * L <= e < (me + 1) * L
                assert o["recv_topk_idx"][j, k] == (e - me * L if local else -1)
                assert o["recv_topk_weights"][j, k] == (ws[s][t, k] if local else 0.0)
        counts = [sum(int((idxs[s] == me * L + l).sum()) for s in range(R)) for l in range(L)]
        assert o["num_recv_tokens_per_expert_list"] == [(c + 2) // 3 * 3 for c in counts]
        rpm = [[sum(sent[s][j] for s in range(i + 1)) for j in range(R)] for i in range(R)]
        assert o["rank_prefix_matrix"].tolist() == rpm
        ends = [e for _, e in ref.channel_ranges(len(routes[me]), C)]
        assert o["channel_prefix_matrix"].tolist() == [
            [sum(routes[me][t][d] for t in range(end)) for end in ends] for d in range(R)
        ]
        for s in range(R):
            s_ends = [e for _, e in ref.channel_ranges(len(routes[s]), C)]
            cpm = [sum(routes[s][t][me] for t in range(end)) for end in s_ends]
            assert o["recv_channel_prefix_matrix"][s].tolist() == [0] + cpm[:-1]
        for d in range(R):
            pos = 0
            for t in range(len(routes[me])):
                assert o["send_pos"][t, d] == (pos if routes[me][t][d] else -1)
                pos += routes[me][t][d]


def test_random_weights_reconstruct_and_cached():
    xs, idxs, ws = random_case(5)
    out = ref.intranode_dispatch(xs, idxs, ws, 16, 2, num_worst_tokens=40)
    res = ref.intranode_combine([o["recv_x"] for o in out], out, topk_weights=[o["recv_topk_weights"] for o in out])
    for r in range(4):
        assert_eq(res[r]["combined_topk_weights"], torch.where(idxs[r] >= 0, ws[r], torch.zeros_like(ws[r])))
        # combining the dispatched x gives x times the number of destination ranks
        # (exactly: n copies of a bf16 value add up in f32 without rounding, then one bf16 rounding)
        n_dst = out[r]["is_token_in_rank"].sum(1, keepdim=True).float()
        assert_eq(res[r]["combined_x"], (xs[r].float() * n_dst).to(bf16))
    for o, c in zip(out, ref.intranode_cached_dispatch(xs, out)):
        assert_eq(c["recv_x"], o["recv_x"][: o["num_recv"]])


@pytest.mark.parametrize("int_scales", [False, True])
def test_fp8_dispatch_scales_and_cached(int_scales):
    xs, idxs, ws = random_case(7, H=256)
    fp8_xs = []
    for x in xs:
        v, s = ref.per_token_cast_to_fp8(x)
        if int_scales:
            s = s.view(i32)
        fp8_xs.append((v, s.t().contiguous().t()))  # column-major scales: strides are honoured
    out = ref.intranode_dispatch(fp8_xs, idxs, ws, 16, 2)
    bf_out = ref.intranode_dispatch(xs, idxs, ws, 16, 2)
    cached = ref.intranode_cached_dispatch(fp8_xs, out)
    for me in range(4):
        o = out[me]
        assert o["recv_x"].dtype == fp8 and o["recv_x_scales"].dtype == (i32 if int_scales else f32)
        assert o["recv_x_scales"].is_contiguous() and o["recv_x_scales"].shape == (o["num_recv"], 2)
        rows = [(s, t) for s in range(4) for t in range(len(xs[s])) if out[s]["is_token_in_rank"][t, me]]
        for j, (s, t) in enumerate(rows):
            assert torch.equal(o["recv_x_scales"][j].view(i32), fp8_xs[s][1][t].view(i32))
            assert torch.equal(o["recv_x"][j].view(torch.uint8), fp8_xs[s][0][t].view(torch.uint8))
        assert_eq(cached[me]["recv_x"].view(torch.uint8), o["recv_x"].view(torch.uint8))
        assert_eq(cached[me]["recv_x_scales"], o["recv_x_scales"])
        assert_eq(o["recv_topk_idx"], bf_out[me]["recv_topk_idx"])


def test_combine_bit_exact_order():
    g = torch.Generator().manual_seed(3)
    R, H = 4, 64
    xs, idxs, ws = random_case(9, H=H)
    out = ref.intranode_dispatch(xs, idxs, ws, 16, 2)
    # Values mixing +-2**30 with small numbers: the f32 result depends on the summation order.
    palette = T([2.0**30, -(2.0**30), 1.0, 3.0, -0.5], bf16)

    def pick(n):
        return palette[torch.randint(0, len(palette), (n, H), generator=g)]

    ys = [pick(o["num_recv"]) for o in out]
    biases = [(pick(len(x)), pick(len(x))) for x in xs]
    biases[1] = (None, biases[1][1])
    biases[2] = None
    res = ref.intranode_combine(ys, out, biases=biases)
    num_order_sensitive = 0
    for me in range(R):
        rpm = out[me]["rank_prefix_matrix"]
        for t in range(len(xs[me])):
            terms = [b[t] for b in (biases[me] or (None, None)) if b is not None]
            for r in range(R):
                if out[me]["is_token_in_rank"][t, r]:
                    row = (int(rpm[me - 1, r]) if me > 0 else 0) + int(out[me]["send_pos"][t, r])
                    terms.append(ys[r][row])
            acc = torch.zeros(H, dtype=f32)
            for term in terms:
                acc = acc + term.float()
            assert torch.equal(res[me]["combined_x"][t], acc.to(bf16))
            rev = torch.zeros(H, dtype=f32)
            for term in reversed(terms):
                rev = rev + term.float()
            num_order_sensitive += int((rev.to(bf16) != acc.to(bf16)).sum())
    assert num_order_sensitive > 0  # the check above really pins the order


# ----------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------
def test_layout_errors():
    with pytest.raises(ValueError, match="divisible"):
        ref.dispatch_layout(IDX[0], 5, 2)
    with pytest.raises(ValueError, match=r"\[-1, 4\)"):
        ref.dispatch_layout(T([[4, 0]], i64), 4, 2)
    with pytest.raises(ValueError, match=r"\[-1, 4\)"):
        ref.dispatch_layout(T([[-2, 0]], i64), 4, 2)
    with pytest.raises(TypeError, match="dtype"):
        ref.dispatch_layout(IDX[0].short(), 4, 2)
    with pytest.raises(ValueError, match="2-D"):
        ref.dispatch_layout(IDX[0].flatten(), 4, 2)
    with pytest.raises(ValueError, match="multiple of 8"):
        ref.dispatch_layout(T([[0]], i64), 12, 12)
    with pytest.raises(ValueError):
        ref.channel_ranges(3, 0)


def test_dispatch_errors():
    with pytest.raises(ValueError, match="divisible"):
        ref.intranode_dispatch(X, IDX, W, 3, 2)
    with pytest.raises(TypeError, match="dtype"):
        ref.intranode_dispatch([x.float() for x in X], IDX, W, 4, 2)
    with pytest.raises(ValueError, match="topk_weights"):
        ref.intranode_dispatch(X, IDX, [W[0], W[1][:2]], 4, 2)
    with pytest.raises(ValueError, match="topk_idxs"):
        ref.intranode_dispatch(X, [IDX[0], IDX[1][:2]], W, 4, 2)
    with pytest.raises(ValueError, match="xs\\[1\\]"):
        ref.intranode_dispatch([X[0], X[1][:, :1]], IDX, W, 4, 2)
    with pytest.raises(ValueError, match=r"\[-1, 4\)"):
        ref.intranode_dispatch(X, [IDX[0], IDX[1] + 2], W, 4, 2)
    with pytest.raises(ValueError, match="is_token_in_ranks"):
        ref.intranode_dispatch(X, None, None, 4, 2)
    with pytest.raises(ValueError, match="without topk_idxs"):
        routes = [torch.ones(3, 2, dtype=torch.bool)] * 2
        ref.intranode_dispatch(X, None, W, 4, 2, is_token_in_ranks=routes)
    with pytest.raises(ValueError, match="is_token_in_ranks"):
        ref.intranode_dispatch(X, None, None, 4, 2, is_token_in_ranks=[torch.ones(3, 3, dtype=torch.bool)] * 2)
    with pytest.raises(ValueError, match="all ranks"):
        ref.intranode_dispatch(X, [IDX[0], None], W, 4, 2)
    with pytest.raises(TypeError, match="dtype"):
        ref.intranode_dispatch([(x.to(fp8), torch.ones(3, 1, dtype=torch.float16)) for x in X], IDX, W, 4, 2)
    with pytest.raises(ValueError, match="scales rows"):
        ref.intranode_dispatch([(x.to(fp8), torch.ones(2, 1)) for x in X], IDX, W, 4, 2)


def test_combine_errors():
    out = hand_dispatch()
    with pytest.raises(ValueError, match="rows"):
        ref.intranode_combine([Y[0][:2], Y[1]], out)
    with pytest.raises(TypeError, match="dtype"):
        ref.intranode_combine([y.float() for y in Y], out)
    with pytest.raises(ValueError, match="shape"):
        ref.intranode_combine(Y, out, biases=[torch.zeros(2, 2, dtype=bf16), None])
    with pytest.raises(TypeError, match="dtype"):
        ref.intranode_combine(Y, out, biases=[torch.zeros(3, 2), None])
    with pytest.raises(ValueError, match="topk_weights"):
        ref.intranode_combine(Y, out, topk_weights=[torch.zeros(1, 2), torch.zeros(4, 2)])
    with pytest.raises(ValueError, match="one handle per rank"):
        ref.intranode_combine(Y, out[:1])


def test_fp8_errors():
    with pytest.raises(ValueError, match="multiple of 128"):
        ref.per_token_cast_to_fp8(torch.zeros(2, 100))
    with pytest.raises(ValueError, match="round_scale"):
        ref.per_token_cast_to_fp8(torch.zeros(2, 512), use_ue8m0=True)
    with pytest.raises(ValueError, match="multiple of 512"):
        ref.per_token_cast_to_fp8(torch.zeros(2, 256), round_scale=True, use_ue8m0=True)
    with pytest.raises(ValueError, match="power-of-two"):
        ref.pack_ue8m0(T([1.0, 3.0, 1.0, 1.0], f32))
    with pytest.raises(ValueError, match="power-of-two"):
        ref.pack_ue8m0(T([1.0, -2.0, 1.0, 1.0], f32))
    with pytest.raises(ValueError, match="power-of-two"):
        ref.pack_ue8m0(T([1.0, 0.0, 1.0, 1.0], f32))
    with pytest.raises(ValueError, match="multiple of 4"):
        ref.pack_ue8m0(T([1.0, 2.0], f32))
    with pytest.raises(TypeError):
        ref.pack_ue8m0(T([1, 2, 4, 8], i32))
    with pytest.raises(ValueError, match="scales shape"):
        ref.per_token_cast_back(torch.zeros(2, 256).to(fp8), torch.ones(2, 3))
