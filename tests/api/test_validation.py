"""CPU tests of every bad-input error: dispatch/combine argument checks run before any kernel, so they are
exercised here with CPU tensors and a stand-in for the Buffer's rank count and device."""

from types import SimpleNamespace

import pytest
import torch

from ep_rt import Buffer, Config, validate
from ep_rt.ops import ht_args as dispatch_args
from ep_rt.events import EventOverlap, StreamScope

from ..repo import REPO

CPU = torch.device("cpu")
BUF = SimpleNamespace(group_size=2, device=CPU, is_internode=False, ht_serial=-1)  # what ht_args reads of a Buffer
N, H, K, E = 16, 256, 4, 8


def good():
    return dict(
        x=torch.randn(N, H).to(torch.bfloat16),
        handle=None,
        num_tokens_per_rank=torch.zeros(2, dtype=torch.int32),
        is_token_in_rank=torch.zeros(N, 2, dtype=torch.bool),
        num_tokens_per_expert=torch.zeros(E, dtype=torch.int32),
        topk_idx=torch.randint(0, E, (N, K)),
        topk_weights=torch.rand(N, K),
        expert_alignment=1,
        num_worst_tokens=0,
        config=Config(),
    )


def check(**overrides):
    args = good()
    args.update(overrides)
    return dispatch_args.check(BUF, **args)


def test_good_arguments_pass():
    out = check()
    assert out.x.shape == (N, H) and out.x_scales is None
    fp8 = (torch.randn(N, H).to(torch.float8_e4m3fn), torch.rand(H // 128, N).t())  # column-major scales are fine
    assert check(x=fp8).x_scales is not None


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        (dict(x=torch.randn(N, H)), TypeError, "dtype"),
        (dict(x=torch.randn(N, H, 2).to(torch.bfloat16)), ValueError, "2-D"),
        (dict(x=torch.randn(H, N).to(torch.bfloat16).t()), ValueError, "contiguous"),
        (dict(x=torch.randn(N, 7).to(torch.bfloat16)), ValueError, "multiple of 16"),
        (dict(x=torch.randn(N, H + 1).to(torch.bfloat16)[:, 1:]), ValueError, "contiguous"),
        (dict(x=(torch.randn(N, H).to(torch.float8_e4m3fn),)), ValueError, "tuple"),
        (dict(x=(torch.randn(N, H).to(torch.bfloat16), torch.rand(N, 2))), TypeError, "dtype"),
        (dict(x=(torch.randn(N, H).to(torch.float8_e4m3fn), torch.rand(N + 1, 2))), ValueError, "rows"),
        (dict(x=(torch.randn(N, H).to(torch.float8_e4m3fn), torch.rand(N, 2).double())), TypeError, "dtypes"),
        (dict(topk_idx=torch.randint(0, E, (N, K)).short()), TypeError, "dtypes"),
        (dict(topk_idx=torch.randint(0, E, (N + 1, K))), ValueError, "rows"),
        (dict(topk_idx=torch.randint(0, E, (N, 33)), topk_weights=torch.rand(N, 33)), ValueError, "at most 32"),
        (dict(topk_weights=torch.rand(N, K).double()), TypeError, "float32"),
        (dict(topk_weights=torch.rand(N, K + 1)), ValueError, "shape"),
        (dict(topk_weights=None), ValueError, "together"),
        (dict(num_tokens_per_expert=torch.zeros(7, dtype=torch.int32)), ValueError, "divisible"),
        (
            dict(
                num_tokens_per_expert=torch.zeros(2 * 1025, dtype=torch.int32), topk_idx=torch.randint(0, 2050, (N, K))
            ),
            ValueError,
            "1024 experts per rank",
        ),
        (dict(num_tokens_per_expert=None), ValueError, "num_tokens_per_expert"),
        (dict(num_tokens_per_rank=torch.zeros(3, dtype=torch.int32)), ValueError, "rows"),
        (dict(num_tokens_per_rank=None), ValueError, "get_dispatch_layout"),
        (dict(is_token_in_rank=torch.zeros(N, 3, dtype=torch.bool)), ValueError, "is_token_in_rank"),
        (dict(is_token_in_rank=torch.zeros(N, 2, dtype=torch.int32)), TypeError, "bool"),
        (dict(expert_alignment=0), ValueError, "expert_alignment"),
        (dict(num_worst_tokens=-1), ValueError, "num_worst_tokens"),
        (dict(topk_idx=None, topk_weights=None, num_worst_tokens=8), ValueError, "needs topk_idx"),
        (dict(config="fast"), TypeError, "Config"),
        (dict(handle=(1, 2, 3)), ValueError, "no topk_idx"),
    ],
)
def test_bad_dispatch_arguments(overrides, error, match):
    with pytest.raises(error, match=match):
        check(**overrides)


def fake_handle(rows=10, n=N):
    return (
        torch.zeros(2, 2, dtype=torch.int32),
        torch.zeros(2, 4, dtype=torch.int32),
        torch.zeros(2, 4, dtype=torch.int32),
        torch.zeros(rows, dtype=torch.int32),
        torch.zeros(n, 2, dtype=torch.bool),
        torch.zeros(n, 2, dtype=torch.int32),
    )


def test_cached_dispatch_checks():
    args = good()
    args.update(topk_idx=None, topk_weights=None, handle=fake_handle())
    assert dispatch_args.check(BUF, **args).x.shape == (N, H)
    with pytest.raises(ValueError, match="6-tuple"):
        args["handle"] = fake_handle()[:5]
        dispatch_args.check(BUF, **args)
    with pytest.raises(ValueError, match="tokens but the handle"):
        args["handle"] = fake_handle(n=N + 1)
        dispatch_args.check(BUF, **args)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(x=torch.randn(10, H)), TypeError, "bfloat16"),
        (dict(x=torch.randn(11, H).to(torch.bfloat16)), ValueError, "rows"),
        (dict(x=torch.randn(10, 12).to(torch.bfloat16)), ValueError, "multiple of 8"),
        (dict(topk_weights=torch.rand(9, K)), ValueError, "rows"),
        (dict(bias=torch.randn(N, H)), TypeError, "bfloat16"),
        (dict(bias=(torch.randn(N, H).to(torch.bfloat16),)), ValueError, "2-tuple"),
        (dict(bias=(None, torch.randn(N + 1, H).to(torch.bfloat16))), ValueError, "rows"),
        (dict(handle=fake_handle()[:-1]), ValueError, "6-tuple"),
        (dict(config=3), TypeError, "Config"),
    ],
)
def test_bad_combine_arguments(kwargs, error, match):
    args = dict(
        x=torch.randn(10, H).to(torch.bfloat16), handle=fake_handle(), topk_weights=None, bias=None, config=None
    )
    args.update(kwargs)
    with pytest.raises(error, match=match):
        dispatch_args.check_combine(BUF, **args)


def test_experts_helper():
    assert validate.experts(16, 2) == 8
    with pytest.raises(ValueError, match="positive"):
        validate.experts(0, 2)


def test_stream_rule_allocate_on_comm_stream_needs_event_and_async():
    with pytest.raises(ValueError, match="allocate_on_comm_stream"):
        StreamScope(None, None, async_finish=True, allocate_on_comm_stream=True)
    with pytest.raises(ValueError, match="allocate_on_comm_stream"):
        StreamScope(None, EventOverlap(None), async_finish=False, allocate_on_comm_stream=True)


def test_event_overlap_without_event():
    ev = EventOverlap()
    with ev:
        pass
    with pytest.raises(RuntimeError, match="no event"):
        ev.current_stream_wait()


@pytest.mark.parametrize(
    "kwargs,error",
    [
        (dict(low_latency_mode=True), ValueError),
        (dict(low_latency_mode=True, num_rdma_bytes=1 << 20, num_qps_per_rank=0), ValueError),
        (dict(num_rdma_bytes=1000), ValueError),
        (dict(num_rdma_bytes=100, low_latency_mode=True), ValueError),
        (dict(use_fabric=True), NotImplementedError),
        (dict(num_nvl_bytes=100), ValueError),
        (dict(num_nvl_bytes=-128), ValueError),
    ],
)
def test_buffer_constructor_rejects_before_touching_the_gpu(kwargs, error):
    with pytest.raises(error):
        Buffer(object(), **kwargs)


def test_buffer_without_group_names_the_group_not_mpi4py():
    """Buffer(None, 0) is what Buffer(dist.group.WORLD, 0) is before init_process_group: an error about the group
    (mpi4py's comm= only when the caller passed comm)."""
    import torch.distributed as dist

    from ep_rt.errors import EpRtError, GroupError

    assert not dist.is_initialized()  # this test process never initialises torch.distributed
    for group in (None, dist.group.WORLD):
        with pytest.raises(GroupError, match=r"init_process_group\(\) has run") as e:
            Buffer(group, 0)
        assert isinstance(e.value, EpRtError) and isinstance(e.value, ValueError)
        assert "comm" not in str(e.value) and "mpi4py" not in str(e.value)
    with pytest.raises(TypeError, match="comm must be an mpi4py communicator"):
        Buffer(None, 0, comm=object())


def test_no_cuda_is_said_in_ep_rts_words(monkeypatch):
    from ep_rt import validate as v
    from ep_rt.errors import NoGpuError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(NoGpuError, match="ep_rt needs a CUDA GPU, and this torch .* is a CPU-only build"):
        v.cuda_available()
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(NoGpuError, match=r"sees none \(CUDA_VISIBLE_DEVICES=''\)"):
        v.cuda_available()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA path: this machine has a GPU")
def test_buffer_on_a_machine_without_cuda(tmp_path):
    """A real process group (gloo, one rank) on this machine: ep_rt's message, not torch's 'Torch not compiled with
    CUDA enabled'."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import torch.distributed as dist
        from ep_rt import Buffer
        from ep_rt.errors import NoGpuError
        dist.init_process_group("gloo", init_method="file://{tmp_path / "store"}", rank=0, world_size=1)
        try:
            Buffer(dist.group.WORLD, 1 << 20)
        except NoGpuError as e:
            print("raised:", e)
        dist.destroy_process_group()
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "raised: ep_rt needs a CUDA GPU" in proc.stdout and "not compiled" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("worst", [0, 64])
@pytest.mark.parametrize("bad", [E, -2])
def test_the_host_does_not_check_id_values(bad, worst):
    """No device sync in a hot call (issue 23): the host checks shape and dtype only; the ids' range is checked by
    the layout family's kernels (tests/buffer/test_input_errors.py)."""
    out = check(topk_idx=torch.full((N, K), bad), num_worst_tokens=worst)
    assert out.x.shape == (N, H)


def test_wrong_device_is_named():
    with pytest.raises(ValueError, match="must be on cpu"):
        check(x=torch.empty(N, H, dtype=torch.bfloat16, device="meta"))
