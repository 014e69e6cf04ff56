"""Host-path harness: time ep_rt's hot-path host code on the CPU, with every CUDA call replaced by a counting stub.

IT MEASURES NO GPU TIME. What is left when CUDA is stubbed (Python, ctypes, tensor metadata) is timed; the CUDA-side
operations each call makes (torch.empty, events, stream waits, launches, record_stream, value-check syncs) are only
counted. The Buffers here are fakes built from ep_rt's real op classes (no NVSHMEM, no NVL buffer), so the stubs name
internal attributes: after a refactor of ep_rt/ops, expect to adapt this file.

    python tools/host_path_stub.py [--only ll|intranode|internode] [--json FILE] [--scale F]
    python tools/host_path_stub.py --trace-ll FILE
    python tools/host_path_stub.py --trace-ht FILE

--scale multiplies the iteration counts (a CPU test runs it with a small one). `trace_ll_sequence()` is the other use:
it runs a fixed sequence of low-latency calls and returns every kernel launch (name, grid, block, stream, launch
config, every parameter field) and every stream wait, with pointers named by the tensor they point at
(tests/ops/test_ll_call_plan.py compares it with a committed trace); `trace_ht_sequence()` does the same for the
high-throughput calls (tests/ops/test_ht_call_plan.py).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.environ.get("EP_RT_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import ep_rt  # noqa: E402
from ep_rt import buffer as buffer_mod  # noqa: E402
from ep_rt import events  # noqa: E402
from ep_rt.handles import next_serial  # noqa: E402
from ep_rt.ops import internode, intranode, layout, low_latency  # noqa: E402
from ep_rt.runtime import abi, driver, launch, modules  # noqa: E402
from ep_rt.transport import internode_layout as lay_mod  # noqa: E402
from ep_rt.transport import ll_layout, nvl  # noqa: E402
from ep_rt.transport.error_record import ErrorRecords  # noqa: E402

COUNT: collections.Counter = collections.Counter()
cpu = torch.device("cpu")
NOTE = "host Python time with every CUDA call stubbed (CPU only): no GPU time is measured"


class _State:
    trace = None  # a list while tracing: launches and stream waits, raw pointers
    fresh_empty = False  # torch.empty returns new tensors (tracing) or a cached one per shape (timing)
    capturing = False  # what torch.cuda.is_current_stream_capturing() answers
    params_types: dict = {}  # kernel name -> its parameter struct


S = _State()


# ---- stubs of the CUDA-only calls (each counted) ----------------------------------------------------
class FakeStream:
    def __init__(self, name, handle):
        self.name, self.cuda_stream, self.device_index = name, handle, 0

    def wait_stream(self, other):
        COUNT["Stream.wait_stream (a new Event each)"] += 1
        if S.trace is not None:
            S.trace.append({"wait": [self.name, other.name]})

    def wait_event(self, ev):
        COUNT["Stream.wait_event"] += 1
        if S.trace is not None:
            S.trace.append({"wait": [self.name, ev.stream.name if ev.stream is not None else None]})

    def synchronize(self):
        COUNT["Stream.synchronize"] += 1


COMPUTE, COMM = FakeStream("compute", 0x1111), FakeStream("comm", 0x2222)


class FakeEvent:
    def __init__(self, *a, **k):
        COUNT["torch.cuda.Event()"] += 1
        self.stream = None

    cuda_event = 0x3333

    def record(self, stream=None):
        COUNT["Event.record"] += 1
        self.stream = stream if stream is not None else COMPUTE


def _record_and_wait(event, waitee, waiter):
    """events.wait_stream's fence through the driver (streams by name: launch.driver_stream is stubbed)."""
    COUNT["cuEventRecord + cuStreamWaitEvent"] += 1
    if S.trace is not None:
        S.trace.append({"wait": [waiter, waitee]})


def _current_stream(device=None):
    COUNT["torch.cuda.current_stream()"] += 1
    return COMPUTE


@contextlib.contextmanager
def _stream_ctx(s):
    COUNT["with torch.cuda.stream(s)"] += 1
    yield


def _capturing():
    COUNT["torch.cuda.is_current_stream_capturing()"] += 1
    return S.capturing


_real = {}
_empty_cache: dict = {}
_traced_empties: list = []


def _allocation(real_name):
    """A stub of torch.empty or torch.empty_strided, counted as "torch.empty" (each is one allocation). Timing: a
    cached CPU tensor per shape, so the CPU allocator stays out of the measured time (the CUDA allocation is not
    measured at all). Tracing: a new tensor, so that each output has its own address."""

    def stub(*a, **k):
        COUNT["torch.empty"] += 1
        k.pop("device", None)
        if S.fresh_empty:
            t = _real[real_name](*a, **k)
            _traced_empties.append(t)  # kept until the trace ends: no later tensor takes its address
            return t
        key = (real_name, a, tuple(sorted((n, str(v)) for n, v in k.items())))
        t = _empty_cache.get(key)
        if t is None:
            t = _empty_cache[key] = _real[real_name](*a, **k)
        return t

    return stub


_mm = {}


def _aminmax(t):
    COUNT["torch.aminmax + 2 x int() (= 1 kernel + 2 blocking D2H copies)"] += 1
    key = (t.data_ptr(), tuple(t.shape))
    if key not in _mm:
        _mm[key] = _real["aminmax"](t)
    return _mm[key]


def _record_stream(self, s):
    COUNT["Tensor.record_stream"] += 1
    if S.trace is not None:
        S.trace.append({"record_stream": [self.data_ptr(), s.name]})


def _fields(struct) -> dict:
    out = {}
    for name, _ in struct._fields_:
        v = getattr(struct, name)
        if isinstance(v, ctypes.Structure):
            v = _fields(v)
        elif isinstance(v, ctypes.Array):
            v = list(v)
        out[name] = v
    return out


def _traced(config, function, grid, block, smem, stream, params_address):
    if S.trace is None:
        return
    address = ctypes.c_void_p.from_address(params_address).value
    S.trace.append(
        {
            "launch": function,
            "grid": grid,
            "block": block,
            "smem": smem,
            "stream": stream,
            "config": None if config is None else dict(sorted(vars(config).items())),
            "params": _fields(S.params_types[function].from_address(address)),
        }
    )


def _launch(function, grid, block, smem, stream, params_address, name):
    COUNT["cuLaunchKernel"] += 1
    _traced(None, function, grid, block, smem, stream, params_address)


def _launch_ex(config, function, grid, block, smem, stream, params_address, name):
    COUNT["cuLaunchKernelEx"] += 1
    _traced(config, function, grid, block, smem, stream, params_address)


def _memset_d32_async(ptr, value, count, stream):
    """Counted, and done on the CPU tensor the pointer is (what the GPU would do); not in the launch traces, which
    hold what the kernels receive (tests/data/host_trace_golden.json records it with its stream)."""
    COUNT["cuMemsetD32Async"] += 1
    (ctypes.c_int32 * count).from_address(ptr)[:] = [value] * count


def _make_launch_config(cooperative=False, cluster=1, programmatic=False):
    return types.SimpleNamespace(cooperative=bool(cooperative), cluster=int(cluster), programmatic=bool(programmatic))


_PATCHES = [
    (torch.cuda, "Event", FakeEvent),
    (torch.cuda, "current_stream", _current_stream),
    (events, "_stream_of_device", None),  # (a CUDA build of torch: events.current_stream takes torch's way, stubbed)
    (torch.cuda, "stream", _stream_ctx),
    (torch.cuda, "is_current_stream_capturing", _capturing),
    (torch, "empty", _allocation("empty")),
    (torch, "empty_strided", _allocation("empty_strided")),
    (torch, "aminmax", _aminmax),
    (torch.Tensor, "record_stream", _record_stream),
    (driver, "launch", _launch),
    (driver, "launch_ex", _launch_ex),
    (driver, "make_launch_config", _make_launch_config),
    (driver, "memset_d32_async", _memset_d32_async),
    (launch, "driver_stream", lambda s: s.name),
    (driver, "make_event", lambda handle: handle),
    (driver, "record_and_wait", _record_and_wait),
]


@contextlib.contextmanager
def stubbed():
    """Every CUDA-only call the hot paths make replaced by a counting stub; restored on exit."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in _PATCHES]
    _real.update(empty=torch.empty, empty_strided=torch.empty_strided, aminmax=torch.aminmax)
    try:
        for obj, name, stub in _PATCHES:
            setattr(obj, name, stub)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        _empty_cache.clear()
        _mm.clear()


class _FakeModule:
    # every kernel's block size as the shipped manifest records it (the Launchers take theirs from the entry)
    entry = {
        "path": "fake.cubin",
        "blocks": {k: b for e in modules.manifest()["cubins"] for k, b in e.get("blocks", {}).items()},
    }

    def function(self, name):
        return name


MOD = _FakeModule()


def launcher(name, params, cooperative=False):
    S.params_types[name] = params
    return launch.Launcher(MOD, name, params, cooperative=cooperative)


# ---- fake Buffers --------------------------------------------------------------------------------------
R = 2


def _nvl_buffer(errors, ranks):
    nv = nvl.NvlBuffer.__new__(nvl.NvlBuffer)
    nv.topology = types.SimpleNamespace(
        rank=0, num_nodes=1, node_size=ranks, num_ranks=ranks, describe=lambda: "1 node"
    )
    nv.rank, nv.num_ranks, nv.device_index = 0, ranks, 0
    nv.num_nvl_bytes = 1 << 30
    nv.timeout_s, nv.timeout_ns = 100.0, int(100e9)
    nv.errors = errors
    nv.host_token = 0
    nv.peer_ptrs = [0x1000 * (i + 1) for i in range(ranks)]
    nv.error_dev_ptr = 0
    nv.ctrl = abi.ControlLayout()
    nv.counters = (ctypes.c_int32 * abi.EP_RT_HOST_COUNTER_WORDS)()
    nv.counters_dev_ptr = 0
    nv.next_host_token = lambda: 1  # the "notify" has always published token 1
    nv.counters[abi.EP_RT_HOST_TOKEN] = 1
    return nv


def _buffer(errors, group_size, nv=None, ht=None, lay=None, ll=None):
    buf = buffer_mod.Buffer.__new__(buffer_mod.Buffer)
    buf.destroyed, buf._parts = False, []  # no parts: __del__ frees nothing
    buf._ht, buf._nvl, buf._layout, buf._errors, buf._ll = ht, nv, lay, errors, ll
    buf.comm_stream = COMM
    buf.group_size = group_size
    buf.device = cpu
    buf.rank = 0
    buf.nvshmem_qp_depth = 1024
    buf._session = types.SimpleNamespace(plan=types.SimpleNamespace(ibgda_peers=False))
    buf.topology = (
        nv.topology
        if nv is not None
        else types.SimpleNamespace(
            rank=0, num_nodes=1, node_size=group_size, num_ranks=group_size, describe=lambda: "1 node"
        )
    )
    return buf


def intranode_buffer(num_recv):
    errors = ErrorRecords(mapped=False)
    nv = _nvl_buffer(errors, R)
    for w in (abi.EP_RT_HOST_NUM_RECV, abi.EP_RT_HOST_MAX_DISPATCH_ROWS, abi.EP_RT_HOST_MAX_COMBINE_ROWS):
        nv.counters[w] = num_recv
    ht = intranode.IntranodeOp.__new__(intranode.IntranodeOp)
    ht.nvl = nv
    ht.notify = launcher("ep_rt_intranode_notify", abi.NotifyParams)
    ht.dispatch_kernel = launcher("ep_rt_intranode_dispatch", abi.DispatchParams)
    ht.combine_kernel = launcher("ep_rt_intranode_combine", abi.CombineParams)
    ht.serial = next_serial()
    ht.timer = None
    lay = layout.LayoutOp.__new__(layout.LayoutOp)
    lay.kernel = launcher("ep_rt_get_dispatch_layout", abi.LayoutParams)
    lay.checker = launcher("ep_rt_check_topk_idx", abi.LayoutParams)
    lay.error_ptr = errors.device_ptr("input")  # (the check of a dispatch's ids is launched, as on a GPU)
    lay.checker.set(error=lay.error_ptr)
    lay.num_sms = 132
    return _buffer(errors, R, nv=nv, ht=ht, lay=lay)


def internode_buffer(num_recv, ranks=4, node_size=2):
    """Mirrors InternodeOp.__init__ without the CUDA parts (2 nodes x 2 ranks)."""
    errors = ErrorRecords(mapped=False)
    nv = _nvl_buffer(errors, node_size)
    N = ranks // node_size
    io = internode.InternodeOp.__new__(internode.InternodeOp)
    io.topology = types.SimpleNamespace(
        rank=0, node=0, local_rank=0, num_nodes=N, node_size=node_size, num_ranks=ranks, describe=lambda: f"{N} nodes"
    )
    io.rank, io.num_ranks, io.G, io.N = 0, ranks, node_size, N
    io.device = cpu
    io.nvl = nv
    io.num_rdma_bytes = 1 << 30
    io.net_timeout_s = 300.0
    io.errors = errors
    io.control = lay_mod.control_offsets(io.num_rdma_bytes, ranks, N)
    io.nvl_control = lay_mod.nvl_control_offsets(ranks, N)
    io.records_bytes = nv.num_nvl_bytes - io.nvl_control["records"]
    io.pe_base, io.pe_stride = 0, node_size
    io.sym_base = 0x40000
    io.module, io.net_stats = MOD, None
    io.qp_rule_num_qps = None  # no IBGDA queue pairs carry these calls (the rule is taken at construction)
    io.workspace = torch.zeros(abi.EP_RT_IN_WS_WORDS, dtype=torch.int64)
    io.scratch = torch.zeros(abi.EP_RT_MAX_CHANNELS * (ranks + N), dtype=torch.int32)
    io.consumed = torch.zeros(8, dtype=torch.int64)
    io.counters = (ctypes.c_int32 * abi.EP_RT_IN_HOST_WORDS)()
    io.host_ptr = ctypes.addressof(io.counters)
    io.host_token = 0
    io._next_token = lambda: 1
    io.counters[abi.EP_RT_IN_HOST_TOKEN] = 1
    for w in (abi.EP_RT_IN_HOST_NUM_RECV, abi.EP_RT_IN_HOST_NUM_RDMA_RECV, abi.EP_RT_IN_HOST_MAX_RECV):
        io.counters[w] = num_recv
    io.counters[abi.EP_RT_IN_HOST_MAX_STREAM] = 4096
    io.kernels = {n: launcher(f"ep_rt_internode_{n}", abi.InternodeParams) for n in internode._KERNELS}
    for k in io.kernels.values():
        p = k.params
        p.sym_base = io.sym_base
        lay_mod.fill_nvl(p.nvl, io.nvl_control, nv.num_nvl_bytes)
        p.rank, p.num_ranks, p.ranks_per_node, p.num_nodes = 0, ranks, node_size, N
    io.serial = next_serial()
    io.timer = None
    lay = layout.LayoutOp.__new__(layout.LayoutOp)
    lay.kernel = launcher("ep_rt_get_dispatch_layout", abi.LayoutParams)
    lay.checker = launcher("ep_rt_check_topk_idx", abi.LayoutParams)
    lay.error_ptr = errors.device_ptr("input")  # (the check of a dispatch's ids is launched, as on a GPU)
    lay.checker.set(error=lay.error_ptr)
    lay.num_sms = 132
    buf = _buffer(errors, ranks, nv=nv, ht=io, lay=lay)
    buf.topology = io.topology
    return buf


LL_SYM, LL_PEERS = 0x10000, (0x10000, 0x20000)


def ll_buffer(ranks=R, nvlink_peers=None, shrink=False, packed=False):
    """Mirrors LowLatencyOp.__init__ without the CUDA parts. Attributes the op makes lazily are left to it. `packed`:
    the op of a packed cubin (EP_RT_LL_PACKED=1)."""
    errors = ErrorRecords(mapped=False)
    op = low_latency.LowLatencyOp.__new__(low_latency.LowLatencyOp)
    op.rank, op.num_ranks = 0, ranks
    op.device = cpu
    op.num_rdma_bytes = 1 << 28
    op.timeout_ns = int(100e9)
    op.timeout_s = 100.0
    op.idx = 0
    op.errors = errors
    op.error_dev_ptr = 0xE000
    op.num_sms = 132
    op.control = ll_layout.control_offsets(op.num_rdma_bytes, ranks)
    op.sym_bytes = op.control["end"]
    op.sym = LL_SYM
    op.peer_bases = torch.tensor([LL_SYM + 0x10000 * r for r in range(ranks)], dtype=torch.int64)
    op.nvlink_peers = ranks if nvlink_peers is None else nvlink_peers
    op.pending_recv = [False, False]
    op.packed = packed
    op.workspace = torch.zeros(abi.EP_RT_LL_WS_COUNTERS + abi.EP_RT_LL_MAX_SIGNALS, dtype=torch.int32)
    op.mask = torch.zeros(ranks, dtype=torch.int32) if shrink else None
    op.kernels = {
        n: launcher(f"ep_rt_ll_{n}", abi.LowLatencyParams)
        for n in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")
    }
    op.fused = {n: launcher(f"ep_rt_ll_{n}", abi.LowLatencyParams, cooperative=True) for n in ("dispatch", "combine")}
    op._barrier = launcher("ep_rt_ll_barrier", abi.LowLatencyParams)
    op.barrier_seq = 0
    op.dispatch_recv_grid = 264
    op.combine_send_grid = 264
    op.dispatch_grid = 132  # the one-kernel calls: one block of 512 threads per SM
    op.combine_grid = 264
    op.serial = next_serial()
    return _buffer(errors, ranks, ll=op)


# ---- timing --------------------------------------------------------------------------------------------
class Timer:
    def __init__(self, scale=1.0, out=print):
        self.scale, self.out, self.rows = scale, out, []

    def __call__(self, label, fn, n=3000, reps=7):
        n = max(1, int(n * self.scale))
        for _ in range(max(1, int(200 * self.scale))):
            fn()
        COUNT.clear()
        fn()
        census = dict(COUNT)
        runs = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            runs.append((time.perf_counter() - t0) / n * 1e6)
        row = {
            "call": label,
            "median_us": round(statistics.median(runs), 2),
            "min_us": round(min(runs), 2),
            "per_call": census,
        }
        self.rows.append(row)
        self.out(f"\n== {label}: {row['median_us']:.1f} us median, {row['min_us']:.1f} us min ({NOTE})")
        for k, v in census.items():
            self.out(f"   {v:3d} x {k}")
        return row


def run_intranode(timer):
    TOKENS, HIDDEN, K, E = 4096, 256, 8, 256
    buf = intranode_buffer(8170)
    x = torch.zeros(TOKENS, HIDDEN, dtype=torch.bfloat16)
    x_fp8 = (torch.zeros(TOKENS, HIDDEN, dtype=torch.float8_e4m3fn), torch.zeros(TOKENS, HIDDEN // 128))
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(64)]).repeat(TOKENS // 64, 1)
    w = torch.rand(TOKENS, K, generator=g)
    cfg = ep_rt.Config(24, 6, 256, 6, 128)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    kw = dict(
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    timer("get_dispatch_layout", lambda: buf.get_dispatch_layout(idx, E))
    timer("intranode dispatch BF16", lambda: buf.dispatch(x, **kw, config=cfg))
    timer("intranode dispatch BF16, config=None", lambda: buf.dispatch(x, **kw))
    timer("intranode dispatch FP8", lambda: buf.dispatch(x_fp8, **kw, config=cfg))
    timer("intranode dispatch BF16, async_finish", lambda: buf.dispatch(x, **kw, config=cfg, async_finish=True))
    timer("intranode dispatch BF16, num_worst_tokens", lambda: buf.dispatch(x, **kw, config=cfg, num_worst_tokens=8192))
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, **kw, config=cfg)
    timer("intranode cached dispatch", lambda: buf.dispatch(x, handle=handle, config=cfg))
    timer("intranode combine", lambda: buf.combine(recv_x, handle, topk_weights=recv_w, config=cfg))
    timer(
        "intranode combine, async_finish",
        lambda: buf.combine(recv_x, handle, topk_weights=recv_w, config=cfg, async_finish=True),
    )


def run_internode(timer):
    TOKENS, HIDDEN, K, E = 4096, 256, 8, 256
    buf = internode_buffer(8170)
    x = torch.zeros(TOKENS, HIDDEN, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(64)]).repeat(TOKENS // 64, 1)
    w = torch.rand(TOKENS, K, generator=g)
    cfg = ep_rt.Config(24, 6, 256, 6, 128)
    pr, pn, pe, ir, _ = buf.get_dispatch_layout(idx, E)
    kw = dict(
        num_tokens_per_rank=pr,
        num_tokens_per_rdma_rank=pn,
        is_token_in_rank=ir,
        num_tokens_per_expert=pe,
        topk_idx=idx,
        topk_weights=w,
    )
    timer("internode get_dispatch_layout", lambda: buf.get_dispatch_layout(idx, E))
    timer("internode dispatch BF16", lambda: buf.dispatch(x, **kw, config=cfg))
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, **kw, config=cfg)
    timer("internode cached dispatch", lambda: buf.dispatch(x, handle=handle, config=cfg))
    timer("internode combine", lambda: buf.combine(recv_x, handle, topk_weights=recv_w, config=cfg))


def run_ll(timer):
    T, H, E, K = 128, 7168, 8, 8  # few experts keep the CPU tensors small; the host path does not depend on them
    buf = ll_buffer()
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(T, H, dtype=torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    y = torch.zeros(E // R, R * T, H, dtype=torch.bfloat16)
    out = torch.zeros(T, H, dtype=torch.bfloat16)

    def hooked(call):
        def run():
            r = call()
            r[-1]()

        return run

    d = buf.low_latency_dispatch
    timer("LL dispatch FP8", lambda: d(x, idx, T, E))
    timer("LL dispatch BF16", lambda: d(x, idx, T, E, use_fp8=False))
    timer("LL dispatch FP8, async_finish", lambda: d(x, idx, T, E, async_finish=True))
    timer("LL dispatch FP8, return_recv_hook (hook called)", hooked(lambda: d(x, idx, T, E, return_recv_hook=True)))
    handle = d(x, idx, T, E)[2]
    c = buf.low_latency_combine
    timer("LL combine BF16", lambda: c(y, idx, w, handle))
    timer("LL combine BF16, out= given", lambda: c(y, idx, w, handle, out=out))
    timer("LL combine LogFMT", lambda: c(y, idx, w, handle, use_logfmt=True))
    timer(
        "LL combine BF16, return_recv_hook (hook called)", hooked(lambda: c(y, idx, w, handle, return_recv_hook=True))
    )
    # The packed layout's host path (its [2, L, R*T] src_info view, the top-k and handle checks), beside the above.
    packed = ll_buffer(packed=True)
    timer("LL dispatch FP8, packed layout", lambda: packed.low_latency_dispatch(x, idx, T, E))
    packed_handle = packed.low_latency_dispatch(x, idx, T, E)[2]
    timer("LL combine BF16, packed layout", lambda: packed.low_latency_combine(y, idx, w, packed_handle))


# ---- the LL trace ----------------------------------------------------------------------------------------
class _Names:
    """Pointer values named by the tensor they point at (every tensor kept alive, so no address is reused)."""

    def __init__(self):
        self.by_ptr, self.keep = {}, []

    def add(self, label, t):
        if isinstance(t, (tuple, list)):
            for i, u in enumerate(t):
                self.add(f"{label}[{i}]", u)
        elif isinstance(t, torch.Tensor):
            self.keep.append(t)
            if t.data_ptr():
                self.by_ptr.setdefault(t.data_ptr(), label)

    def name(self, v):
        if isinstance(v, dict):
            return {k: self.name(u) for k, u in v.items()}
        if isinstance(v, list):
            return [self.name(u) for u in v]
        if isinstance(v, int) and not isinstance(v, bool) and v in self.by_ptr:
            return "&" + self.by_ptr[v]
        return v


def trace_ll_sequence():
    """A fixed sequence of LL calls (shapes changing, FP8 / BF16 / UE8M0 / LogFMT / zero_copy, hooks on and off,
    async_finish, a CUDA-graph capture, hooks called late (after a call of another kind, and of their own kind), a masked (shrink) Buffer with remote peers):
    the list of kernel launches (every parameter field) and stream waits, pointers named by tensor."""
    names = _Names()
    S.trace, S.fresh_empty = [], True
    try:
        buf = ll_buffer()
        op = buf._ll
        names.add("peer_bases", op.peer_bases)
        names.add("workspace", op.workspace)
        g = torch.Generator().manual_seed(1)

        def inputs(tag, N, H, E, K, idx_dtype=torch.int64):
            x = torch.randn(N, H, generator=g).to(torch.bfloat16)
            idx = (
                torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(N)]).to(idx_dtype)
                if N
                else torch.zeros(0, K, dtype=idx_dtype)
            )
            w = torch.rand(N, K, generator=g)
            names.add(f"{tag}.x", x)
            names.add(f"{tag}.idx", idx)
            names.add(f"{tag}.w", w)
            return x, idx, w

        def step(tag, result):
            names.add(tag, result)
            S.trace.append({"returned": tag})
            return result

        def y_for(tag, T, H, E):
            y = torch.randn(E // R, R * T, H, generator=g).to(torch.bfloat16)
            names.add(f"{tag}.y", y)
            return y

        d, c = buf.low_latency_dispatch, buf.low_latency_combine
        x1, i1, w1 = inputs("a", 6, 256, 8, 3)
        r1 = step("c1", d(x1, i1, 8, 8))  # FP8 eager
        step("c2", c(y_for("c2", 8, 256, 8), i1, w1, r1[2]))  # BF16 combine eager
        x2, i2, w2 = inputs("b", 16, 512, 4, 2)
        stats, wstats = torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64)
        names.add("stats", stats)
        names.add("wstats", wstats)
        r3 = step(
            "c3",
            d(
                x2,
                i2,
                16,
                4,
                use_fp8=False,
                cumulative_local_expert_recv_stats=stats,
                dispatch_wait_recv_cost_stats=wstats,
            ),
        )  # BF16, stats, new shape
        out4 = torch.zeros(16, 512, dtype=torch.bfloat16)
        names.add("out4", out4)
        step(
            "c4",
            c(y_for("c4", 16, 512, 4), i2, w2, r3[2], use_logfmt=True, out=out4, combine_wait_recv_cost_stats=wstats),
        )  # LogFMT, out=
        r5 = step("c5", d(x2, i2, 16, 4, round_scale=True, use_ue8m0=True, return_recv_hook=True))  # UE8M0, hook
        S.trace.append({"hook": "c5"})
        r5[4]()
        zc = y_for("c6", 16, 512, 4)  # (the real staging view needs CUDA; the host path only passes its pointer)
        r6 = step("c6", c(zc, i2, w2, r5[2], zero_copy=True, return_recv_hook=True))  # zero_copy, hook held
        r7 = step("c7", d(x1, i1, 8, 8, async_finish=True))  # async_finish, back to shape a
        S.trace.append({"hook": "c6 (late, after c7)"})
        r6[2]()
        step("c8", c(y_for("c8", 8, 256, 8), i1, w1, r7[2], async_finish=True))
        S.capturing = True  # inside a CUDA-graph capture
        r9 = step("c9", d(x1, i1, 8, 8, return_recv_hook=True))
        S.trace.append({"hook": "c9"})
        r9[4]()
        r10 = step("c10", c(y_for("c10", 8, 256, 8), i1, w1, r9[2], return_recv_hook=True))
        S.trace.append({"hook": "c10"})
        r10[2]()
        S.capturing = False
        x3, i3, w3 = inputs("e", 3, 256, 8, 4, torch.int32)  # int32 top-k, N < T
        r11 = step("c11", d(x3, i3, 8, 8, round_scale=True))
        step("c12", c(y_for("c12", 8, 256, 8), i3, w3, r11[2], use_logfmt=True))
        x0, i0, w0 = inputs("z", 0, 256, 8, 2)  # no tokens
        r13 = step("c13", d(x0, i0, 8, 8))
        step("c14", c(y_for("c14", 8, 256, 8), i0, w0, r13[2]))
        r15 = step("c15", d(x1, i1, 8, 8))  # shape a again (plans reused)
        step("c16", c(y_for("c16", 8, 256, 8), i1, w1, r15[2]))
        # A hook held across a later call of its own kind (on the other buffer): it must launch what it had.
        r17 = step("c17", d(x1, i1, 8, 8, return_recv_hook=True))
        r18 = step("c18", d(x3, i3, 8, 8, use_fp8=False))
        S.trace.append({"hook": "c17 (after c18)"})
        r17[4]()
        r19 = step("c19", c(y_for("c19", 8, 256, 8), i1, w1, r17[2], return_recv_hook=True))
        step("c20", c(y_for("c20", 8, 256, 8), i3, w3, r18[2], use_logfmt=True))
        S.trace.append({"hook": "c19 (after c20)"})
        r19[2]()
        # A shrink Buffer (mask) with a peer behind the network (has_remote_peers).
        buf2 = ll_buffer(nvlink_peers=1, shrink=True)
        names.add("mask2", buf2._ll.mask)
        names.add("peer_bases2", buf2._ll.peer_bases)
        names.add("workspace2", buf2._ll.workspace)
        r17 = step("m1", buf2.low_latency_dispatch(x1, i1, 8, 8))
        step("m2", buf2.low_latency_combine(y_for("m2", 8, 256, 8), i1, w1, r17[2]))
        return [names.name(e) for e in S.trace]
    finally:
        S.trace, S.fresh_empty, S.capturing = None, False, False


# ---- the HT trace ----------------------------------------------------------------------------------------
def _set_rows(buf, rows):
    """What the fake notify "publishes": every rank receives `rows` rows (and forwards as many, internode)."""
    c = buf._ht.counters if buf.is_internode else buf._nvl.counters
    if buf.is_internode:
        for w in (abi.EP_RT_IN_HOST_NUM_RECV, abi.EP_RT_IN_HOST_NUM_RDMA_RECV, abi.EP_RT_IN_HOST_MAX_RECV):
            c[w] = rows
        for i in range(8):
            c[abi.EP_RT_IN_HOST_EXPERT_COUNTS + i] = rows + i
    else:
        for w in (abi.EP_RT_HOST_NUM_RECV, abi.EP_RT_HOST_MAX_DISPATCH_ROWS, abi.EP_RT_HOST_MAX_COMBINE_ROWS):
            c[w] = rows
        for i in range(8):
            c[abi.EP_RT_HOST_EXPERT_COUNTS + i] = rows + i


def _number_unnamed(entries):
    """Pointer fields no returned tensor names (the cached dispatch's scratch, say) numbered by first appearance, so
    the trace is the same from run to run; the 64-bit unsigned fields of the parameter structs are the pointers."""
    pointer_fields = {name for t in S.params_types.values() for name, ft in t._fields_ if ft is ctypes.c_uint64}
    numbers: dict = {}
    for e in entries:
        for key, v in e.get("params", {}).items():
            if key in pointer_fields and isinstance(v, int) and v >= 1 << 32:
                e["params"][key] = "@%d" % numbers.setdefault(v, len(numbers))
        if "record_stream" in e and isinstance(e["record_stream"][0], int):
            e["record_stream"][0] = "@%d" % numbers.setdefault(e["record_stream"][0], len(numbers))
    return entries


def trace_ht_sequence():
    """A fixed sequence of high-throughput calls on a fake intranode and a fake internode Buffer: layouts, dispatches
    (BF16 / FP8 with float32 and int32 scales, shapes, top-k widths, expert counts, channel counts and alignments
    changing, int32 top-k, num_worst_tokens, no top-k, config=None), cached dispatches (typed and plain-tuple
    handles), combines (with and without top-k weights and biases), async_finish, previous_event and
    allocate_on_comm_stream, and a shape seen before again: every kernel launch (every parameter field), every
    stream wait and record_stream, pointers named by the tensor they point at."""
    names = _Names()
    S.trace, S.fresh_empty = [], True
    try:
        for kind, make in (("intranode", lambda: intranode_buffer(24)), ("internode", lambda: internode_buffer(24))):
            S.trace.append({"buffer": kind})
            buf = make()
            g = torch.Generator().manual_seed(3)
            internode_buf = buf.is_internode

            def step(tag, result):
                names.add(f"{kind}.{tag}", result)
                S.trace.append({"returned": tag})
                return result

            def tensor(tag, t):
                names.add(f"{kind}.{tag}", t)
                return t

            def routing(tag, N, E, K, dtype=torch.int64):
                idx = (
                    torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(N)])
                    if N
                    else torch.zeros(0, K, dtype=torch.int64)
                )
                if N > 1 and K > 1:
                    idx[1, 0] = -1
                return tensor(f"{tag}.idx", idx.to(dtype)), tensor(f"{tag}.w", torch.rand(N, K, generator=g))

            def bf16(tag, N, H):
                return tensor(f"{tag}.x", torch.randn(N, H, generator=g).to(torch.bfloat16))

            def fp8(tag, N, H, scales_dtype=torch.float32):
                data = torch.randn(N, H, generator=g).to(torch.float8_e4m3fn)
                scales = (
                    torch.rand(N, H // 128, generator=g)
                    if scales_dtype is torch.float32
                    else torch.randint(0, 1 << 20, (N, max(1, H // 512)), generator=g, dtype=torch.int32)
                )
                return tensor(f"{tag}.x", data), tensor(f"{tag}.s", scales)

            def counts(layout):
                per_rank, per_node, per_expert, in_rank, _ = layout
                kw = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
                if internode_buf:
                    kw["num_tokens_per_rdma_rank"] = per_node
                return kw

            cfg4, cfg6 = ep_rt.Config(4, 6, 256, 6, 128), ep_rt.Config(6, 6, 256, 6, 128)
            i1, w1 = routing("a", 6, 8, 4)
            L1 = step("L1", buf.get_dispatch_layout(i1, 8))
            x1 = bf16("a", 6, 256)
            _set_rows(buf, 24)
            D1 = step("D1", buf.dispatch(x1, topk_idx=i1, topk_weights=w1, config=cfg4, **counts(L1)))
            y1 = tensor("y1", torch.randn(24, 256, generator=g).to(torch.bfloat16))
            rw1 = tensor("rw1", torch.rand(24, 4, generator=g))
            step("C1", buf.combine(y1, D1[4], topk_weights=rw1))
            _set_rows(buf, 10)
            D2 = step(
                "D2", buf.dispatch(fp8("b", 6, 512), topk_idx=i1, topk_weights=w1, async_finish=True, **counts(L1))
            )
            step("K1", buf.dispatch(x1, handle=D2[4], config=cfg6))
            step(
                "K2",
                buf.dispatch(
                    fp8("c", 6, 1024, torch.int32),
                    handle=tuple(D2[4]),
                    config=cfg6,
                    previous_event=buf.capture(),
                    async_finish=True,
                ),
            )
            i3, w3 = routing("d", 6, 8, 4, torch.int32)
            step(
                "D3",
                buf.dispatch(
                    x1, topk_idx=i3, topk_weights=w3, config=cfg6, num_worst_tokens=32, expert_alignment=4, **counts(L1)
                ),
            )
            _set_rows(buf, 7)
            D4 = step("D4", buf.dispatch(bf16("e", 6, 128), config=cfg4, **counts(L1)))
            bias = tensor("bias", torch.randn(6, 128, generator=g).to(torch.bfloat16))
            y4 = tensor("y4", torch.randn(7, 128, generator=g).to(torch.bfloat16))
            step(
                "C2",
                buf.combine(
                    y4,
                    tuple(D4[4]),
                    bias=(bias, bias),
                    previous_event=buf.capture(),
                    async_finish=True,
                    allocate_on_comm_stream=True,
                ),
            )
            i5, w5 = routing("f", 5, 16, 2)
            L5 = step(
                "L5",
                buf.get_dispatch_layout(
                    i5, 16, previous_event=buf.capture(), async_finish=True, allocate_on_comm_stream=True
                ),
            )
            _set_rows(buf, 13)
            D5 = step(
                "D5",
                buf.dispatch(
                    bf16("f", 5, 384), topk_idx=i5, topk_weights=w5, config=cfg6, expert_alignment=2, **counts(L5)
                ),
            )
            y5 = tensor("y5", torch.randn(13, 384, generator=g).to(torch.bfloat16))
            step(
                "C3", buf.combine(y5, D5[4], bias=tensor("bias5", torch.randn(5, 384, generator=g).to(torch.bfloat16)))
            )
            step("K3", buf.dispatch(fp8("g", 5, 384), handle=D5[4], config=cfg4))
            _set_rows(buf, 24)
            D6 = step("D6", buf.dispatch(x1, topk_idx=i1, topk_weights=w1, config=cfg4, **counts(L1)))  # D1 again
            step("C4", buf.combine(y1, D6[4], topk_weights=rw1, async_finish=True))
            i0, w0 = routing("z", 0, 8, 4)
            L0 = step("L0", buf.get_dispatch_layout(i0, 8))
            _set_rows(buf, 3)
            D0 = step("D0", buf.dispatch(bf16("z", 0, 256), topk_idx=i0, topk_weights=w0, config=cfg4, **counts(L0)))
            step("C0", buf.combine(tensor("y0", torch.randn(3, 256, generator=g).to(torch.bfloat16)), D0[4]))
        return _number_unnamed([names.name(e) for e in S.trace])
    finally:
        S.trace, S.fresh_empty, S.capturing = None, False, False
        _traced_empties.clear()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("ll", "intranode", "internode"))
    ap.add_argument("--json", help="write the rows (call, median_us, min_us, per_call counts) to this file")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the iteration counts (default 1)")
    ap.add_argument(
        "--trace-ll",
        metavar="FILE",
        help="write the LL call sequence's trace (trace_ll_sequence) to FILE and time nothing",
    )
    ap.add_argument(
        "--trace-ht",
        metavar="FILE",
        help="write the HT call sequence's trace (trace_ht_sequence) to FILE and time nothing",
    )
    a = ap.parse_args(argv)
    if a.trace_ht:
        with stubbed():
            trace = trace_ht_sequence()
        with open(a.trace_ht, "w") as f:
            json.dump(trace, f, indent=0, sort_keys=True)
            f.write("\n")
        print(f"{len(trace)} entries -> {a.trace_ht}")
        return trace
    if a.trace_ll:
        with stubbed():
            trace = trace_ll_sequence()
        with open(a.trace_ll, "w") as f:
            json.dump(trace, f, indent=0, sort_keys=True)
            f.write("\n")
        print(f"{len(trace)} entries -> {a.trace_ll}")
        return trace
    timer = Timer(a.scale)
    print(f"ep_rt host path: {NOTE}.")
    with stubbed():
        for part, run in (("intranode", run_intranode), ("internode", run_internode), ("ll", run_ll)):
            if a.only in (None, part):
                run(timer)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"note": NOTE, "rows": timer.rows}, f, indent=1)
    print(f"\ndone ({NOTE})")
    return timer.rows


if __name__ == "__main__":
    main()
