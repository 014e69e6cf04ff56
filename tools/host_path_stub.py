"""Time ep_rt's hot-path host code on a CPU machine: every CUDA-only call is replaced by a counting stub, so what is
left (Python, ctypes, tensor metadata) is measured, and the CUDA-side operations each call makes are counted.

Run from a project checkout: `python ../shared/tools/host_path_stub.py` (or set EP_RT_SRC to the checkout).
It was written against the host code of bc2f2cf (copied from ../shared/tools and adapted to issue 26's Buffer: the
internode op takes the queue-pair rule at construction, qp_rule_num_qps); the stubs name internal functions, so
after a refactor expect to adapt them. tests/host_trace.py records what the same calls ask of CUDA, call by call. It measures no GPU time: CUDA-side costs (allocations, events, launches, syncs) are only counted.
"""
import collections
import contextlib
import os
import ctypes
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.environ.get("EP_RT_SRC", os.getcwd()))
import ep_rt  # noqa: E402
from ep_rt import buffer as buffer_mod  # noqa: E402
from ep_rt.handles import next_serial  # noqa: E402
from ep_rt.ops import intranode, internode, low_latency, layout  # noqa: E402
from ep_rt.runtime import abi, driver, launch  # noqa: E402
from ep_rt.transport import ll_layout, nvl  # noqa: E402
from ep_rt.transport import internode_layout as lay_mod  # noqa: E402
from ep_rt.transport.error_record import ErrorRecords  # noqa: E402

COUNT = collections.Counter()
cpu = torch.device("cpu")


# ---- stubs of CUDA-only calls (each counted) -----------------------------------------------------
class FakeEvent:
    def __init__(self, *a, **k):
        COUNT["torch.cuda.Event()"] += 1

    def record(self, stream=None):
        COUNT["Event.record"] += 1


class FakeStream:
    cuda_stream = 0x1234

    def wait_stream(self, other):
        COUNT["Stream.wait_stream (new Event + record + wait)"] += 1

    def wait_event(self, ev):
        COUNT["Stream.wait_event"] += 1

    def synchronize(self):
        COUNT["Stream.synchronize"] += 1


COMPUTE, COMM = FakeStream(), FakeStream()


def current_stream(device=None):
    COUNT["torch.cuda.current_stream()"] += 1
    return COMPUTE


@contextlib.contextmanager
def stream_ctx(s):
    COUNT["with torch.cuda.stream(s)"] += 1
    yield


def capturing():
    COUNT["torch.cuda.is_current_stream_capturing()"] += 1
    return False


_real_empty = torch.empty


_empty_cache = {}


def counting_empty(*a, **k):
    """Counted; returns a cached CPU tensor of the shape so that the CPU allocator's cost stays out of the
    measured Python time (the CUDA allocation is estimated separately)."""
    COUNT["torch.empty"] += 1
    key = (a, k.get("dtype"))
    t = _empty_cache.get(key)
    if t is None:
        t = _empty_cache[key] = _real_empty(*a, **k)
    return t


def launch_stub(function, grid, block, smem, stream, params_address, name):
    COUNT["cuLaunchKernel"] += 1


def launch_ex_stub(config, function, grid, block, smem, stream, params_address, name):
    COUNT["cuLaunchKernelEx"] += 1


def record_stream_stub(self, s):
    COUNT["Tensor.record_stream"] += 1


_real_aminmax = torch.aminmax


_mm = None


def counting_aminmax(t):
    """Counted; returns cached results (on CUDA: a reduction kernel, then int() twice = 2 blocking copies)."""
    global _mm
    COUNT["torch.aminmax + 2 x int() (= 1 kernel + 2 blocking D2H copies)"] += 1
    if _mm is None:
        _mm = _real_aminmax(t)
    return _mm


torch.cuda.Event = FakeEvent
torch.cuda.current_stream = current_stream
torch.cuda.stream = stream_ctx
torch.cuda.is_current_stream_capturing = capturing
torch.empty = counting_empty
torch.aminmax = counting_aminmax
torch.Tensor.record_stream = record_stream_stub
driver.launch = launch_stub
driver.launch_ex = launch_ex_stub
driver.make_launch_config = lambda *a, **k: types.SimpleNamespace()
launch.driver_stream = lambda s: 0


class FakeModule:
    def function(self, name):
        return name


MOD = FakeModule()


def launcher(name, params, block):
    return launch.Launcher(MOD, name, params, block=block)


# ---- a fake intranode Buffer (2 ranks) -----------------------------------------------------------
R, HIDDEN, K, E, TOKENS, C = 2, 256, 8, 256, 4096, 24
L = E // R
NUM_RECV = 8170

errors = ErrorRecords(mapped=False)
nv = nvl.NvlBuffer.__new__(nvl.NvlBuffer)
nv.topology = types.SimpleNamespace(rank=0, num_nodes=1, node_size=R, num_ranks=R, describe=lambda: "1 node")
nv.rank, nv.num_ranks, nv.device_index = 0, R, 0
nv.num_nvl_bytes = 1 << 30
nv.timeout_s, nv.timeout_ns = 100.0, int(100e9)
nv.errors = errors
nv.host_token = 0
nv.peer_ptrs = [0x1000, 0x2000]
nv.error_dev_ptr = 0
nv.ctrl = abi.ControlLayout()
nv.counters = (ctypes.c_int32 * abi.EP_RT_HOST_COUNTER_WORDS)()
nv.counters_dev_ptr = 0
nv.next_host_token = lambda: 1  # the "notify" has always published token 1
nv.counters[abi.EP_RT_HOST_TOKEN] = 1
nv.counters[abi.EP_RT_HOST_NUM_RECV] = NUM_RECV
nv.counters[abi.EP_RT_HOST_MAX_DISPATCH_ROWS] = NUM_RECV
nv.counters[abi.EP_RT_HOST_MAX_COMBINE_ROWS] = NUM_RECV

ht = intranode.IntranodeOp.__new__(intranode.IntranodeOp)
ht.nvl = nv
ht.notify = launcher("ep_rt_intranode_notify", abi.NotifyParams, 1024)
ht.dispatch_kernel = launcher("ep_rt_intranode_dispatch", abi.DispatchParams, 512)
ht.combine_kernel = launcher("ep_rt_intranode_combine", abi.CombineParams, 512)
ht.serial = next_serial()
ht.timer = None

lay = layout.LayoutOp.__new__(layout.LayoutOp)
lay.kernel = launcher("ep_rt_get_dispatch_layout", abi.LayoutParams, 256)
lay.num_sms = 132

buf = buffer_mod.Buffer.__new__(buffer_mod.Buffer)
buf.destroyed = False
buf._ht, buf._nvl, buf._layout, buf._errors, buf._ll = ht, nv, lay, errors, None
buf.comm_stream = COMM
buf.group_size = R
buf.device = cpu
buf.topology = nv.topology
buf.rank = 0

x = torch.zeros(TOKENS, HIDDEN, dtype=torch.bfloat16)
x_fp8 = (torch.zeros(TOKENS, HIDDEN, dtype=torch.float8_e4m3fn), torch.zeros(TOKENS, HIDDEN // 128))
idx = torch.stack([torch.randperm(E)[:K] for _ in range(64)]).repeat(TOKENS // 64, 1)
w = torch.rand(TOKENS, K)
cfg = ep_rt.Config(24, 6, 256, 6, 128)


def timeit(label, fn, n=3000, reps=7):
    for _ in range(200):
        fn()
    COUNT.clear()
    fn()
    census = dict(COUNT)
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n * 1e6)
    print(f"\n== {label}: host Python (CUDA stubs) median {statistics.median(best):.1f} us, min {min(best):.1f} us")
    for k, v in census.items():
        print(f"   {v:3d} x {k}")
    return census


per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
timeit("get_dispatch_layout (value check on: aminmax)", lambda: buf.get_dispatch_layout(idx, E))
timeit("dispatch BF16, no num_worst_tokens, config given",
       lambda: buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, config=cfg))
timeit("dispatch BF16, config=None (get_dispatch_config per call)",
       lambda: buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w))
timeit("dispatch FP8, no num_worst_tokens",
       lambda: buf.dispatch(x_fp8, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, config=cfg))
timeit("dispatch BF16, async_finish=True",
       lambda: buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, config=cfg,
                            async_finish=True))
timeit("dispatch BF16, num_worst_tokens=8192 (no host wait, no value check)",
       lambda: buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, config=cfg,
                            num_worst_tokens=8192))
out = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                   topk_idx=idx, topk_weights=w, config=cfg)
recv_x, recv_idx, recv_w, _, handle, _ = out
timeit("cached dispatch (handle)", lambda: buf.dispatch(x, handle=handle, config=cfg))
timeit("combine", lambda: buf.combine(recv_x, handle, topk_weights=recv_w, config=cfg))
timeit("combine, async_finish=True", lambda: buf.combine(recv_x, handle, topk_weights=recv_w, config=cfg,
                                                         async_finish=True))

# Split of intranode dispatch: before notify launch, between notify and dispatch launch (critical path), after.
marks = {}
_orig_run = intranode.IntranodeOp._run
_orig_wait = nvl.NvlBuffer.wait_host_counters


def run_marked(self, name, kernel, grid, stream):
    _orig_run(self, name, kernel, grid, stream)
    marks[name] = time.perf_counter()


def wait_marked(self, token, phase):
    _orig_wait(self, token, phase)
    marks["counts seen"] = time.perf_counter()


intranode.IntranodeOp._run = run_marked
nvl.NvlBuffer.wait_host_counters = wait_marked
segs = collections.defaultdict(list)
for i in range(3200):
    t0 = time.perf_counter()
    buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                 topk_idx=idx, topk_weights=w, config=cfg)
    t1 = time.perf_counter()
    if i >= 200:
        segs["entry -> notify launched"].append(marks["notify"] - t0)
        segs["notify launched -> counts seen (wait returns at once here)"].append(marks["counts seen"] - marks["notify"])
        segs["counts seen -> dispatch launched (GPU idle on this stretch)"].append(marks["dispatch"] - marks["counts seen"])
        segs["dispatch launched -> return"].append(t1 - marks["dispatch"])
print("\n== intranode dispatch, Python time by segment (CUDA stubs), medians:")
for k, v in segs.items():
    print(f"   {statistics.median(v) * 1e6:6.1f} us  {k}")
intranode.IntranodeOp._run = _orig_run
nvl.NvlBuffer.wait_host_counters = _orig_wait

# ---- internode (2 nodes x 2 ranks) ---------------------------------------------------------------
RI, G = 4, 2
NI = RI // G
io = internode.InternodeOp.__new__(internode.InternodeOp)
io.topology = types.SimpleNamespace(rank=0, node=0, num_nodes=NI, node_size=G, num_ranks=RI, describe=lambda: "2 nodes")
io.rank, io.num_ranks, io.G, io.N = 0, RI, G, NI
io.nvl = nv
io.num_rdma_bytes = 1 << 30
io.net_timeout_s = 300.0
io.errors = errors
io.control = lay_mod.control_offsets(io.num_rdma_bytes, RI, NI)
io.counters = (ctypes.c_int32 * abi.EP_RT_IN_HOST_WORDS)()
io.host_token = 0
io._next_token = lambda: 1
io.counters[abi.EP_RT_IN_HOST_TOKEN] = 1
io.counters[abi.EP_RT_IN_HOST_NUM_RECV] = NUM_RECV
io.counters[abi.EP_RT_IN_HOST_NUM_RDMA_RECV] = NUM_RECV
io.counters[abi.EP_RT_IN_HOST_MAX_STREAM] = 4096
io.counters[abi.EP_RT_IN_HOST_MAX_RECV] = NUM_RECV
blocks = {"forward": 128, "barrier": 256}
io.kernels = {n: launcher(f"ep_rt_internode_{n}", abi.InternodeParams, blocks.get(n, 512)) for n in internode._KERNELS}
io.serial = next_serial()
io.timer = None
io.qp_rule_num_qps = None  # no IBGDA queue pairs carry these calls
io.device = cpu
io.nvl_control = lay_mod.nvl_control_offsets(RI, NI)
io.records_bytes = nv.num_nvl_bytes - io.nvl_control["records"]
ibuf = buffer_mod.Buffer.__new__(buffer_mod.Buffer)
ibuf.__dict__.update(buf.__dict__)
ibuf._ht = io
ibuf.group_size = RI
ibuf.topology = io.topology
ibuf._session = types.SimpleNamespace(plan=types.SimpleNamespace(ibgda_peers=False))  # read by the code before issue 26
EI = 256
idx4 = torch.stack([torch.randperm(EI)[:K] for _ in range(64)]).repeat(TOKENS // 64, 1)
pr, pn, pe, ir, _ = ibuf.get_dispatch_layout(idx4, EI)
timeit("internode get_dispatch_layout", lambda: ibuf.get_dispatch_layout(idx4, EI))
cfg16 = ep_rt.Config(24, 6, 256, 6, 128)
timeit("internode dispatch BF16, no num_worst_tokens",
       lambda: ibuf.dispatch(x, num_tokens_per_rank=pr, num_tokens_per_rdma_rank=pn, is_token_in_rank=ir,
                             num_tokens_per_expert=pe, topk_idx=idx4, topk_weights=w, config=cfg16))
iout = ibuf.dispatch(x, num_tokens_per_rank=pr, num_tokens_per_rdma_rank=pn, is_token_in_rank=ir,
                     num_tokens_per_expert=pe, topk_idx=idx4, topk_weights=w, config=cfg16)
irecv_x, _, irecv_w, _, ihandle, _ = iout
timeit("internode cached dispatch", lambda: ibuf.dispatch(x, handle=ihandle, config=cfg16))
timeit("internode combine", lambda: ibuf.combine(irecv_x, ihandle, topk_weights=irecv_w, config=cfg16))

# ---- low latency (2 ranks) -----------------------------------------------------------------------
T, H, ELL = 128, 7168, 8  # few experts keep CPU allocations small; the Python path does not depend on them
llop = low_latency.LowLatencyOp.__new__(low_latency.LowLatencyOp)
llop.rank, llop.num_ranks = 0, R
llop.device = cpu
llop.num_rdma_bytes = 1 << 31
llop.timeout_ns = int(100e9)
llop.idx = 0
llop.errors = errors
llop.error_dev_ptr = 0
llop.num_sms = 132
llop.control = ll_layout.control_offsets(llop.num_rdma_bytes, R)
llop.sym_bytes = llop.control["end"]
llop.sym = 0x10000
llop.peer_bases = torch.tensor([0x10000, 0x20000], dtype=torch.int64)
llop.nvlink_peers = R
llop.pending_recv = [False, False]
llop.workspace = torch.zeros(16 + 65536, dtype=torch.int32)
llop.mask = None
llop.kernels = {n: launcher(f"ep_rt_ll_{n}", abi.LowLatencyParams, 512 if n == "dispatch_send" else 256)
                for n in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")}
llop.dispatch_recv_grid = 264
llop.combine_send_grid = 264
llop.serial = next_serial()
lbuf = buffer_mod.Buffer.__new__(buffer_mod.Buffer)
lbuf.__dict__.update(buf.__dict__)
lbuf._ll = llop
lbuf._ll_on_comm_stream = False
lbuf.nvshmem_qp_depth = 1024
lx = torch.zeros(T, H, dtype=torch.bfloat16)
lidx = torch.stack([torch.randperm(ELL)[:K] for _ in range(T)])
lw = torch.rand(T, K)
timeit("LL dispatch FP8 (eager, no hook)", lambda: lbuf.low_latency_dispatch(lx, lidx, T, ELL))
timeit("LL dispatch FP8 (eager, async_finish)", lambda: lbuf.low_latency_dispatch(lx, lidx, T, ELL,
                                                                                  async_finish=True))


def dispatch_with_hook():
    r = lbuf.low_latency_dispatch(lx, lidx, T, ELL, return_recv_hook=True)
    r[4]()
    return r


timeit("LL dispatch FP8 (return_recv_hook, hook called)", dispatch_with_hook)
recv, count, lhandle, _, _ = lbuf.low_latency_dispatch(lx, lidx, T, ELL)
ly = torch.zeros(ELL // R, R * T, H, dtype=torch.bfloat16)
timeit("LL combine BF16 (eager, no hook)", lambda: lbuf.low_latency_combine(ly, lidx, lw, lhandle))
lout = torch.empty(T, H, dtype=torch.bfloat16)
timeit("LL combine BF16 (eager, out= given)", lambda: lbuf.low_latency_combine(ly, lidx, lw, lhandle, out=lout))
print("\ndone")

# ---- segments: internode dispatch, LL dispatch / combine -----------------------------------------
marks = {}
_orig_ilaunch = internode.InternodeOp._launch
_orig_iwait = internode.InternodeOp._wait_counters


def ilaunch_marked(self, name, grid, stream, **fields):
    _orig_ilaunch(self, name, grid, stream, **fields)
    marks[name] = time.perf_counter()


def iwait_marked(self, token):
    _orig_iwait(self, token)
    marks["counts seen"] = time.perf_counter()


internode.InternodeOp._launch = ilaunch_marked
internode.InternodeOp._wait_counters = iwait_marked
segs = collections.defaultdict(list)
for i in range(3200):
    t0 = time.perf_counter()
    ibuf.dispatch(x, num_tokens_per_rank=pr, num_tokens_per_rdma_rank=pn, is_token_in_rank=ir,
                  num_tokens_per_expert=pe, topk_idx=idx4, topk_weights=w, config=cfg16)
    t1 = time.perf_counter()
    if i >= 200:
        segs["entry -> notify launched"].append(marks["notify"] - t0)
        segs["counts seen -> send launched (GPU idle on this stretch)"].append(marks["send"] - marks["counts seen"])
        segs["send launched -> recv launched"].append(marks["recv"] - marks["send"])
        segs["recv launched -> return"].append(t1 - marks["recv"])
print("\n== internode dispatch, Python time by segment (CUDA stubs), medians:")
for k, v in segs.items():
    print(f"   {statistics.median(v) * 1e6:6.1f} us  {k}")
internode.InternodeOp._launch = _orig_ilaunch
internode.InternodeOp._wait_counters = _orig_iwait

# LL: mark the send launch (cuLaunchKernel) and the receive launch (cuLaunchKernelEx)
def launch_mark(function, grid, block, smem, stream, params_address, name):
    COUNT["cuLaunchKernel"] += 1
    marks["send"] = time.perf_counter()


def launch_ex_mark(config, function, grid, block, smem, stream, params_address, name):
    COUNT["cuLaunchKernelEx"] += 1
    marks["recv"] = time.perf_counter()


driver.launch, driver.launch_ex = launch_mark, launch_ex_mark
for label, fn in (("LL dispatch (eager)", lambda: lbuf.low_latency_dispatch(lx, lidx, T, ELL)),
                  ("LL combine (eager)", lambda: lbuf.low_latency_combine(ly, lidx, lw, lhandle))):
    segs = collections.defaultdict(list)
    for i in range(5200):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if i >= 200:
            segs["entry -> send kernel launched"].append(marks["send"] - t0)
            segs["send launched -> recv launched"].append(marks["recv"] - marks["send"])
            segs["recv launched -> return"].append(t1 - marks["recv"])
    print(f"\n== {label}, Python time by segment (CUDA stubs), medians:")
    for k, v in segs.items():
        print(f"   {statistics.median(v) * 1e6:6.1f} us  {k}")
