"""topk_idx_t as a run-time choice: EP_RT_TOPK_IDX_BITS sets ep_rt.topk_idx_t (the type of recv_topk_idx), and
int32 topk_idx is accepted wherever int64 is, handed to the kernels in place with its width (no copy). The kernels
run on the GPU (tests/gpu/test_topk_idx_bits_gpu.py); here: the env knob, the checks, the parameters each op packs
(with stand-ins for the launches), and the reference giving the same answers for both widths."""

import os
import subprocess
import sys

import pytest
import torch

from ep_rt import reference, reference_ll, validate
from ep_rt.ops.layout import LayoutOp
from ep_rt.ops.low_latency import LowLatencyOp
from ep_rt.runtime import abi
from ep_rt.transport import ll_layout
from ep_rt.transport.error_record import ErrorRecords

from ..package.test_dropin import FakeLauncher, intranode_op
from ..repo import REPO as ROOT


def python(code, **env):
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, cwd="/")


@pytest.mark.parametrize("bits,dtype", [("32", "torch.int32"), ("64", "torch.int64"), ("", "torch.int64")])
def test_env_knob_sets_topk_idx_t(bits, dtype):
    out = python(
        "import ep_rt, _ep_rt_deep_ep; ep_rt.install_deep_ep_alias(); import deep_ep; "
        "print(ep_rt.topk_idx_t, deep_ep.topk_idx_t)",
        EP_RT_TOPK_IDX_BITS=bits,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [dtype, dtype]


def test_bad_knob_is_a_clear_error():
    out = python("import ep_rt", EP_RT_TOPK_IDX_BITS="16")
    assert out.returncode != 0 and "EP_RT_TOPK_IDX_BITS must be 32 or 64, got '16'" in out.stderr


def test_both_widths_pass_the_checks_and_others_do_not():
    for dtype in (torch.int64, torch.int32):
        validate.topk_idx(torch.zeros(3, 2, dtype=dtype), torch.device("cpu"))
    with pytest.raises(TypeError, match="dtypes"):
        validate.topk_idx(torch.zeros(3, 2, dtype=torch.int16), torch.device("cpu"))
    assert validate.bits(torch.zeros(1, dtype=torch.int32)) == 32 and validate.bits(None) == 64


# ---- what the ops hand the kernels ---------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("in_dtype", [torch.int64, torch.int32])
def test_intranode_dispatch_reads_the_input_in_place_and_writes_topk_idx_t(monkeypatch, in_dtype, out_dtype):
    monkeypatch.setattr(validate, "topk_idx_t", out_dtype)
    N, K = 6, 2
    op = intranode_op(2, [1, 2, 3, 4], num_recv=5)
    idx = torch.zeros(N, K, dtype=in_dtype)
    r = op.dispatch(
        torch.zeros(N, 64, dtype=torch.bfloat16),
        None,
        idx,
        torch.zeros(N, K),
        torch.zeros(2, dtype=torch.int32),
        torch.zeros(N, 2, dtype=torch.bool),
        torch.zeros(8, dtype=torch.int32),
        1,
        0,
        4,
        None,
        None,
    )
    p = op.dispatch_kernel.params
    assert p.topk_idx == idx.data_ptr()  # the caller's tensor, not a converted copy
    assert p.topk_idx_bits == in_dtype.itemsize * 8 and p.recv_topk_idx_bits == out_dtype.itemsize * 8
    assert r.recv_topk_idx.dtype == out_dtype and p.recv_topk_idx == r.recv_topk_idx.data_ptr()


def test_cached_dispatch_has_no_topk():
    op = intranode_op(2, [], num_recv=0)
    handle = (
        torch.zeros(2, 2, dtype=torch.int32),
        torch.zeros(2, 4, dtype=torch.int32),
        torch.zeros(2, 4, dtype=torch.int32),
        torch.zeros(3, dtype=torch.int32),
        torch.zeros(4, 2, dtype=torch.bool),
        torch.zeros(4, 2, dtype=torch.int32),
    )
    op.cached_dispatch(torch.zeros(4, 64, dtype=torch.bfloat16), None, handle, None, None)
    p = op.dispatch_kernel.params
    assert p.topk_idx == 0 and p.recv_topk_idx == 0 and p.num_topk == 0


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_layout_kernel_gets_the_width(dtype, monkeypatch):
    from ep_rt.ops import layout as layout_mod

    zeroed = []  # (the counts are zeroed on the comm stream by a driver memset: stood in for here)
    monkeypatch.setattr(layout_mod, "driver_stream", lambda stream: stream)
    monkeypatch.setattr(layout_mod.driver, "memset_d32_async", lambda *args: zeroed.append(args))
    op = object.__new__(LayoutOp)
    op.kernel, op.num_sms = FakeLauncher(abi.LayoutParams), 4
    idx = torch.zeros(10, 3, dtype=dtype)
    op(idx, 8, 2, None, None)
    assert op.kernel.params.topk_idx == idx.data_ptr() and op.kernel.params.topk_idx_bits == dtype.itemsize * 8
    assert zeroed == [(op.kernel.params.num_tokens_per_rank, 0, 2 + 8, None)]  # every count word, before the kernel


class FakeLLLauncher(FakeLauncher):
    def snapshot(self):
        return lambda grid, stream, early=False: None


def ll_op(R=2, E=8):
    op = object.__new__(LowLatencyOp)
    op.rank, op.num_ranks, op.device = 0, R, torch.device("cpu")
    op.num_rdma_bytes = ll_layout.rdma_size_hint(8, 256, R, E)
    op.errors, op.error_dev_ptr = ErrorRecords(mapped=False), 0
    op.control = ll_layout.control_offsets(op.num_rdma_bytes, R)
    op.idx, op.pending_recv, op.timeout_ns = 0, [False, False], 1
    op.sym, op.peer_bases, op.nvlink_peers = 0, torch.zeros(R, dtype=torch.int64), R
    op.workspace, op.mask = torch.zeros(64, dtype=torch.int32), None
    op.num_sms, op.dispatch_recv_grid, op.combine_send_grid = 4, 8, 4
    op.kernels = {
        n: FakeLLLauncher(abi.LowLatencyParams)
        for n in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")
    }
    op.fused = {n: FakeLLLauncher(abi.LowLatencyParams) for n in ("dispatch", "combine")}
    op.dispatch_grid, op.combine_grid = 4, 8
    return op


@pytest.mark.parametrize("split", [False, True], ids=["one_kernel", "hook"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_low_latency_kernels_get_the_width(dtype, split):
    R, T, H, E, N, K = 2, 8, 256, 8, 4, 2
    op = ll_op(R, E)
    idx = torch.zeros(N, K, dtype=dtype)
    (recv_x, scales, count, src_info, layout_range), recv = op.dispatch(
        torch.zeros(N, H, dtype=torch.bfloat16), idx, T, E, None, None, False, False, False, None, split
    )
    assert (recv is None) == (not split)
    # one kernel, or the send kernel and the receive kernel with the send kernel's parameters
    launched = [op.kernels["dispatch_send"], op.kernels["dispatch_recv"]] if split else [op.fused["dispatch"]]
    for k in launched:
        p = k.params
        assert p.topk_idx == idx.data_ptr() and p.topk_idx_bits == dtype.itemsize * 8
    if split:
        recv(None)
    op.combine(
        torch.zeros(E // R, R * T, H, dtype=torch.bfloat16),
        idx,
        torch.zeros(N, K),
        src_info,
        layout_range,
        T,
        H,
        E,
        None,
        None,
        False,
        False,
        None,
        split,
    )
    p = (op.kernels["combine_send"] if split else op.fused["combine"]).params
    assert p.topk_idx == idx.data_ptr() and p.topk_idx_bits == dtype.itemsize * 8


# ---- the reference is width-blind ----------------------------------------------------------------------


def routing(R=2, N=12, E=8, K=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    idxs = []
    for _ in range(R):
        idx = torch.topk(torch.rand(N, E, generator=g), K, dim=1).indices
        idxs.append(torch.where(torch.rand(N, K, generator=g) < 0.2, torch.full_like(idx, -1), idx))
    xs = [torch.randn(N, 128, generator=g).to(torch.bfloat16) for _ in range(R)]
    ws = [torch.rand(N, K, generator=g) for _ in range(R)]
    return xs, idxs, ws


def test_reference_gives_the_same_answers_for_int32_indices():
    xs, idxs, ws = routing()
    narrow = [i.int() for i in idxs]
    for a, b in zip(reference.dispatch_layout(idxs[0], 8, 2), reference.dispatch_layout(narrow[0], 8, 2)):
        assert (a is None and b is None) or torch.equal(a, b)
    wide = reference.intranode_dispatch(xs, idxs, ws, 8, 2)
    thin = reference.intranode_dispatch(xs, narrow, ws, 8, 2)
    for w, t in zip(wide, thin):
        assert torch.equal(w["recv_topk_idx"], t["recv_topk_idx"].long()) and torch.equal(w["recv_x"], t["recv_x"])
        assert w["num_recv_tokens_per_expert_list"] == t["num_recv_tokens_per_expert_list"]
    d64 = reference_ll.low_latency_dispatch(xs, idxs, 16, 8, use_fp8=False)
    d32 = reference_ll.low_latency_dispatch(xs, narrow, 16, 8, use_fp8=False)
    ys = [torch.randn(4, 2 * 16, 128).to(torch.bfloat16) for _ in range(2)]
    c64 = reference_ll.low_latency_combine(ys, idxs, ws, d64)
    c32 = reference_ll.low_latency_combine(ys, narrow, ws, d32)
    for a, b in zip(c64, c32):
        assert torch.equal(a["combined_x"], b["combined_x"])
