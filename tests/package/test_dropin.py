"""Drop-in behaviour DeepEP clients rely on, on the CPU with stand-ins for the GPU parts:
num_recv_tokens_per_expert_list without top-k, and an EventOverlap without an event taken as no event (Megatron's
FusedDispatch passes get_dispatch_layout's event on to dispatch)."""

import ctypes
from types import SimpleNamespace

import pytest
import torch

from ep_rt import Buffer, Config, EventOverlap
from ep_rt.events import EventHandle, StreamScope, event_of
from ep_rt.ops.intranode import IntranodeOp
from ep_rt.runtime import abi
from ep_rt.transport.error_record import ErrorRecords

CPU = torch.device("cpu")


class FakeLauncher:
    """A Launcher's interface: its params struct, set(), and a launch that runs `on_launch` instead of a kernel.
    Its block size is any (these tests read parameter fields, not grids)."""

    def __init__(self, params_type, on_launch=None, block=256):
        self.params, self.block = params_type(), block
        self.launches = []
        self.on_launch = on_launch

    def set(self, **fields):
        for k, v in fields.items():
            setattr(self.params, k, v)
        return self

    def __call__(self, grid, stream, smem=None):
        self.launches.append(grid)
        if self.on_launch:
            self.on_launch(self.params)


def intranode_op(R, published_expert_counts, num_recv):
    """An IntranodeOp whose notify 'kernel' publishes the given counts to the host words, as the real one does."""
    counters = (ctypes.c_int32 * abi.EP_RT_HOST_COUNTER_WORDS)()

    def notify(p):
        assert p.num_experts > 0 and p.num_tokens_per_expert != 0  # counts are passed to the kernel
        counters[abi.EP_RT_HOST_NUM_RECV] = num_recv
        counters[abi.EP_RT_HOST_MAX_DISPATCH_ROWS] = counters[abi.EP_RT_HOST_MAX_COMBINE_ROWS] = num_recv
        for i, c in enumerate(published_expert_counts):
            counters[abi.EP_RT_HOST_EXPERT_COUNTS + i] = c
        counters[abi.EP_RT_HOST_TOKEN] = p.host_token

    nvl = SimpleNamespace(
        num_ranks=R,
        rank=0,
        num_nvl_bytes=1 << 24,
        counters=counters,
        counters_dev_ptr=0,
        next_host_token=lambda: 5,
        wait_host_counters=lambda token, what: None,
    )
    op = object.__new__(IntranodeOp)
    op.nvl, op.timer, op.serial = nvl, None, 1
    op.notify = FakeLauncher(abi.NotifyParams, notify)
    op.dispatch_kernel = FakeLauncher(abi.DispatchParams)
    return op


@pytest.mark.parametrize("with_topk", [False, True], ids=["no top-k", "top-k"])
def test_per_expert_list_comes_from_the_counts_with_or_without_topk(with_topk):
    R, N, H, E, K = 2, 6, 64, 8, 2
    published = [3, 0, 7, 1]  # E / R local experts, as the notify kernel leaves them for the host
    op = intranode_op(R, published, num_recv=9)
    x = torch.zeros(N, H, dtype=torch.bfloat16)
    topk_idx = torch.zeros(N, K, dtype=torch.int64) if with_topk else None
    topk_w = torch.zeros(N, K) if with_topk else None
    r = op.dispatch(
        x,
        None,
        topk_idx,
        topk_w,
        torch.zeros(R, dtype=torch.int32),
        torch.zeros(N, R, dtype=torch.bool),
        torch.zeros(E, dtype=torch.int32),
        1,
        0,
        4,
        None,
        None,
    )
    assert r.num_recv_tokens_per_expert_list == published
    assert r.recv_x.shape == (9, H)
    assert (r.recv_topk_idx is not None) == with_topk


def test_num_worst_tokens_gives_an_empty_list():
    op = intranode_op(2, [1, 2, 3, 4], num_recv=0)
    r = op.dispatch(
        torch.zeros(4, 64, dtype=torch.bfloat16),
        None,
        torch.zeros(4, 1, dtype=torch.int64),
        torch.zeros(4, 1),
        torch.zeros(2, dtype=torch.int32),
        torch.zeros(4, 2, dtype=torch.bool),
        torch.zeros(8, dtype=torch.int32),
        1,
        16,
        4,
        None,
        None,
    )
    assert r.num_recv_tokens_per_expert_list == [] and r.recv_x.shape == (16, 64)
    assert op.notify.params.host_token == 0  # the host did not wait for the counts


def test_dispatch_without_topk_still_needs_the_counts():
    from ep_rt.ops import ht_args

    buf = SimpleNamespace(group_size=2, device=CPU)
    args = dict(
        x=torch.zeros(4, 64, dtype=torch.bfloat16),
        handle=None,
        num_tokens_per_rank=torch.zeros(2, dtype=torch.int32),
        is_token_in_rank=torch.zeros(4, 2, dtype=torch.bool),
        num_tokens_per_expert=None,
        topk_idx=None,
        topk_weights=None,
        expert_alignment=1,
        num_worst_tokens=0,
        config=Config(),
    )
    with pytest.raises(ValueError, match="num_tokens_per_expert"):
        ht_args.check(buf, **args)
    args["num_tokens_per_expert"] = torch.zeros(7, dtype=torch.int32)  # experts are checked without top-k too
    with pytest.raises(ValueError, match="divisible"):
        ht_args.check(buf, **args)


def test_reference_fills_the_list_from_the_counts_without_topk():
    from ep_rt import reference

    xs = [torch.arange(8, dtype=torch.bfloat16).view(4, 2) for _ in range(2)]
    routes = [torch.tensor([[1, 0], [1, 1], [0, 1], [0, 0]], dtype=torch.bool)] * 2
    counts = [torch.tensor([1, 2, 3, 4], dtype=torch.int32), torch.tensor([5, 0, 1, 1], dtype=torch.int32)]
    out = reference.intranode_dispatch(
        xs, None, None, 4, 2, expert_alignment=4, is_token_in_ranks=routes, num_tokens_per_experts=counts
    )
    assert out[0]["num_recv_tokens_per_expert_list"] == [8, 4]  # 1 + 5 and 2 + 0, rounded up to 4
    assert out[1]["num_recv_tokens_per_expert_list"] == [4, 8]  # 3 + 1 and 4 + 1


# ---- previous_event=EventOverlap(None) -------------------------------------------------------------------


class FakeStream:
    def __init__(self, name):
        self.name, self.waited = name, []

    def wait_stream(self, other):
        self.waited.append(("stream", other.name))

    def wait_event(self, event):
        self.waited.append(("event", event))


@pytest.fixture
def compute_stream(monkeypatch):
    stream = FakeStream("compute")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: stream)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return stream


def test_an_event_overlap_without_an_event_is_no_event(compute_stream):
    comm = FakeStream("comm")
    scope = StreamScope(comm, EventOverlap(None), async_finish=False, allocate_on_comm_stream=False)
    assert comm.waited == [("stream", "compute")]  # as previous_event=None: the comm stream waits the caller's
    assert isinstance(scope.finish([]), EventOverlap)
    assert compute_stream.waited == [("stream", "comm")]


def test_allocate_on_comm_stream_still_needs_a_real_event(compute_stream):
    with pytest.raises(ValueError, match="allocate_on_comm_stream"):
        StreamScope(FakeStream("comm"), EventOverlap(None), async_finish=True, allocate_on_comm_stream=True)


def test_previous_event_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="EventOverlap"):
        event_of(object())
    with pytest.raises(TypeError, match="EventHandle"):
        event_of(EventOverlap(object()))
    handle = object.__new__(EventHandle)
    assert event_of(EventOverlap(handle)) is handle and event_of(None) is None


def test_megatron_call_sequence_layout_event_into_dispatch(compute_stream):
    """get_dispatch_layout without async_finish returns EventOverlap(None); Megatron passes it to dispatch."""
    R, N, H, E, K = 2, 4, 64, 8, 2
    buf = object.__new__(Buffer)
    buf.destroyed, buf.group_size, buf.device = False, R, CPU
    buf.comm_stream = FakeStream("comm")
    buf._nvl = SimpleNamespace(raise_if_failed=lambda: None)
    per_rank, in_rank = torch.zeros(R, dtype=torch.int32), torch.zeros(N, R, dtype=torch.bool)
    per_expert = torch.zeros(E, dtype=torch.int32)
    buf._errors = ErrorRecords(mapped=False)

    class Layout:  # the layout op: the counts, and the dispatch's id check (a launch on the GPU)
        checked = []

        def __call__(self, idx, e, r, alloc, comm, G=8):
            return per_rank, None, per_expert, in_rank, per_expert

        def check_ids(self, idx, e, stream):
            self.checked.append((idx, e))

    buf._layout = Layout()
    dispatched = {}

    def dispatch(*args):
        dispatched["args"] = args
        return SimpleNamespace(
            recv_x=torch.zeros(0, H),
            recv_x_scales=None,
            recv_topk_idx=None,
            recv_topk_weights=None,
            num_recv_tokens_per_expert_list=[0, 0, 0, 0],
            handle=(),
            tensors=[],
        )

    buf._ht = SimpleNamespace(raise_if_failed=lambda: None, check_dispatch=lambda call: None, run_dispatch=dispatch)
    idx = torch.zeros(N, K, dtype=torch.int64)
    *_, event = buf.get_dispatch_layout(idx, E)
    assert isinstance(event, EventOverlap) and event.event is None
    out = buf.dispatch(
        torch.zeros(N, H, dtype=torch.bfloat16),
        topk_idx=idx,
        topk_weights=torch.zeros(N, K),
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        previous_event=event,
        config=Config(4),
    )
    assert out[3] == [0, 0, 0, 0] and "args" in dispatched
    buf.destroyed = True  # keeps __del__ quiet


# ---- deep_ep.utils.check_nvlink_connections ------------------------------------------------------------


def test_check_nvlink_connections_as_deepep(monkeypatch):
    import torch.distributed as dist

    from ep_rt import utils
    from ep_rt.errors import TopologyError
    from ep_rt.transport.topology import Topology

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    utils.check_nvlink_connections(object())  # SXM: nothing to check, no collective, no NVML
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 PCIe".upper())
    monkeypatch.setattr(dist, "get_world_size", lambda group: 3)
    with pytest.raises(TopologyError, match="at most 2"):
        utils.check_nvlink_connections(object())
    # Two ranks: the pairs of this host's GPUs go to NVML; other hosts' GPUs are not this host's to check.
    monkeypatch.setattr(dist, "get_world_size", lambda group: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(utils.driver, "pci_bus_id", lambda i: "0000:01:00.0")
    monkeypatch.setattr(
        Topology,
        "gather",
        classmethod(lambda cls, group, bus: Topology.from_table(0, ["a", "a"], ["0000:01:00.0", "0000:02:00.0"])),
    )
    asked = []
    monkeypatch.setattr(utils, "nvlink_problems", lambda ids: asked.append(ids) or ["0000:01:00.0 <-> 0000:02:00.0"])
    with pytest.raises(TopologyError, match="not connected by NVLink"):
        utils.check_nvlink_connections(object())
    assert asked == [["0000:01:00.0", "0000:02:00.0"]]
    monkeypatch.setattr(utils, "nvlink_problems", lambda ids: [])
    utils.check_nvlink_connections(object())
