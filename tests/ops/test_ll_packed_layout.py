"""The packed LL layout on the host (EP_RT_LL_PACKED=1, the LL cubins' packed variants): ll_layout's packed sizes and
offsets against the CPU model (tools/ll_packed_model.py, written apart) and against DeepEP V1's own formula over a
grid of shapes, the kernel source's slot arithmetic against the model's, and the op's checks (buffer size, top-k,
the handle's src_info plane) with the messages a user reads."""

import re

import pytest
import torch

from ep_rt import Buffer
from ep_rt.errors import BufferTooSmallError
from ep_rt.ops import low_latency as ll_op
from ep_rt.transport import ll_layout

from ..repo import REPO, load_tool

SHAPES = [
    (T, H, R, E)
    for T in (1, 7, 128, 256, 1024)
    for H in (128, 384, 512, 2048, 4096, 5120, 7168, 16384)
    for R, E in (
        (1, 8),
        (2, 8),
        (2, 288),
        (3, 48),
        (4, 16),
        (6, 36),
        (8, 64),
        (8, 256),
        (8, 288),
        (12, 96),
        (16, 288),
        (64, 256),
        (160, 320),
        (256, 256),
        (256, 1024),
    )
]


def _model():
    return load_tool("ll_packed_model.py", "ll_packed_model")


def deepep_ll_hint(T, H, R, E):
    """DeepEP V1's get_low_latency_rdma_size_hint (shared/docs/deepep-v1-reference.md §2.7), written out here."""
    S = H // 128
    dispatch_msg, combine_msg = 16 + max(2 * H, H + 4 * S), 4 * S + 2 * H
    send = max(T * dispatch_msg, E * T * combine_msg)
    recv = max(E * T * dispatch_msg, E * T * combine_msg)
    signal = (E * 4 + 127) // 128 * 128
    return (2 * (signal + send + recv) + 128) // 128 * 128


@pytest.mark.parametrize("T,H,R,E", SHAPES)
def test_packed_sizes_are_the_models_and_never_above_deepeps_hint(T, H, R, E):
    model = _model()
    _, _, send, recv = model.buffer_bytes(T, H, R, E)
    assert ll_layout.packed_data_bytes(T, H, R, E) == (send, recv)
    hint = ll_layout.rdma_size_hint(T, H, R, E, packed=True)
    assert hint == model.packed_num_rdma_bytes(T, H, R, E)
    # DeepEP's own formula where ep_rt's messages are DeepEP's size (hidden % 512 == 0: every model's); else ep_rt's
    # default layout, whose combine slots are 16-byte aligned (ll_layout.combine_msg_bytes)
    assert hint <= (deepep_ll_hint(T, H, R, E) if H % 512 == 0 else ll_layout.rdma_size_hint(T, H, R, E)), (T, H, R, E)
    offsets = ll_layout.buffer_offsets(T, H, E, hint, True, R)
    assert offsets["need"] <= offsets["half"]  # a Buffer sized by the hint takes the call
    assert offsets["recv"] == (0, offsets["half"]) and offsets["send"][0] % 16 == 0
    assert offsets["send"][0] >= recv and offsets["send"][0] + send <= offsets["half"]
    # One byte less and the call no longer fits: the hint is the least that works.
    smaller = ll_layout.buffer_offsets(T, H, E, hint - 256, True, R)
    assert smaller["need"] > smaller["half"]


def test_packed_saves_half_at_small_ep_and_little_from_ep64():
    ratio = {
        (R, E): ll_layout.rdma_size_hint(128, 7168, R, E, packed=True) / deepep_ll_hint(128, 7168, R, E)
        for R, E in ((2, 288), (8, 288), (64, 256))
    }
    assert ratio[(2, 288)] < 0.56 and ratio[(8, 288)] < 0.73 and 0.98 < ratio[(64, 256)] <= 1.0


def test_packed_offsets_need_the_rank_count():
    with pytest.raises(ValueError, match="needs num_ranks"):
        ll_layout.buffer_offsets(128, 7168, 288, 1 << 30, True)
    with pytest.raises(ValueError, match="multiple of num_ranks"):
        ll_layout.rdma_size_hint(128, 7168, 7, 288, packed=True)


def _kernel():
    return re.sub(r"//[^\n]*", "", (REPO / "kernels_src" / "low_latency.cu").read_text())


def test_the_kernels_slot_arithmetic_is_the_models():
    """The packed kernel's block (T x min(16, L) slots per source), its combine slots (t x min(16, E) + k) and its
    staged copies per choice, in every place it computes them (a changed expression fails here, and then the model
    and ll_layout must change with it)."""
    code = _kernel()
    assert code.count("int64_t(p.max_tokens) * min(EP_RT_LL_MAX_TOPK, ll.L)") == 2  # dispatch send and receive
    assert code.count("min(EP_RT_LL_MAX_TOPK, p.num_experts)") == 3  # dispatch staging, combine send and receive
    assert "(int64_t(me) * block_slots + pos) * p.msg_bytes" in code  # the sender's slot in its block
    assert "(int64_t(c % R) * block_slots + cell_base[first] + i) * p.msg_bytes" in code  # the receiver's
    assert "(t * stride + k) * p.msg_bytes" in code and "(t * stride + kk) * p.msg_bytes" in code
    assert "(t * min(EP_RT_LL_MAX_TOPK, p.num_experts) + k) * p.msg_bytes" in code  # combine receive
    assert "if (i == 0) v.y = k;" in code and "if (i == 0) v.y = kk;" in code  # k in header word 1, both paths
    # the receiver rebuilds a cell's start from the counts: source s's messages to the lower local experts m < l,
    # summed per cell of a batch (its first message in the run holds it)
    assert "for (int m = lane; m < l; m += kWarpSize) sum += cell_count(m * R + s);" in code
    assert "const int c = batch.cell[q], l = c / R, s = c % R;" in code
    # the sender's, up to kShareTileCells experts: its own choices of the experts from the first of the cell's rank
    # (lower = expert / L * L) up to the cell's, from one histogram per block; with more, counted per token
    assert "for (int64_t v = lower[warp] + lane; v < e; v += kWarpSize) sum += hist[v];" in code
    assert "lower[threadIdx.x] = expert[threadIdx.x] / ll.L * ll.L" in code
    assert "const bool by_hist = p.num_experts <= kShareTileCells && K <= num_warps;" in code
    assert "c += v >= 0 && v >= lo && v < e;" in code  # count_packed_positions: the lower experts of e's rank


def test_packed_staging_is_written_after_the_credit_check():
    """A staged copy may still be the source of the previous call's puts on this buffer until every peer's credit
    says it arrived (NETWORK.md: a put's source is reusable after completion, which the credit evidences): in the
    packed build the staging loop comes after wait_buffer_free."""
    code = _kernel()
    packed = code[code.index("count_packed_positions(topk, p.num_tokens") :]
    assert packed.index("wait_buffer_free(ll, credit)") < packed.index("(t * stride + kk) * p.msg_bytes")


def _op(num_rdma_bytes, R=8, packed=True):
    """The op's host checks without a GPU (object.__new__, as the other CPU tests of the op)."""
    op = object.__new__(ll_op.LowLatencyOp)
    op.num_rdma_bytes, op.num_ranks, op.packed = num_rdma_bytes, R, packed
    return op


def test_a_packed_buffer_below_the_packed_hint_names_it():
    need = ll_layout.rdma_size_hint(128, 7168, 8, 288, packed=True)
    _op(need)._offsets(128, 7168, 288)
    with pytest.raises(BufferTooSmallError, match=rf"packed layout, EP_RT_LL_PACKED=1\) num_rdma_bytes >= {need}"):
        _op(need - 256)._offsets(128, 7168, 288)
    # the default layout of the same Buffer needs DeepEP's size
    with pytest.raises(BufferTooSmallError, match=rf"num_rdma_bytes >= {ll_layout.rdma_size_hint(128, 7168, 8, 288)}"):
        _op(need, packed=False)._offsets(128, 7168, 288)


def test_packed_top_k_at_most_the_expert_count():
    ll_op.LowLatencyOp.check_packed_topk(8, 8)
    ll_op.LowLatencyOp.check_packed_topk(16, 288)
    with pytest.raises(ValueError, match=r"top-k \(9\) must be at most the number of experts \(8\)"):
        ll_op.LowLatencyOp.check_packed_topk(9, 8)


def test_the_combine_needs_the_dispatchs_own_src_info_view():
    L, RT = 3, 16
    both = torch.zeros(2, L, RT, dtype=torch.int32)
    ll_op.check_packed_src_info(both[0], L, RT)
    for bad, why in (
        (both[0].clone(), "base None"),
        (torch.zeros(L, RT, dtype=torch.int32), "base None"),
        (both[1], "with base"),  # plane 1 is not the handle's tensor
        (torch.zeros(2, L, RT + 1, dtype=torch.int32)[0, :, :RT], "with base"),
    ):
        with pytest.raises(ValueError, match=rf"EP_RT_LL_PACKED=1.*{why}.*Pass the handle the dispatch returned"):
            ll_op.check_packed_src_info(bad, L, RT)


def test_the_size_hint_follows_the_knob(monkeypatch):
    monkeypatch.delenv("EP_RT_LL_PACKED", raising=False)
    assert Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 288) == deepep_ll_hint(128, 7168, 8, 288)
    monkeypatch.setenv("EP_RT_LL_PACKED", "1")
    assert Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 288) == ll_layout.rdma_size_hint(
        128, 7168, 8, 288, packed=True
    )


def test_default_staging_is_written_after_the_credit_check():
    """The same rule for the default build (the #else branch): its staged copy of a token follows the block's
    credit check (before 2026-12-07's rebuild it preceded it for a block's first token: docs/INTERNODE_DESIGN.md,
    'Evidence of receipt')."""
    code = _kernel()
    default = code[code.index("count_earlier_choices(topk, t * K, expert, before, K);\n        if (!free_checked)") :]
    assert default.index("wait_buffer_free(ll, credit)") < default.index(
        "reinterpret_cast<int4*>(staged)[i] = message[i]"
    )
