"""CPU tests of ep_rt.reference's internode dispatch / cached dispatch / combine.

Hand-worked small cases (every expected value below was worked out by hand from the routing written next to
it), invariants on random routings up to 32 nodes compared with an independent loop, and cross-checks with the
intranode reference (N = 1, G = 1) and of the combine's two-level rounding."""

import pytest
import torch

from ep_rt import reference as ref

from .exact import T, assert_eq

i32, i64, f32, bf16, fp8, u8 = torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.uint8


def meta(rows):
    """recv_src_meta bytes for (source node, mask) pairs, written out by hand: two little-endian int32."""
    out = []
    for node, mask in rows:
        out.append([node & 0xFF, (node >> 8) & 0xFF, 0, 0, mask & 0xFF, (mask >> 8) & 0xFF, 0, 0])
    return torch.tensor(out, dtype=u8).reshape(-1, 8)


def empty_rank(K, H=2):
    return torch.empty(0, H, dtype=bf16), torch.empty(0, K, dtype=i64), torch.empty(0, K, dtype=f32)


def check_fields(o, **want):
    for name, value in want.items():
        got = o[name]
        if isinstance(value, list):
            value = T(value, i32).reshape(got.shape) if got.numel() == 0 else T(value, i32)
        assert_eq(got, value)


# ----------------------------------------------------------------------------------------
# Case A: 2 nodes x 1 rank (G=1), E=4 (L=2), K=2, H=2, C=2 (channels [0,2) [2,3) of 3 tokens)
#   rank 0: t0 -> [0, 3] (ranks 0, 1)   t1 -> [1, -1] (rank 0)   t2 -> [2, 3] (rank 1)
#   rank 1: t0 -> [3, 2] (rank 1)       t1 -> [-1, -1] (nowhere) t2 -> [0, 2] (ranks 0, 1)
# ----------------------------------------------------------------------------------------
A_IDX = [T([[0, 3], [1, -1], [2, 3]], i64), T([[3, 2], [-1, -1], [0, 2]], i64)]
A_W = [T([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], f32), T([[0.7, 0.8], [0.9, 1.0], [1.1, 1.2]], f32)]
A_X = [T([[1, 2], [3, 4], [5, 6]], bf16), T([[7, 8], [9, 10], [11, 12]], bf16)]


def dispatch_a(**kw):
    return ref.internode_dispatch(A_X, A_IDX, A_W, num_experts=4, num_channels=2, num_ranks_per_node=1, **kw)


def test_a_2x1_dispatch_hand():
    o0, o1 = dispatch_a()
    assert (o0["num_recv"], o0["num_rdma_recv"], o1["num_recv"], o1["num_rdma_recv"]) == (3, 3, 4, 4)
    assert_eq(o0["recv_x"], T([[1, 2], [3, 4], [11, 12]], bf16))
    assert_eq(o1["recv_x"], T([[1, 2], [5, 6], [7, 8], [11, 12]], bf16))
    assert_eq(o0["recv_topk_idx"], T([[0, -1], [1, -1], [0, -1]], i64))
    assert_eq(o1["recv_topk_idx"], T([[-1, 1], [0, 1], [1, 0], [-1, 0]], i64))
    assert_eq(o0["recv_topk_weights"], T([[0.1, 0.0], [0.3, 0.0], [1.1, 0.0]], f32))
    assert_eq(o1["recv_topk_weights"], T([[0.0, 0.2], [0.5, 0.6], [0.7, 0.8], [0.0, 1.2]], f32))
    assert o0["num_recv_tokens_per_expert_list"] == [2, 1] and o1["num_recv_tokens_per_expert_list"] == [3, 3]
    check_fields(
        o0,
        rdma_channel_prefix_matrix=[[2, 2], [1, 2]],
        gbl_channel_prefix_matrix=[[2, 2], [1, 2]],
        send_rdma_head=[[0, 0], [1, -1], [-1, 0]],
        recv_rdma_channel_prefix_matrix=[[2, 2], [0, 1]],
        recv_rdma_rank_prefix_sum=[2, 3],
        recv_gbl_rank_prefix_sum=[2, 3],
        recv_gbl_channel_prefix_matrix=[[0, 2], [2, 2]],
        send_nvl_head=[[0], [1], [0]],
    )
    check_fields(
        o1,
        rdma_channel_prefix_matrix=[[0, 1], [1, 2]],
        gbl_channel_prefix_matrix=[[0, 1], [1, 2]],
        send_rdma_head=[[-1, 0], [-1, -1], [0, 0]],
        recv_rdma_channel_prefix_matrix=[[1, 2], [1, 2]],
        recv_rdma_rank_prefix_sum=[2, 4],
        recv_gbl_rank_prefix_sum=[2, 4],
        recv_gbl_channel_prefix_matrix=[[0, 1], [2, 3]],
        send_nvl_head=[[0], [1], [0], [1]],
    )
    assert_eq(o0["recv_src_meta"], meta([(0, 1), (0, 1), (1, 1)]))
    assert_eq(o1["recv_src_meta"], meta([(0, 1), (0, 1), (1, 1), (1, 1)]))
    assert_eq(o0["is_token_in_rank"], T([[True, True], [True, False], [False, True]], torch.bool))
    assert o0["handle"] == ref.handle_tuple(o0) and len(o0["handle"]) == 10


# ----------------------------------------------------------------------------------------
# Case B: 2 nodes x 2 ranks (G=2), E=8 (rank r holds experts 2r, 2r+1), K=3, H=2, C=2
#   rank 0 (node 0, local 0): t0 -> [0, 5, 7] ranks 0,2,3   t1 -> [2, -1, 3] rank 1   t2 -> [6, -1, -1] rank 3
#   rank 1 (node 0, local 1): t0 -> [4, 1, -1] ranks 2,0    t1 -> [-1, -1, -1] nowhere
#   rank 2 (node 1, local 0): t0 -> [3, 2, 6] ranks 1,3     t1 -> [0, 1, 4] ranks 0,2
#   rank 3 (node 1, local 1): t0 -> [7, 6, 5] ranks 3,2
# Channels: 3 tokens -> [0,2) [2,3); 2 tokens -> [0,1) [1,2); 1 token -> [0,1) [1,1).
# ----------------------------------------------------------------------------------------
B_IDX = [
    T([[0, 5, 7], [2, -1, 3], [6, -1, -1]], i64),
    T([[4, 1, -1], [-1, -1, -1]], i64),
    T([[3, 2, 6], [0, 1, 4]], i64),
    T([[7, 6, 5]], i64),
]
B_W = [
    T([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]], f32),
    T([[1.1, 1.2, 1.3], [1.4, 1.5, 1.6]], f32),
    T([[2.1, 2.2, 2.3], [2.4, 2.5, 2.6]], f32),
    T([[3.1, 3.2, 3.3]], f32),
]
B_X = [
    T([[1, 2], [3, 4], [5, 6]], bf16),
    T([[7, 8], [9, 10]], bf16),
    T([[11, 12], [13, 14]], bf16),
    T([[15, 16]], bf16),
]


def dispatch_b(**kw):
    return ref.internode_dispatch(B_X, B_IDX, B_W, num_experts=8, num_channels=2, num_ranks_per_node=2, **kw)


def test_b_2x2_receive_side_hand():
    o = dispatch_b()
    assert [x["num_recv"] for x in o] == [3, 2, 4, 4]
    assert [x["num_rdma_recv"] for x in o] == [4, 1, 4, 2]
    assert_eq(o[0]["recv_x"], T([[1, 2], [7, 8], [13, 14]], bf16))
    assert_eq(o[1]["recv_x"], T([[3, 4], [11, 12]], bf16))
    assert_eq(o[2]["recv_x"], T([[1, 2], [7, 8], [13, 14], [15, 16]], bf16))
    assert_eq(o[3]["recv_x"], T([[1, 2], [5, 6], [11, 12], [15, 16]], bf16))
    assert_eq(o[0]["recv_topk_idx"], T([[0, -1, -1], [-1, 1, -1], [0, 1, -1]], i64))
    assert_eq(o[1]["recv_topk_idx"], T([[0, -1, 1], [1, 0, -1]], i64))
    assert_eq(o[2]["recv_topk_idx"], T([[-1, 1, -1], [0, -1, -1], [-1, -1, 0], [-1, -1, 1]], i64))
    assert_eq(o[3]["recv_topk_idx"], T([[-1, -1, 1], [0, -1, -1], [-1, -1, 0], [1, 0, -1]], i64))
    assert_eq(o[0]["recv_topk_weights"], T([[0.1, 0, 0], [0, 1.2, 0], [2.4, 2.5, 0]], f32))
    assert_eq(o[3]["recv_topk_weights"], T([[0, 0, 0.3], [0.7, 0, 0], [0, 0, 2.3], [3.1, 3.2, 0]], f32))
    assert [x["num_recv_tokens_per_expert_list"] for x in o] == [[2, 2], [2, 2], [2, 2], [3, 2]]
    assert [x["num_recv_tokens_per_expert_list"] for x in dispatch_b(expert_alignment=2)] == [
        [2, 2],
        [2, 2],
        [2, 2],
        [4, 2],
    ]
    check_fields(
        o[0], recv_gbl_rank_prefix_sum=[1, 2, 3, 3], recv_gbl_channel_prefix_matrix=[[0, 1], [1, 2], [2, 2], [3, 3]]
    )
    check_fields(
        o[1], recv_gbl_rank_prefix_sum=[1, 1, 2, 2], recv_gbl_channel_prefix_matrix=[[0, 1], [1, 1], [1, 2], [2, 2]]
    )
    check_fields(
        o[2], recv_gbl_rank_prefix_sum=[1, 2, 3, 4], recv_gbl_channel_prefix_matrix=[[0, 1], [1, 2], [2, 2], [3, 4]]
    )
    check_fields(
        o[3], recv_gbl_rank_prefix_sum=[2, 2, 3, 4], recv_gbl_channel_prefix_matrix=[[0, 1], [2, 2], [2, 3], [3, 4]]
    )
    # (source node, mask over the receiving node's local ranks)
    assert_eq(o[0]["recv_src_meta"], meta([(0, 1), (0, 1), (1, 1)]))
    assert_eq(o[1]["recv_src_meta"], meta([(0, 2), (1, 2)]))
    assert_eq(o[2]["recv_src_meta"], meta([(0, 3), (0, 1), (1, 1), (1, 3)]))
    assert_eq(o[3]["recv_src_meta"], meta([(0, 3), (0, 2), (1, 2), (1, 3)]))
    node, mask = ref.decode_source_meta(o[2]["recv_src_meta"])
    assert_eq(node, T([0, 0, 1, 1], i32))
    assert_eq(mask, T([3, 1, 1, 3], i32))


def test_b_2x2_sender_and_forwarder_side_hand():
    o = dispatch_b()
    check_fields(
        o[0],
        rdma_channel_prefix_matrix=[[2, 2], [1, 2]],
        gbl_channel_prefix_matrix=[[1, 1], [1, 1], [1, 1], [1, 2]],
        send_rdma_head=[[0, 0], [1, -1], [-1, 0]],
    )
    check_fields(
        o[1],
        rdma_channel_prefix_matrix=[[1, 1], [1, 1]],
        gbl_channel_prefix_matrix=[[1, 1], [0, 0], [1, 1], [0, 0]],
        send_rdma_head=[[0, 0], [-1, -1]],
    )
    check_fields(
        o[2],
        rdma_channel_prefix_matrix=[[1, 2], [1, 2]],
        gbl_channel_prefix_matrix=[[0, 1], [1, 1], [0, 1], [1, 1]],
        send_rdma_head=[[0, 0], [0, 0]],
    )
    check_fields(
        o[3],
        rdma_channel_prefix_matrix=[[0, 0], [1, 1]],
        gbl_channel_prefix_matrix=[[0, 0], [0, 0], [1, 1], [1, 1]],
        send_rdma_head=[[-1, 0]],
    )
    # Forwarders: rank (m, j) forwards the tokens of ranks j (node 0) and 2 + j (node 1) that hit node m.
    check_fields(
        o[0],
        recv_rdma_channel_prefix_matrix=[[2, 2], [1, 2]],
        recv_rdma_rank_prefix_sum=[2, 4],
        send_nvl_head=[[0, -1], [-1, 0], [-1, 0], [0, -1]],
    )
    check_fields(
        o[1],
        recv_rdma_channel_prefix_matrix=[[1, 1], [0, 0]],
        recv_rdma_rank_prefix_sum=[1, 1],
        send_nvl_head=[[0, -1]],
    )
    check_fields(
        o[2],
        recv_rdma_channel_prefix_matrix=[[1, 2], [1, 2]],
        recv_rdma_rank_prefix_sum=[2, 4],
        send_nvl_head=[[0, 0], [-1, 1], [-1, 0], [0, -1]],
    )
    check_fields(
        o[3],
        recv_rdma_channel_prefix_matrix=[[1, 1], [1, 1]],
        recv_rdma_rank_prefix_sum=[1, 2],
        send_nvl_head=[[0, -1], [0, 0]],
    )


# Combine inputs, one value per received row (column 1 = -2 x column 0):
#   rank 0 rows: (s0 t0) (s1 t0) (s2 t1) = 1 2 3       rank 1 rows: (s0 t1) (s2 t0) = 4 5
#   rank 2 rows: (s0 t0) (s1 t0) (s2 t1) (s3 t0) = 6 7 8 9   rank 3 rows: (s0 t0) (s0 t2) (s2 t0) (s3 t0) = 10..13
B_Y = [T([[v, -2 * v] for v in vals], bf16) for vals in ([1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12, 13])]


def test_b_2x2_combine_hand():
    o = dispatch_b()
    c = ref.internode_combine(B_Y, [x["handle"] for x in o], topk_weights=[x["recv_topk_weights"] for x in o])
    # rank 0: t0 = 1 (r0) + 6 (r2) + 10 (r3); t1 = 4 (r1); t2 = 11 (r3)
    assert_eq(c[0]["combined_x"], T([[17, -34], [4, -8], [11, -22]], bf16))
    assert_eq(c[1]["combined_x"], T([[9, -18], [0, 0]], bf16))  # t0 = 2 (r0) + 7 (r2); t1 sent nowhere
    assert_eq(c[2]["combined_x"], T([[17, -34], [11, -22]], bf16))  # t0 = 5 (r1) + 12 (r3); t1 = 3 (r0) + 8 (r2)
    assert_eq(c[3]["combined_x"], T([[22, -44]], bf16))  # t0 = 9 (r2) + 13 (r3)
    # Each expert lives on one rank: the weights come back where idx >= 0, 0 where idx == -1.
    assert_eq(c[0]["combined_topk_weights"], T([[0.1, 0.2, 0.3], [0.4, 0, 0.6], [0.7, 0, 0]], f32))
    assert_eq(c[1]["combined_topk_weights"], T([[1.1, 1.2, 0], [0, 0, 0]], f32))
    assert_eq(c[2]["combined_topk_weights"], B_W[2])
    assert_eq(c[3]["combined_topk_weights"], B_W[3])
    assert ref.internode_combine(B_Y, o)[0]["combined_topk_weights"] is None  # result dicts work as handles


def test_b_2x2_combine_bias_hand():
    o = dispatch_b()
    b0 = [torch.full((len(x), 2), 0.5, dtype=bf16) for x in B_X]
    b1 = [torch.full((len(x), 2), 0.25, dtype=bf16) for x in B_X]
    c = ref.internode_combine(B_Y, o, biases=[(b0[0], b1[0]), b1[1], (None, b0[2]), None])
    assert_eq(c[0]["combined_x"], T([[17.75, -33.25], [4.75, -7.25], [11.75, -21.25]], bf16))
    assert_eq(c[1]["combined_x"], T([[9.25, -17.75], [0.25, 0.25]], bf16))  # a token sent nowhere: bias only
    assert_eq(c[2]["combined_x"], T([[17.5, -33.5], [11.5, -21.5]], bf16))
    assert_eq(c[3]["combined_x"], T([[22, -44]], bf16))


def test_b_2x2_cached_dispatch_reproduces_recv_x():
    o = dispatch_b()
    for x, c in zip(o, ref.internode_cached_dispatch(B_X, [x["handle"] for x in o])):
        assert_eq(c["recv_x"], x["recv_x"])
        assert c["recv_x_scales"] is None


def test_b_2x2_num_worst_tokens():
    o = dispatch_b(num_worst_tokens=6)
    for x in o:
        assert x["recv_x"].shape == (6, 2) and x["recv_topk_idx"].shape == (6, 3)
        assert x["recv_src_meta"].shape == (6, 8) and x["send_nvl_head"].shape == (6, 2)
        assert x["num_recv_tokens_per_expert_list"] == []
    assert_eq(o[1]["recv_x"], T([[3, 4], [11, 12], [0, 0], [0, 0], [0, 0], [0, 0]], bf16))
    assert_eq(o[1]["recv_topk_idx"], T([[0, -1, 1], [1, 0, -1]] + [[-1, -1, -1]] * 4, i64))
    assert_eq(o[1]["recv_topk_weights"], T([[0.4, 0, 0.6], [2.1, 2.2, 0]] + [[0, 0, 0]] * 4, f32))
    assert_eq(o[1]["recv_src_meta"], meta([(0, 2), (1, 2)] + [(0, 0)] * 4))
    check_fields(o[1], send_nvl_head=[[0, -1]] + [[-1, -1]] * 5, recv_gbl_rank_prefix_sum=[1, 1, 2, 2])
    assert (o[1]["num_recv"], o[1]["num_rdma_recv"]) == (2, 1)
    # Combine and cached dispatch read the counts from the prefix sums, not from the padded row counts.
    padded = [torch.cat([y, torch.full((6 - len(y), 2), 99, dtype=bf16)]) for y in B_Y]
    assert_eq(ref.internode_combine(padded, o)[0]["combined_x"], T([[17, -34], [4, -8], [11, -22]], bf16))
    cached = ref.internode_cached_dispatch(B_X, o)
    for x, c in zip(o, cached):
        assert_eq(c["recv_x"], x["recv_x"])  # same padded shape, same tail (zeros)
    with pytest.raises(ValueError, match="num_worst_tokens"):
        dispatch_b(num_worst_tokens=3)  # ranks 2 and 3 receive 4, rank 0 forwards 4


def test_num_worst_tokens_must_cover_forwarded_tokens():
    # 2 x 2: rank 0 sends t0, t1 to rank 2 and t2, t3 to rank 3: rank 2 forwards all 4 but receives 2.
    idx = [T([[4], [5], [6], [7]], i64)] + [torch.empty(0, 1, dtype=i64)] * 3
    xs = [torch.ones(4, 2, dtype=bf16)] + [torch.empty(0, 2, dtype=bf16)] * 3
    ws = [torch.ones(4, 1)] + [torch.empty(0, 1)] * 3
    o = ref.internode_dispatch(xs, idx, ws, 8, 1, 2)
    assert [x["num_recv"] for x in o] == [0, 0, 2, 2] and [x["num_rdma_recv"] for x in o] == [0, 0, 4, 0]
    check_fields(o[2], send_nvl_head=[[0, -1], [1, -1], [-1, 0], [-1, 1]])
    assert ref.internode_dispatch(xs, idx, ws, 8, 1, 2, num_worst_tokens=4)[2]["send_nvl_head"].shape == (4, 2)
    with pytest.raises(ValueError, match="forwards 4"):
        ref.internode_dispatch(xs, idx, ws, 8, 1, 2, num_worst_tokens=3)


# ----------------------------------------------------------------------------------------
# Case C: 4 nodes x 2 ranks (G=2), E=8 (rank r holds expert r), K=4, C=2; only ranks 0, 3, 5 have tokens
#   rank 0: t0 -> [0, 2, 4, 6] (local 0 of every node)   t1 -> [1, 3, -1, -1] (ranks 1, 3)
#   rank 3: t0 -> [7, 5, 6, -1] (ranks 7, 5, 6)           rank 5: t0 -> [-1, -1, -1, -1] (nowhere)
# ----------------------------------------------------------------------------------------
def case_c():
    K = 4
    xs, idx, ws = map(list, zip(*[empty_rank(K) for _ in range(8)]))
    xs[0], idx[0] = T([[1, 2], [3, 4]], bf16), T([[0, 2, 4, 6], [1, 3, -1, -1]], i64)
    xs[3], idx[3] = T([[5, 6]], bf16), T([[7, 5, 6, -1]], i64)
    xs[5], idx[5] = T([[7, 8]], bf16), T([[-1, -1, -1, -1]], i64)
    ws[0], ws[3], ws[5] = torch.full((2, K), 0.5), torch.full((1, K), 0.25), torch.ones(1, K)
    return xs, idx, ws


def test_c_4x2_token_spanning_every_node_hand():
    xs, idx, ws = case_c()
    o = ref.internode_dispatch(xs, idx, ws, 8, 2, 2)
    check_fields(
        o[0],
        rdma_channel_prefix_matrix=[[1, 2], [1, 2], [1, 1], [1, 1]],
        gbl_channel_prefix_matrix=[[1, 1], [0, 1], [1, 1], [0, 1], [1, 1], [0, 0], [1, 1], [0, 0]],
        send_rdma_head=[[0, 0, 0, 0], [0, 0, -1, -1]],
    )
    check_fields(o[3], rdma_channel_prefix_matrix=[[0, 0], [0, 0], [1, 1], [1, 1]], send_rdma_head=[[-1, -1, 0, 0]])
    check_fields(o[5], send_rdma_head=[[-1, -1, -1, -1]], rdma_channel_prefix_matrix=[[0, 0]] * 4)
    assert [x["num_recv"] for x in o] == [1, 1, 1, 1, 1, 1, 2, 1]
    assert [x["num_rdma_recv"] for x in o] == [2, 0, 2, 0, 1, 1, 1, 1]
    for r in (0, 2, 4, 6):  # each receives rank 0's t0 ...
        assert_eq(o[r]["recv_x"][:1], T([[1, 2]], bf16))
    assert_eq(o[6]["recv_x"], T([[1, 2], [5, 6]], bf16))  # ... rank 6 also rank 3's t0
    assert_eq(o[1]["recv_x"], T([[3, 4]], bf16))
    assert_eq(o[7]["recv_x"], T([[5, 6]], bf16))
    check_fields(
        o[6],
        recv_gbl_rank_prefix_sum=[1, 1, 1, 2, 2, 2, 2, 2],
        recv_gbl_channel_prefix_matrix=[[0, 1], [1, 1], [1, 1], [1, 2]] + [[2, 2]] * 4,
        recv_rdma_channel_prefix_matrix=[[1, 1], [0, 0], [0, 0], [0, 0]],
        recv_rdma_rank_prefix_sum=[1, 1, 1, 1],
        send_nvl_head=[[0, -1]],
    )
    check_fields(
        o[5],
        recv_gbl_rank_prefix_sum=[0, 0, 0, 1, 1, 1, 1, 1],
        recv_rdma_channel_prefix_matrix=[[0, 0], [1, 1], [0, 0], [0, 0]],
        recv_rdma_rank_prefix_sum=[0, 1, 1, 1],
        send_nvl_head=[[-1, 0]],
    )
    check_fields(o[7], recv_rdma_rank_prefix_sum=[0, 1, 1, 1], send_nvl_head=[[0, 0]])
    check_fields(o[0], recv_rdma_rank_prefix_sum=[2, 2, 2, 2], send_nvl_head=[[0, -1], [-1, 0]])
    check_fields(o[2], recv_rdma_rank_prefix_sum=[2, 2, 2, 2], send_nvl_head=[[0, -1], [-1, 0]])
    check_fields(o[1], recv_rdma_rank_prefix_sum=[0, 0, 0, 0])  # a forwarder with nothing to forward
    assert o[1]["send_nvl_head"].shape == (0, 2)
    assert_eq(o[6]["recv_src_meta"], meta([(0, 1), (1, 3)]))
    assert_eq(o[5]["recv_src_meta"], meta([(1, 2)]))
    assert_eq(o[3]["recv_src_meta"], meta([(0, 2)]))
    assert [x["num_recv_tokens_per_expert_list"] for x in o] == [[1]] * 6 + [[2], [1]]
    # Combine: every copy is its own node's partial except rank 3's t0 on node 3 (ranks 6 and 7).
    ys = [torch.full((x["num_recv"], 2), float(r + 1), dtype=bf16) for r, x in enumerate(o)]
    ys[6] = T([[7, 7], [70, 70]], bf16)
    c = ref.internode_combine(ys, o)
    assert_eq(c[0]["combined_x"], T([[1 + 3 + 5 + 7] * 2, [2 + 4] * 2], bf16))
    assert_eq(c[3]["combined_x"], T([[6 + 70 + 8] * 2], bf16))
    assert_eq(c[5]["combined_x"], T([[0, 0]], bf16))
    for x, cd in zip(o, ref.internode_cached_dispatch(xs, o)):
        assert_eq(cd["recv_x"], x["recv_x"])


# ----------------------------------------------------------------------------------------
# Case D: 2 nodes x 4 ranks (G=4), E=16 (rank r holds 2r, 2r+1), K=3, C=2: every token goes to node 1,
# node 0 receives nothing.
#   rank 0: t0 -> [8, 10, 15] ranks 4,5,7   t1 -> [9, -1, -1] rank 4      rank 2: t0 -> [-1, -1, -1]
#   rank 5: t0 -> [12, 13, 14] ranks 6,6,7  rank 6: t0 -> [-1, 11, 8] ranks 5, 4
# ----------------------------------------------------------------------------------------
def case_d():
    K = 3
    xs, idx, ws = map(list, zip(*[empty_rank(K) for _ in range(8)]))
    xs[0], idx[0] = T([[1, 1], [2, 2]], bf16), T([[8, 10, 15], [9, -1, -1]], i64)
    xs[2], idx[2] = T([[3, 3]], bf16), T([[-1, -1, -1]], i64)
    xs[5], idx[5] = T([[4, 4]], bf16), T([[12, 13, 14]], i64)
    xs[6], idx[6] = T([[5, 5]], bf16), T([[-1, 11, 8]], i64)
    for r in (0, 2, 5, 6):
        ws[r] = torch.full((len(xs[r]), K), 0.125 * (r + 1))
    return xs, idx, ws


def test_d_2x4_all_tokens_to_one_node_hand():
    xs, idx, ws = case_d()
    o = ref.internode_dispatch(xs, idx, ws, 16, 2, 4)
    for r in range(4):  # node 0 receives and forwards nothing
        assert o[r]["num_recv"] == 0 and o[r]["num_rdma_recv"] == 0
        assert o[r]["recv_x"].shape == (0, 2) and o[r]["recv_src_meta"].shape == (0, 8)
        assert o[r]["send_nvl_head"].shape == (0, 4)
        check_fields(o[r], recv_gbl_rank_prefix_sum=[0] * 8, recv_rdma_rank_prefix_sum=[0, 0])
        assert o[r]["num_recv_tokens_per_expert_list"] == [0, 0]
    check_fields(
        o[0],
        rdma_channel_prefix_matrix=[[0, 0], [1, 2]],
        send_rdma_head=[[-1, 0], [-1, 0]],
        gbl_channel_prefix_matrix=[[0, 0]] * 4 + [[1, 2], [1, 1], [0, 0], [1, 1]],
    )
    check_fields(o[2], rdma_channel_prefix_matrix=[[0, 0], [0, 0]], send_rdma_head=[[-1, -1]])
    assert_eq(o[4]["recv_x"], T([[1, 1], [2, 2], [5, 5]], bf16))
    assert_eq(o[5]["recv_x"], T([[1, 1], [5, 5]], bf16))
    assert_eq(o[6]["recv_x"], T([[4, 4]], bf16))
    assert_eq(o[7]["recv_x"], T([[1, 1], [4, 4]], bf16))
    check_fields(
        o[4],
        recv_gbl_rank_prefix_sum=[2, 2, 2, 2, 2, 2, 3, 3],
        recv_rdma_channel_prefix_matrix=[[1, 2], [0, 0]],
        recv_rdma_rank_prefix_sum=[2, 2],
        send_nvl_head=[[0, 0, -1, 0], [1, -1, -1, -1]],
    )
    check_fields(
        o[5],
        recv_gbl_rank_prefix_sum=[1, 1, 1, 1, 1, 1, 2, 2],
        recv_rdma_channel_prefix_matrix=[[0, 0], [1, 1]],
        recv_rdma_rank_prefix_sum=[0, 1],
        send_nvl_head=[[-1, -1, 0, 0]],
    )
    check_fields(
        o[6],
        recv_gbl_rank_prefix_sum=[0, 0, 0, 0, 0, 1, 1, 1],
        recv_rdma_rank_prefix_sum=[0, 1],
        send_nvl_head=[[0, 0, -1, -1]],
    )
    check_fields(o[7], recv_gbl_rank_prefix_sum=[1, 1, 1, 1, 1, 2, 2, 2], recv_rdma_rank_prefix_sum=[0, 0])
    assert_eq(o[4]["recv_src_meta"], meta([(0, 0b1011), (0, 0b0001), (1, 0b0011)]))
    assert_eq(o[6]["recv_src_meta"], meta([(1, 0b1100)]))
    assert_eq(o[7]["recv_src_meta"], meta([(0, 0b1011), (1, 0b1100)]))
    assert_eq(o[6]["recv_topk_idx"], T([[0, 1, -1]], i64))
    assert [x["num_recv_tokens_per_expert_list"] for x in o[4:]] == [[2, 1], [1, 1], [1, 1], [1, 1]]
    ys = [torch.full((x["num_recv"], 2), float(2**r), dtype=bf16) for r, x in enumerate(o)]
    c = ref.internode_combine(ys, o)
    assert_eq(c[0]["combined_x"], T([[16 + 32 + 128] * 2, [16] * 2], bf16))
    assert_eq(c[2]["combined_x"], T([[0, 0]], bf16))
    assert_eq(c[5]["combined_x"], T([[64 + 128] * 2], bf16))
    assert_eq(c[6]["combined_x"], T([[16 + 32] * 2], bf16))
    for x, cd in zip(o, ref.internode_cached_dispatch(xs, o)):
        assert_eq(cd["recv_x"], x["recv_x"])


def test_dispatch_without_topk_routes_by_is_token_in_rank():
    routes = [x["is_token_in_rank"] for x in dispatch_b()]
    o = ref.internode_dispatch(B_X, None, None, 8, 2, 2, is_token_in_ranks=routes)
    assert_eq(o[3]["recv_x"], T([[1, 2], [5, 6], [11, 12], [15, 16]], bf16))
    assert o[3]["recv_topk_idx"] is None and o[3]["num_recv_tokens_per_expert_list"] == []
    for want, got in zip(dispatch_b(), o):
        for name in ref.INTERNODE_HANDLE_FIELDS:
            assert_eq(got[name], want[name])


# ----------------------------------------------------------------------------------------
# FP8: data and scales travel verbatim; scales in any strides (column-major), f32 or UE8M0-packed int32
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["f32_column_major", "ue8m0"])
def test_fp8_dispatch_and_cached(kind):
    H = 512
    g = torch.Generator().manual_seed(11)
    fp8_xs = []
    for x in B_X:
        x = torch.randn(len(x), H, generator=g).bfloat16()
        if kind == "ue8m0":
            v, s = ref.per_token_cast_to_fp8(x, round_scale=True, use_ue8m0=True)
            assert s.dtype == i32 and s.shape[1] == H // 512
        else:
            v, s = ref.per_token_cast_to_fp8(x)
            s = s.t().contiguous().t()
            assert not s.is_contiguous() or s.shape[0] == 1
        fp8_xs.append((v, s))
    o = ref.internode_dispatch(fp8_xs, B_IDX, B_W, 8, 2, 2)
    bf = dispatch_b()
    cached = ref.internode_cached_dispatch(fp8_xs, o)
    # Receive order of case B, by hand: (source rank, token) per row.
    order = {
        0: [(0, 0), (1, 0), (2, 1)],
        1: [(0, 1), (2, 0)],
        2: [(0, 0), (1, 0), (2, 1), (3, 0)],
        3: [(0, 0), (0, 2), (2, 0), (3, 0)],
    }
    for me, rows in order.items():
        rx, rs = o[me]["recv_x"], o[me]["recv_x_scales"]
        assert rx.dtype == fp8 and rs.dtype == fp8_xs[0][1].dtype and rs.is_contiguous()
        assert rs.shape == (len(rows), fp8_xs[0][1].shape[1])
        for j, (s, t) in enumerate(rows):
            assert torch.equal(rx[j].view(u8), fp8_xs[s][0][t].view(u8))
            assert torch.equal(rs[j].view(i32), fp8_xs[s][1][t].view(i32))
        assert_eq(cached[me]["recv_x"].view(u8), rx.view(u8))
        assert_eq(cached[me]["recv_x_scales"], rs)
        assert_eq(o[me]["recv_topk_idx"], bf[me]["recv_topk_idx"])
        for name in ref.INTERNODE_HANDLE_FIELDS:
            assert_eq(o[me][name], bf[me][name])


# ----------------------------------------------------------------------------------------
# Layout: num_tokens_per_rdma_rank for a given node size
# ----------------------------------------------------------------------------------------
def test_layout_per_node_counts_hand():
    idx = T([[0, 5, 7], [2, -1, 3], [6, -1, -1], [-1, -1, -1]], i64)  # case B rank 0 plus a token to nowhere
    per_rank, per_node, per_expert, in_rank = ref.dispatch_layout(idx, 8, 4, num_ranks_per_node=2)
    assert_eq(per_rank, T([1, 1, 1, 2], i32))
    assert_eq(per_node, T([2, 2], i32))  # node 0: t0, t1; node 1: t0, t2
    assert_eq(ref.dispatch_layout(idx, 8, 4, 1)[1], T([1, 1, 1, 2], i32))  # G = 1: nodes are ranks
    assert ref.dispatch_layout(idx, 8, 4, 4)[1] is None  # one node of 4
    assert ref.dispatch_layout(idx, 8, 4)[1] is None  # DeepEP's default G = 8: R <= 8 is one node
    assert_eq(ref.dispatch_layout(idx, 16, 16)[1], T([3, 0], i32))  # R = 16, G = 8: experts 0..7 on node 0
    assert_eq(ref.dispatch_layout(idx, 16, 16, 2)[1], T([1, 1, 1, 2, 0, 0, 0, 0], i32))  # t0: n0 n2 n3; t1: n1; t2: n3
    with pytest.raises(ValueError, match="multiple of 3"):
        ref.dispatch_layout(idx, 8, 4, 3)
    for bad in (0, 9, 2.0):
        with pytest.raises(ValueError, match="num_ranks_per_node"):
            ref.dispatch_layout(idx, 8, 4, bad)


# ----------------------------------------------------------------------------------------
# Random routings vs an independent loop (layout logic, small tensors, up to 32 nodes)
# ----------------------------------------------------------------------------------------
def random_routing(seed, R, L, K, max_tokens, H=2):
    g = torch.Generator().manual_seed(seed)
    E = R * L
    xs, idxs, ws = [], [], []
    for r in range(R):
        n = int(torch.randint(0, max_tokens + 1, (1,), generator=g))
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)]) if n else torch.empty(0, K, dtype=i64)
        idx = torch.where(torch.rand(n, K, generator=g) < 0.25, torch.full_like(idx, -1), idx)
        idxs.append(idx)
        ws.append(torch.rand(n, K, generator=g))
        xs.append(torch.randint(-100, 100, (n, H), generator=g).bfloat16())
    return xs, idxs, ws, E


def loop_expected(idxs, R, G, L, C):
    """Every handle field and the receive order of every rank, with plain Python loops over lists."""
    NN = R // G
    routes = [[[any(e >= 0 and e // L == d for e in row) for d in range(R)] for row in idx.tolist()] for idx in idxs]
    hit = [[[any(rt[t][n * G + l] for l in range(G)) for n in range(NN)] for t in range(len(rt))] for rt in routes]
    chan = [[c for c, (b, e) in enumerate(ref.channel_ranges(len(rt), C)) for _ in range(b, e)] for rt in routes]

    def prefix_by_channel(flags, ch, x):
        return [sum(1 for t in range(len(flags)) if flags[t][x] and ch[t] <= c) for c in range(C)]

    out = []
    for me in range(R):
        m, j = divmod(me, G)
        rows = [(s, t) for s in range(R) for t in range(len(routes[s])) if routes[s][t][me]]
        per_src = [sum(1 for s, _ in rows if s == src) for src in range(R)]
        gbl_prefix = [sum(per_src[: src + 1]) for src in range(R)]
        fwd = [(n, t) for n in range(NN) for t in range(len(routes[n * G + j])) if hit[n * G + j][t][m]]
        fwd_prefix = [sum(1 for n, _ in fwd if n <= s) for s in range(NN)]
        nvl_head = []
        for n, t in fwd:
            src = n * G + j
            nvl_head.append(
                [
                    sum(routes[src][u][m * G + l] for u in range(t)) if routes[src][t][m * G + l] else -1
                    for l in range(G)
                ]
            )
        rdma_head = []
        for t in range(len(routes[me])):
            rdma_head.append(
                [
                    sum(hit[me][u][n] for u in range(t) if chan[me][u] == chan[me][t]) if hit[me][t][n] else -1
                    for n in range(NN)
                ]
            )
        out.append(
            {
                "rows": rows,
                "rdma_channel_prefix_matrix": [prefix_by_channel(hit[me], chan[me], n) for n in range(NN)],
                "gbl_channel_prefix_matrix": [prefix_by_channel(routes[me], chan[me], d) for d in range(R)],
                "recv_rdma_channel_prefix_matrix": [
                    prefix_by_channel(hit[s * G + j], chan[s * G + j], m) for s in range(NN)
                ],
                "recv_rdma_rank_prefix_sum": fwd_prefix,
                "recv_gbl_channel_prefix_matrix": [
                    [
                        (gbl_prefix[src - 1] if src else 0)
                        + (prefix_by_channel(routes[src], chan[src], me)[c - 1] if c else 0)
                        for c in range(C)
                    ]
                    for src in range(R)
                ],
                "recv_gbl_rank_prefix_sum": gbl_prefix,
                "meta": [(s // G, sum(routes[s][t][m * G + l] << l for l in range(G))) for s, t in rows],
                "send_rdma_head": rdma_head,
                "send_nvl_head": nvl_head,
                "num_tokens_per_rdma_rank": [sum(hit[me][t][n] for t in range(len(routes[me]))) for n in range(NN)],
            }
        )
    return out


def as_list(t):
    return t.tolist()


SHAPES = [
    (2, 1, 2, 3),
    (2, 8, 1, 6),
    (3, 2, 2, 3),
    (4, 2, 1, 4),
    (2, 4, 2, 3),
    (8, 2, 1, 2),
    (16, 1, 2, 2),
    (32, 1, 1, 3),
    (32, 2, 1, 2),
    (32, 8, 1, 2),
]


@pytest.mark.parametrize("N,G,L,C", SHAPES)
def test_random_routing_vs_loop(N, G, L, C):
    R = N * G
    xs, idxs, ws, E = random_routing(100 * N + G, R, L, K=4, max_tokens=5)
    o = ref.internode_dispatch(xs, idxs, ws, E, C, G)
    want = loop_expected(idxs, R, G, L, C)
    for me in range(R):
        w, x = want[me], o[me]
        assert x["num_recv"] == len(w["rows"]) and x["num_rdma_recv"] == len(w["send_nvl_head"])
        for j, (s, t) in enumerate(w["rows"]):
            assert torch.equal(x["recv_x"][j], xs[s][t])
        for name in (
            "rdma_channel_prefix_matrix",
            "gbl_channel_prefix_matrix",
            "recv_rdma_channel_prefix_matrix",
            "recv_rdma_rank_prefix_sum",
            "recv_gbl_channel_prefix_matrix",
            "recv_gbl_rank_prefix_sum",
        ):
            assert as_list(x[name]) == w[name], name
        assert as_list(x["send_rdma_head"]) == (w["send_rdma_head"] or [])
        assert as_list(x["send_nvl_head"]) == w["send_nvl_head"]
        node, mask = ref.decode_source_meta(x["recv_src_meta"])
        assert list(zip(node.tolist(), mask.tolist())) == w["meta"]
        assert all(mk >> (me % G) & 1 for _, mk in w["meta"])  # I am in the mask of every row I receive
        per_node = ref.dispatch_layout(idxs[me], E, R, G)[1]
        assert as_list(per_node) == w["num_tokens_per_rdma_rank"]
        assert as_list(x["rdma_channel_prefix_matrix"][:, -1]) == w["num_tokens_per_rdma_rank"]
    # Conservation: rows received = (token, rank) copies; rows forwarded = (token, node) copies.
    assert sum(x["num_recv"] for x in o) == sum(int(x["is_token_in_rank"].sum()) for x in o)
    assert sum(x["num_rdma_recv"] for x in o) == sum(int(x["rdma_channel_prefix_matrix"][:, -1].sum()) for x in o)
    for x, c in zip(o, ref.internode_cached_dispatch(xs, o)):
        assert_eq(c["recv_x"], x["recv_x"])


@pytest.mark.parametrize("N,G", [(2, 2), (4, 2), (2, 4), (3, 1)])
def test_random_combine_vs_loop(N, G):
    """Combine against a loop that sums, per token, node by node in f32 with a bf16 rounding per node."""
    R = N * G
    xs, idxs, ws, E = random_routing(7 + R, R, L=2, K=4, max_tokens=6, H=16)
    o = ref.internode_dispatch(xs, idxs, ws, E, 2, G)
    g = torch.Generator().manual_seed(5)
    palette = T([2.0**9, -(2.0**9), 1.0, 3.0, -0.5, 2.0**-3], bf16)  # order- and rounding-sensitive sums

    def pick(n):
        return palette[torch.randint(0, len(palette), (n, 16), generator=g)]

    ys = [pick(x["num_recv"]) for x in o]
    tws = [torch.rand(x["num_recv"], 4, generator=g) for x in o]
    biases = [(pick(len(x)), pick(len(x))) if r % 2 == 0 else pick(len(x)) for r, x in enumerate(xs)]
    res = ref.internode_combine(ys, o, topk_weights=tws, biases=biases)
    want = loop_expected(idxs, R, G, 2, 2)
    where = [{st: j for j, st in enumerate(w["rows"])} for w in want]  # (source, token) -> row, per rank
    differs_from_flat = 0
    for me in range(R):
        b = biases[me] if isinstance(biases[me], tuple) else (torch.zeros(len(xs[me]), 16, dtype=bf16), biases[me])
        for t in range(len(xs[me])):
            acc = b[0][t].float() + b[1][t].float()
            flat = b[0][t].float() + b[1][t].float()
            wacc = torch.zeros(4)
            for n in range(N):
                dests = [n * G + l for l in range(G) if (me, t) in where[n * G + l]]
                if not dests:
                    continue
                part, wpart = torch.zeros(16), torch.zeros(4)
                for d in dests:
                    part = part + ys[d][where[d][(me, t)]].float()
                    flat = flat + ys[d][where[d][(me, t)]].float()
                    wpart = wpart + tws[d][where[d][(me, t)]]
                acc = acc + part.to(bf16).float()
                wacc = wacc + wpart
            assert torch.equal(res[me]["combined_x"][t], acc.to(bf16))
            assert torch.equal(res[me]["combined_topk_weights"][t], wacc)
            differs_from_flat += int((acc.to(bf16) != flat.to(bf16)).sum())
    if G > 1:
        assert differs_from_flat > 0  # the two-level rounding really is pinned, not a flat sum


# ----------------------------------------------------------------------------------------
# Cross-checks with the intranode reference and the two-level rounding
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("R", [2, 4, 8])
def test_one_node_equals_intranode(R):
    xs, idxs, ws, E = random_routing(40 + R, R, L=2, K=3, max_tokens=7, H=8)
    inter = ref.internode_dispatch(xs, idxs, ws, E, 3, R, expert_alignment=2)
    intra = ref.intranode_dispatch(xs, idxs, ws, E, 3, expert_alignment=2)
    for me in range(R):
        a, b = inter[me], intra[me]
        for key in ("recv_x", "recv_topk_idx", "recv_topk_weights", "is_token_in_rank"):
            assert_eq(a[key], b[key])
        assert a["num_recv_tokens_per_expert_list"] == b["num_recv_tokens_per_expert_list"]
        assert_eq(a["recv_gbl_rank_prefix_sum"], b["rank_prefix_matrix"][:, me].contiguous())
        assert_eq(a["gbl_channel_prefix_matrix"], b["channel_prefix_matrix"])
        base = torch.cat([T([0], i32), b["rank_prefix_matrix"][:-1, me]]).unsqueeze(1)
        assert_eq(a["recv_gbl_channel_prefix_matrix"], b["recv_channel_prefix_matrix"] + base)
        # One node: I forward my own sent tokens, and send_nvl_head is intranode's send_pos of those tokens.
        sent = b["is_token_in_rank"].any(dim=1)
        assert_eq(a["send_nvl_head"], b["send_pos"][sent])
        assert_eq(ref.decode_source_meta(a["recv_src_meta"])[0], torch.zeros(b["num_recv"], dtype=i32))
    ys = [x["recv_x"] for x in inter]
    c_inter = ref.internode_combine(ys, inter)
    c_intra = ref.intranode_combine(ys, intra)
    for a, b in zip(c_inter, c_intra):  # without bias one node is one bf16 rounding: the same as intranode
        assert_eq(a["combined_x"], b["combined_x"])


def test_one_node_with_bias_rounds_twice():
    # 2 ranks on one node, one token to both: x = 1 + 2^-8 from the two ranks' rows, bias 2^-8.
    idx = [T([[0, 1]], i64), torch.empty(0, 2, dtype=i64)]
    xs = [torch.zeros(1, 1, dtype=bf16), torch.empty(0, 1, dtype=bf16)]
    ws = [torch.ones(1, 2), torch.empty(0, 2)]
    inter = ref.internode_dispatch(xs, idx, ws, 2, 1, 2)
    intra = ref.intranode_dispatch(xs, idx, ws, 2, 1)
    ys = [T([[1.0]], bf16), T([[2.0**-8]], bf16)]
    bias = [T([[2.0**-8]], bf16), None]
    # intranode: bf16(2^-8 + 1 + 2^-8) = bf16(1 + 2^-7) = 1 + 2^-7
    assert ref.intranode_combine(ys, intra, biases=bias)[0]["combined_x"].item() == 1 + 2**-7
    # internode: the node partial bf16(1 + 2^-8) ties to even = 1, then bf16(2^-8 + 1) = 1
    assert ref.internode_combine(ys, inter, biases=bias)[0]["combined_x"].item() == 1.0


def test_two_level_rounding_differs_from_single_sum():
    # 2 nodes x 2: rank 0's token goes to ranks 0, 1 (node 0) and 2 (node 1); the rows there are 1, 2^-8, 2^-8.
    idx = [T([[0, 1, 2]], i64)] + [torch.empty(0, 3, dtype=i64)] * 3
    xs = [torch.zeros(1, 1, dtype=bf16)] + [torch.empty(0, 1, dtype=bf16)] * 3
    ws = [torch.ones(1, 3)] + [torch.empty(0, 3)] * 3
    o = ref.internode_dispatch(xs, idx, ws, 4, 1, 2)
    ys = [T([[1.0]], bf16), T([[2.0**-8]], bf16), T([[2.0**-8]], bf16), torch.empty(0, 1, dtype=bf16)]
    single = (torch.zeros(1) + 1.0 + 2.0**-8 + 2.0**-8).to(bf16)  # one f32 sum, one rounding
    assert single.item() == 1 + 2**-7
    # node 0: bf16(1 + 2^-8) = 1 (tie to even); + node 1's 2^-8 = 1 + 2^-8 -> bf16 = 1
    assert ref.internode_combine(ys, o)[0]["combined_x"].item() == 1.0
    # The same routing on one node of 4 is the single sum.
    assert ref.intranode_combine(ys, ref.intranode_dispatch(xs, idx, ws, 4, 1))[0]["combined_x"].item() == 1 + 2**-7


@pytest.mark.parametrize("N", [2, 4])
def test_one_rank_per_node_equals_single_sum(N):
    """G = 1: each node partial is one bf16 row (exact), so the combine is intranode's single f32 sum, bias
    included, bit for bit; dispatch order and rows match intranode too."""
    xs, idxs, ws, E = random_routing(60 + N, N, L=2, K=3, max_tokens=7, H=16)
    inter = ref.internode_dispatch(xs, idxs, ws, E, 2, 1)
    intra = ref.intranode_dispatch(xs, idxs, ws, E, 2)
    g = torch.Generator().manual_seed(N)
    palette = T([2.0**30, -(2.0**30), 1.0, 3.0, -0.5], bf16)

    def pick(n):
        return palette[torch.randint(0, len(palette), (n, 16), generator=g)]

    for a, b in zip(inter, intra):
        assert_eq(a["recv_x"], b["recv_x"])
    ys = [pick(x["num_recv"]) for x in inter]
    biases = [(pick(len(x)), pick(len(x))) for x in xs]
    for a, b in zip(ref.internode_combine(ys, inter, biases=biases), ref.intranode_combine(ys, intra, biases=biases)):
        assert_eq(a["combined_x"], b["combined_x"])


# ----------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------
def test_errors():
    with pytest.raises(ValueError, match="multiple of num_ranks_per_node"):
        ref.internode_dispatch(B_X[:3], B_IDX[:3], B_W[:3], 6, 2, 2)
    with pytest.raises(ValueError, match="num_ranks_per_node"):
        ref.internode_dispatch(B_X, B_IDX, B_W, 8, 2, 16)
    with pytest.raises(ValueError, match="divisible"):
        ref.internode_dispatch(B_X, B_IDX, B_W, 6, 2, 2)
    with pytest.raises(ValueError, match="topk_weights"):
        ref.internode_dispatch(B_X, B_IDX, [B_W[0][:1]] + B_W[1:], 8, 2, 2)
    with pytest.raises(ValueError, match="is_token_in_ranks"):
        ref.internode_dispatch(B_X, None, None, 8, 2, 2)
    o = dispatch_b()
    with pytest.raises(ValueError, match="rows"):
        ref.internode_combine([B_Y[0][:2]] + B_Y[1:], o)
    with pytest.raises(ValueError, match="shape"):
        ref.internode_combine(B_Y, o, biases=[torch.zeros(2, 2, dtype=bf16), None, None, None])
    with pytest.raises(ValueError, match="one x per handle"):
        ref.internode_cached_dispatch(B_X[:3], o)
    with pytest.raises(ValueError, match="10-tuple"):
        ref.internode_combine(B_Y, [x["handle"][:6] for x in o])
    broken = [list(x["handle"]) for x in o]
    broken[2][9] = torch.full_like(broken[2][9], -1)  # rank 2 forgets where it forwarded
    with pytest.raises(ValueError, match="chain"):
        ref.internode_cached_dispatch(B_X, [tuple(h) for h in broken])


def test_the_per_expert_list_comes_without_topk_too():
    """DeepEP's tests/test_internode.py checks num_recv_tokens_per_expert_list in its first case, which has no
    top-k: the list comes from the num_tokens_per_expert each rank passes, with or without topk_idx (issue 24)."""
    o = dispatch_b()
    routes = [x["is_token_in_rank"] for x in o]
    counts = [torch.arange(8, dtype=torch.int32) + r for r in range(4)]  # what each rank passes, by hand
    got = ref.internode_dispatch(B_X, None, None, 8, 2, 2, is_token_in_ranks=routes, num_tokens_per_experts=counts)
    for me in range(4):  # local experts me*2, me*2+1: sum over sources r of (e + r)
        e0 = 2 * me
        assert got[me]["num_recv_tokens_per_expert_list"] == [4 * e0 + 6, 4 * (e0 + 1) + 6]
    aligned = ref.internode_dispatch(
        B_X, None, None, 8, 2, 2, expert_alignment=4, is_token_in_ranks=routes, num_tokens_per_experts=counts
    )
    assert aligned[0]["num_recv_tokens_per_expert_list"] == [8, 12]  # 6 -> 8, 10 -> 12
    with pytest.raises(ValueError, match="one entry per rank"):
        ref.internode_dispatch(B_X, None, None, 8, 2, 2, is_token_in_ranks=routes, num_tokens_per_experts=counts[:3])
