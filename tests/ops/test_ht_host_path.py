"""The lean HT host path's own rules (issue 23 item 2), with the CUDA calls stubbed (tools/host_path_stub.py):
stream waits reuse one event per stream, outputs are allocated without a stream context unless they belong to the
comm stream, a call makes one allocation per tensor it returns (plus the cached dispatch's scratch), config=None
builds no Config after the first call, plans are reused and bounded, and after the dispatch's host wait only the
outputs are allocated before the launch."""

import json

import pytest
import torch

import ep_rt
from ep_rt import config as config_mod, events
from ep_rt.transport import nvl_layout
from tests.host_path_tools import load_stub

stub = load_stub()
TOKENS, H, K, E = 64, 256, 4, 16


@pytest.fixture
def stubbed():
    with stub.stubbed():
        events._fences.clear()
        yield
        events._fences.clear()


def census(fn):
    stub.COUNT.clear()
    out = fn()
    return dict(stub.COUNT), out


def inputs(internode):
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(TOKENS)])
    return torch.zeros(TOKENS, H, dtype=torch.bfloat16), idx, torch.rand(TOKENS, K, generator=g)


def make(kind):
    return stub.intranode_buffer(24) if kind == "intranode" else stub.internode_buffer(24)


def routing(buf, idx, w):
    pr, pn, pe, ir, _ = buf.get_dispatch_layout(idx, E)
    kw = dict(num_tokens_per_rank=pr, is_token_in_rank=ir, num_tokens_per_expert=pe, topk_idx=idx, topk_weights=w)
    if buf.is_internode:
        kw["num_tokens_per_rdma_rank"] = pn
    return kw


CFG = ep_rt.Config(8, 6, 256, 6, 128)
# torch.empty per call, each one a tensor the call returns (outputs and handle), but the cached intranode dispatch's
# scratch for the source indices its kernel writes.
ALLOCATIONS = {
    # the handle's 4 matrices; recv_x (+ scales, top-k, weights); the handle's recv_src_idx
    "intranode": {
        "layout": 2,
        "dispatch": 4 + 3 + 1,
        "dispatch fp8": 4 + 4 + 1,
        "dispatch no top-k": 4 + 1 + 1,
        "cached": 1 + 1,
        "combine": 2,
        "combine no weights": 1,
    },
    # the handle's 7 matrices; recv_x (+ scales, top-k, weights); the handle's recv_src_meta and send_nvl_head
    "internode": {
        "layout": 2,
        "dispatch": 7 + 3 + 2,
        "dispatch fp8": 7 + 4 + 2,
        "dispatch no top-k": 7 + 1 + 2,
        "cached": 1,
        "combine": 2,
        "combine no weights": 1,
    },
}


@pytest.mark.parametrize("kind", ["intranode", "internode"])
def test_allocations_per_call(stubbed, kind):
    buf = make(kind)
    x, idx, w = inputs(kind)
    kw = routing(buf, idx, w)
    fp8 = (torch.zeros(TOKENS, H, dtype=torch.float8_e4m3fn), torch.zeros(TOKENS, H // 128))
    no_topk = {k: v for k, v in kw.items() if k not in ("topk_idx", "topk_weights")}
    calls = {
        "layout": lambda: buf.get_dispatch_layout(idx, E),
        "dispatch": lambda: buf.dispatch(x, **kw, config=CFG),
        "dispatch fp8": lambda: buf.dispatch(fp8, **kw, config=CFG),
        "dispatch no top-k": lambda: buf.dispatch(x, **no_topk, config=CFG),
    }
    handle = buf.dispatch(x, **kw, config=CFG)[4]
    rows = handle[3].size(0) if kind == "intranode" else handle.recv_src_meta.size(0)
    y, rw = torch.zeros(rows, H, dtype=torch.bfloat16), torch.zeros(rows, K)
    calls.update(
        {
            "cached": lambda: buf.dispatch(x, handle=handle, config=CFG),
            "combine": lambda: buf.combine(y, handle, topk_weights=rw),
            "combine no weights": lambda: buf.combine(y, handle),
        }
    )
    for name, call in calls.items():
        call()
        got, _ = census(call)
        assert got.get("torch.empty", 0) == ALLOCATIONS[kind][name], (name, got)


@pytest.mark.parametrize("kind", ["intranode", "internode"])
def test_no_event_after_the_first_call_and_no_stream_context_that_changes_nothing(stubbed, kind):
    buf = make(kind)
    x, idx, w = inputs(kind)
    kw = routing(buf, idx, w)
    buf.dispatch(x, **kw, config=CFG)
    got, _ = census(lambda: buf.dispatch(x, **kw, config=CFG))
    assert "torch.cuda.Event()" not in got and got["cuEventRecord + cuStreamWaitEvent"] == 2  # two driver fences
    assert "Event.record" not in got and "Stream.wait_event" not in got
    assert "Stream.wait_stream (a new Event each)" not in got
    assert "with torch.cuda.stream(s)" not in got  # outputs on the current stream: no context
    got, _ = census(lambda: buf.get_dispatch_layout(idx, E))
    # the counts are zeroed on the comm stream by a driver memset in its order, without a stream context
    assert "with torch.cuda.stream(s)" not in got and got["cuMemsetD32Async"] == 1, got
    handle = buf.dispatch(x, **kw, config=CFG)[4]
    for call in (
        lambda: buf.dispatch(x, handle=handle, config=CFG),
        lambda: buf.combine(torch.zeros(24, H, dtype=torch.bfloat16), handle),
    ):
        got, _ = census(call)
        assert "with torch.cuda.stream(s)" not in got and "torch.cuda.Event()" not in got


@pytest.mark.parametrize("kind", ["intranode", "internode"])
def test_allocate_on_comm_stream_allocates_every_output_on_the_comm_stream(stubbed, kind, monkeypatch):
    import contextlib

    buf = make(kind)
    x, idx, w = inputs(kind)
    kw = routing(buf, idx, w)
    where, current = [], [None]

    @contextlib.contextmanager
    def stream_ctx(s):
        saved, current[0] = current[0], s
        try:
            yield
        finally:
            current[0] = saved

    empty = torch.empty

    def recording_empty(*a, **k):
        where.append(current[0])
        return empty(*a, **k)

    monkeypatch.setattr(torch.cuda, "stream", stream_ctx)
    monkeypatch.setattr(torch, "empty", recording_empty)
    buf.dispatch(x, **kw, config=CFG, previous_event=buf.capture(), async_finish=True, allocate_on_comm_stream=True)
    assert where and all(s is stub.COMM for s in where)
    where.clear()
    buf.dispatch(x, **kw, config=CFG)
    assert where and all(s is None for s in where)


def test_config_none_builds_no_config_after_the_first_call(stubbed, monkeypatch, tmp_path):
    buf = make("intranode")
    x, idx, w = inputs("intranode")
    kw = routing(buf, idx, w)
    built = []
    post_init = config_mod.Config.__post_init__
    monkeypatch.setattr(config_mod.Config, "__post_init__", lambda self: built.append(1) or post_init(self))
    monkeypatch.delenv("EP_RT_CONFIG_FILE", raising=False)
    config_mod._TABLE_CONFIGS.clear()
    buf.dispatch(x, **kw)
    assert len(built) == 1
    buf.dispatch(x, **kw)
    assert len(built) == 1
    assert buf._ht.notify.params.num_channels == ep_rt.Buffer.num_sms
    monkeypatch.setattr(ep_rt.Buffer, "num_sms", 12)  # set_num_sms: a new key
    buf.dispatch(x, **kw)
    assert buf._ht.notify.params.num_channels == 12
    # A config file is still read on every call (a changed file is picked up).
    path = tmp_path / "configs.json"
    entry = dict(
        kind="dispatch",
        num_ranks=buf.group_size,
        num_sms=10,
        num_max_nvl_chunked_send_tokens=6,
        num_max_nvl_chunked_recv_tokens=256,
        num_max_rdma_chunked_send_tokens=6,
        num_max_rdma_chunked_recv_tokens=128,
    )
    path.write_text(json.dumps({"format": "ep_rt-config", "version": 1, "configs": [entry]}))
    monkeypatch.setenv("EP_RT_CONFIG_FILE", str(path))
    buf.dispatch(x, **kw)
    assert buf._ht.notify.params.num_channels == 10


def test_table_config_cache_takes_exact_ints_only():
    a = config_mod.table_config("dispatch", 2, 1, num_ranks_per_node=2)
    assert config_mod.table_config("dispatch", 2, 1, num_ranks_per_node=2) is a
    with pytest.raises(TypeError):
        config_mod.table_config("dispatch", 2, True, num_ranks_per_node=2)  # Config refuses a bool num_sms


@pytest.mark.parametrize("kind", ["intranode", "internode"])
def test_plans_are_reused_and_bounded(stubbed, kind):
    buf = make(kind)
    x, idx, w = inputs(kind)
    kw = routing(buf, idx, w)
    for _ in range(3):
        buf.dispatch(x, **kw, config=CFG)
    assert len(buf._ht.call_plans) == 1
    for n in range(1, 70):
        buf.dispatch(x, **kw, config=ep_rt.Config(1 + n % 64, 6, 256, 6, 128), expert_alignment=1 + n // 64)
    assert len(buf._ht.call_plans) <= 64
    for n in range(70):
        buf.get_dispatch_layout(idx[:n], E)
    assert len(buf._layout.call_plans) <= 64


@pytest.mark.parametrize("kind", ["intranode", "internode"])
def test_after_the_host_wait_only_the_outputs_are_allocated_before_the_launch(stubbed, kind, monkeypatch):
    buf = make(kind)
    x, idx, w = inputs(kind)
    kw = routing(buf, idx, w)
    log = []
    op = buf._ht
    if kind == "intranode":
        wait = op.nvl.wait_host_counters
        monkeypatch.setattr(op.nvl, "wait_host_counters", lambda *a: log.append("wait") or wait(*a), raising=False)
        first_data_kernel = "ep_rt_intranode_dispatch"
    else:
        wait = op._wait_counters
        monkeypatch.setattr(op, "_wait_counters", lambda *a: log.append("wait") or wait(*a))
        first_data_kernel = "ep_rt_internode_send"
    empty, launch, fill = torch.empty, stub.driver.launch, nvl_layout.DispatchRows.fill
    monkeypatch.setattr(torch, "empty", lambda *a, **k: log.append("empty") or empty(*a, **k))
    monkeypatch.setattr(stub.driver, "launch", lambda f, *a: log.append(f) or launch(f, *a))
    monkeypatch.setattr(stub.driver, "launch_ex", lambda c, f, *a: log.append(f))
    monkeypatch.setattr(nvl_layout.DispatchRows, "fill", lambda *a: log.append("fill") or fill(*a))
    set_fields = stub.launch.Launcher.set
    monkeypatch.setattr(stub.launch.Launcher, "set", lambda self, **f: log.append("set") or set_fields(self, **f))
    monkeypatch.setattr(op.__class__, "call_plans", None)  # the first call builds its plan: before the wait
    op.call_plans = None
    buf.dispatch(x, **kw, config=CFG)
    after = log[log.index("wait") + 1 : log.index(first_data_kernel)]
    assert after and set(after) == {"empty"}, log
