"""CPU tests of the low-latency argument checks (they run before any kernel), with a stand-in for the GPU side."""

import pytest
import torch

from ep_rt.runtime import abi as params
from ep_rt.transport import ll_layout
from ep_rt.ops.low_latency import LowLatencyOp

R, T, H, E = 2, 8, 256, 8


def op():
    from ep_rt.transport.error_record import ErrorRecords

    o = object.__new__(LowLatencyOp)
    o.num_ranks, o.device, o.errors = R, torch.device("cpu"), ErrorRecords(mapped=False)
    o.num_rdma_bytes = 1 << 30
    return o


def x(n=4, h=H, dtype=torch.bfloat16):
    return torch.zeros(n, h, dtype=dtype)


def idx(n=4, k=2):
    return torch.zeros(n, k, dtype=torch.int64)


@pytest.mark.parametrize(
    "args,error,match",
    [
        ((x(dtype=torch.float32), idx(), T, E), TypeError, "bfloat16"),
        ((x(h=200), idx(), T, E), ValueError, "multiple of 128"),
        ((x(h=16384 + 128), idx(), T, E), ValueError, "16384"),
        ((x(), idx(), 0, E), ValueError, "num_max_dispatch_tokens_per_rank"),
        ((x(), idx(), 1025, E), ValueError, "num_max_dispatch_tokens_per_rank"),
        ((x(n=9), idx(n=9), T, E), ValueError, "more than"),
        ((x(), idx(), T, 7), ValueError, "multiple of 2"),
        ((x(), idx().short(), T, E), TypeError, "dtypes"),
        ((x(), idx(n=3), T, E), ValueError, "rows"),
        ((x(), idx(k=17), T, E), ValueError, "at most 16"),
    ],
)
def test_dispatch_argument_errors(args, error, match):
    with pytest.raises(error, match=match):
        op()._check(*args)


def test_ue8m0_rules():
    o = op()
    with pytest.raises(ValueError, match="round_scale"):
        o.dispatch(x(), idx(), T, E, None, None, True, False, True, None)
    with pytest.raises(ValueError, match="multiple of 512"):
        o.dispatch(x(h=384), idx(), T, E, None, None, True, True, True, None)


def test_stats_shapes():
    with pytest.raises(ValueError, match="rows"):
        op().dispatch(x(), idx(), T, E, torch.zeros(3, dtype=torch.int32), None, True, False, False, None)
    with pytest.raises(TypeError, match="int64"):
        op().dispatch(x(), idx(), T, E, None, torch.zeros(R, dtype=torch.int32), True, False, False, None)


def test_combine_argument_errors():
    o = op()
    L = E // R
    good = dict(
        x=torch.zeros(L, R * T, H, dtype=torch.bfloat16),
        topk_idx=idx(),
        topk_weights=torch.zeros(4, 2),
        src_info=torch.zeros(L, R * T, dtype=torch.int32),
        layout_range=torch.zeros(L, R, dtype=torch.int64),
        T=T,
        hidden=H,
        num_experts=E,
        out=None,
        wait_stats=None,
        zero_copy=False,
        use_logfmt=False,
        stream=None,
    )
    for change, error, match in (
        (dict(x=torch.zeros(L, R * T, H + 128, dtype=torch.bfloat16)), ValueError, "must be"),
        (dict(topk_weights=torch.zeros(4, 3)), ValueError, "shape of topk_idx"),
        (dict(topk_weights=torch.zeros(4, 2).double()), TypeError, "float32"),
        (dict(out=torch.zeros(4, H + 1, dtype=torch.bfloat16)), ValueError, "out must be"),
        (dict(layout_range=torch.zeros(L, R, dtype=torch.int32)), TypeError, "int64"),
    ):
        with pytest.raises(error, match=match):
            o.combine(**{**good, **change})


def test_logfmt_with_zero_copy_is_refused():
    """As DeepEP: zero_copy rows already sit in the send buffer as bf16, LogFMT encodes rows on the way out."""
    from types import SimpleNamespace

    from ep_rt import Buffer

    buf = object.__new__(Buffer)
    buf.destroyed = False
    buf._ll = SimpleNamespace(raise_if_failed=lambda: None)
    L = E // R
    handle = (torch.zeros(L, R * T, dtype=torch.int32), torch.zeros(L, R, dtype=torch.int64), T, H, E)
    with pytest.raises(ValueError, match="use_logfmt and zero_copy"):
        buf.low_latency_combine(
            torch.zeros(L, R * T, H, dtype=torch.bfloat16),
            idx(),
            torch.zeros(4, 2),
            handle,
            use_logfmt=True,
            zero_copy=True,
        )
    buf.destroyed = True  # keeps __del__ quiet


def test_buffer_too_small_names_the_hint():
    o = op()
    o.num_rdma_bytes = 1 << 20
    with pytest.raises(Exception, match="get_low_latency_rdma_size_hint"):
        o._common(
            params.LowLatencyParams(),
            128,
            7168,
            288,
            ll_layout.dispatch_msg_bytes(7168),
            combine=False,
            message_format=1,
        )


def test_layout_offsets_fit_the_hint():
    """With num_rdma_bytes from the hint, every shape up to it fits one half; the halves never overlap, and the
    control area starts after num_rdma_bytes (so the hint is DeepEP's)."""
    for T_, H_, E_ in ((128, 7168, 288), (1024, 1024, 32), (32, 16384, 32), (64, 1152, 16), (1, 128, 2)):
        hint = ll_layout.rdma_size_hint(T_, H_, R, E_)
        offsets = ll_layout.buffer_offsets(T_, H_, E_, hint)
        assert offsets["need"] <= offsets["half"] and 2 * offsets["half"] <= hint
        assert offsets["recv"][0] % 128 == 0 and offsets["recv"][1] % 128 == 0
        assert offsets["send"][0] + (offsets["need"] - offsets["send"][0]) <= offsets["half"]
        for smaller in ((T_ // 2 or 1, H_, E_), (T_, max(128, H_ // 2), E_), (T_, H_, max(R, E_ // 2))):
            o = ll_layout.buffer_offsets(*smaller, hint)
            assert o["need"] <= o["half"] and o["half"] == offsets["half"]  # the halves do not move with the shape
        assert ll_layout.combine_msg_bytes(H_) % 16 == 0 and ll_layout.dispatch_msg_bytes(H_) % 16 == 0
        ctrl = ll_layout.control_offsets(hint, R)
        assert ctrl["credit"] >= hint and ctrl["count_signal"][0] >= ctrl["credit"] + 2 * R * 4
        assert ctrl["combine_flag"][0] >= ctrl["count_signal"][1] + 8 * ll_layout.MAX_SIGNALS
        assert ctrl["barrier"] >= ctrl["combine_flag"][1] + 8 * ll_layout.MAX_SIGNALS
        assert ctrl["end"] >= ctrl["barrier"] + 8 * R


def test_shape_digest_tells_shapes_apart():
    seen = {
        ll_layout.shape_digest(T_, H_, E_, f)
        for T_ in (1, 64, 128, 129)
        for H_ in (1024, 7168, 7296)
        for E_ in (16, 256, 288)
        for f in range(4)
    }
    assert len(seen) == 4 * 3 * 3 * 4 and all(0 <= d < 1 << 16 for d in seen)
    assert ll_layout.shape_digest(128, 7168, 288, 1) == ll_layout.shape_digest(128, 7168, 288, 1)


def test_hint_is_deepeps_formula():
    def deepep(T_, H_, R_, E_):  # DeepEP V1 LowLatencyLayout (combine messages padded to 16 bytes, ll_layout)
        msg_d = 16 + max(2 * H_, H_ + 4 * (H_ // 128))
        msg_c = (2 * H_ + 4 * (H_ // 128) + 15) // 16 * 16
        send = max(T_ * msg_d, E_ * T_ * msg_c)
        recv = max(E_ * T_ * msg_d, E_ * T_ * msg_c)
        signal = (E_ * 4 + 127) // 128 * 128
        return (2 * (signal + send + recv) + 128) // 128 * 128

    for args in ((128, 7168, 16, 288), (256, 4096, 8, 64), (1, 128, 2, 2)):
        assert ll_layout.rdma_size_hint(*args) == deepep(*args)


@pytest.mark.parametrize(
    "bad", [(0, 7168, 2, 16), (128, 7168, -2, 16), (128, 7168, 2, 0), (128, 100, 2, 16), (128.0, 7168, 2, 16)]
)
def test_hint_refuses_bad_arguments(bad):
    with pytest.raises(ValueError):
        ll_layout.rdma_size_hint(*bad)


def test_fp8_dispatch_slots_are_line_aligned_and_fit_deepep_slots():
    for H_ in range(128, 16384 + 1, 128):
        fp8 = ll_layout.dispatch_slot_bytes(H_, True)
        assert fp8 % 128 == 0 and 16 + H_ + 4 * (H_ // 128) <= fp8 <= ll_layout.dispatch_msg_bytes(H_)
        assert ll_layout.dispatch_slot_bytes(H_, False) == ll_layout.dispatch_msg_bytes(H_)
    assert ll_layout.dispatch_slot_bytes(7168, True) == 7424  # 16 + 7168 + 224 = 7408, rounded up to 128


def test_bf16_combine_slots_are_the_row_and_logfmt_slots_keep_the_metadata():
    for H_ in range(128, 16384 + 1, 128):
        assert ll_layout.combine_slot_bytes(H_, False) == 2 * H_ <= ll_layout.combine_msg_bytes(H_)
        assert ll_layout.combine_slot_bytes(H_, True) == ll_layout.combine_msg_bytes(H_)
    assert ll_layout.combine_slot_bytes(7168, True) == 14336 + 224


def test_the_readme_states_the_ll_control_area_size():
    """README's "4 MiB" for the LL control area after num_rdma_bytes, from ll_layout for 2 to 256 ranks."""
    from ep_rt.transport import ll_layout

    from ..repo import REPO

    readme = (REPO / "README.md").read_text()
    assert "control area after `num_rdma_bytes` (4 MiB:" in readme
    for ranks in (2, 16, 256):
        c = ll_layout.control_offsets(1 << 30, ranks)
        assert 4.0 <= (c["end"] - c["credit"]) / 2**20 < 4.05, ranks
