"""A trace of what ep_rt's host code asks of CUDA, NVSHMEM and torch.distributed, on the CPU: the real
Buffer.__init__, hot calls and teardown run with every CUDA-, NVSHMEM- and collective-only call replaced by a
recording stub (after /work/shared/tools/host_path_stub.py, which counts the same calls to time them).

Each event is (call, arguments); a kernel launch records its name, grid, block, shared memory, stream, whether it
started early, and every field of its parameter struct. Addresses (host memory, fake device memory, CPU tensors
standing in for device tensors) are numbered in order of first appearance, so two runs of the same code give the
same trace. tests/buffer/test_host_trace.py compares the trace with tests/data/host_trace_golden.json, recorded from the code
before the Buffer refactor of issue 26: same transports, kernels, fields, order and teardown. Re-recorded for issue 23
item 1 (the id check without a device sync), after checking that the new trace equals the old one once the
ep_rt_check_topk_idx launches, LayoutParams' four new fields (error, error_claim, rank, error_phase) and the larger
error page (4 records: 512 bytes, was 384) are taken out, with pointer names renumbered. Re-recorded for issue 22
item 1 (intranode rounds), after checking that the new trace equals the old one once the dispatch and combine
params' new fields (round_rpm, full_rpm, round, token_offset: all 0 in these one-pass calls; CombineParams' pad
became round) are taken out and the host counters' 4116 bytes (one more word, the largest token count) read 4112.
Re-recorded for issue 22 item 2 (one symmetric buffer for both modes), after checking that only "internode + low
latency" changed, and only so: one symmetric allocation (num_rdma_bytes, the internode control area, then the LL
one) instead of two, so the LL control offsets grow by the internode control area's size and one nvshmem free goes;
an ep_rt_ll_barrier on the comm stream before the first LL call after the HT calls (ops/mode_switch.py); an event
recorded after each LL receive hook (where a later HT call's comm stream waits). Re-recorded for issue 23 item 2
(events.wait_stream's fence through the driver), after checking that the new trace equals the old one once each
driver.record_and_wait(event, waitee, waiter) reads as Event.record(waitee) + Stream.wait_event(waiter), the one
Event.record and driver.make_event that make each stream's fence event are taken out, and driver.make_stream events
(one more: the compute stream's CUstream, now made at its first fence) are left out of the comparison.

    python -m tests.host_trace            # print the differences against the golden trace (none: exit 0)
    python -m tests.host_trace --write    # record the golden trace (only from code whose behaviour is the reference)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

GOLDEN = Path(__file__).parent / "data" / "host_trace_golden.json"
MANIFEST = Path(__file__).resolve().parent.parent / "cubins" / "manifest.json"
CPU = torch.device("cpu")
ADDRESS_MIN = 1 << 40  # below: sizes, counts, timeouts in ns (at most ~1e12 here); above: an address


class Trace:
    def __init__(self):
        self.events: list = []
        self.names: dict[int, str] = {}

    def norm(self, v):
        if isinstance(v, bool) or v is None or isinstance(v, (str, float)):
            return v
        if isinstance(v, int):
            if v >= ADDRESS_MIN:
                return self.names.setdefault(v, f"@{len(self.names)}")
            return v
        if isinstance(v, torch.device):
            return str(v)
        if isinstance(v, torch.dtype):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [self.norm(x) for x in v]
        if isinstance(v, dict):
            return {str(k): self.norm(x) for k, x in v.items()}
        if isinstance(v, FakeStream):
            return f"stream:{v.name}"
        if isinstance(v, ctypes.Structure):
            return struct_fields(v, self)
        if isinstance(v, ctypes.Array):
            return [self.norm(x) for x in v]
        if isinstance(v, bytes):
            return v.hex()
        return type(v).__name__

    def add(self, call, *args):
        self.events.append([call, *[self.norm(a) for a in args]])


def struct_fields(s, trace):
    out = {}
    for f in s._fields_:
        name = f[0]
        out[name] = trace.norm(getattr(s, name))
    return out


class FakeStream:
    def __init__(self, trace, name, handle):
        self.trace, self.name, self.cuda_stream = trace, name, handle
        self.device_index = 0

    def wait_stream(self, other):
        self.trace.add("Stream.wait_stream", self, other)

    def wait_event(self, ev):
        self.trace.add("Stream.wait_event", self)

    def synchronize(self):
        self.trace.add("Stream.synchronize", self)


def shipped_blocks(family: str) -> dict:
    """{kernel: block size} of a family as the shipped manifest records it (from the compiled cubins): the fake
    cubins' entries carry these, so the trace's launches take their blocks from where the real ones do."""
    blocks: dict = {}
    for entry in json.loads(MANIFEST.read_text())["cubins"]:
        if entry["family"] == family:
            for name, block in entry.get("blocks", {}).items():
                assert blocks.setdefault(name, block) == block, f"{entry['path']}: {name} has another block size"
    return blocks


class FakeModule:
    def __init__(self, trace, entry):
        self.trace, self.entry, self.handle = trace, entry, entry["path"]

    def function(self, name):
        self.trace.add("module.function", self.entry["path"], name)
        return name

    def global_address(self, name):
        # modules.requested_dynamic_smem: the traced variants declare none (only the tma combine does)
        if name.endswith("_dynamic_smem"):
            from ep_rt.errors import CudaDriverError

            raise CudaDriverError(f"cuModuleGetGlobal({name}) failed: CUDA_ERROR_NOT_FOUND (named symbol not found)")
        raise AssertionError("the default variant has no chaos counters")


_PARAMS = (
    ("ep_rt_intranode_notify", "NotifyParams"),
    ("ep_rt_intranode_dispatch", "DispatchParams"),
    ("ep_rt_intranode_combine", "CombineParams"),
    ("ep_rt_intranode_barrier", "BarrierParams"),
    ("ep_rt_get_dispatch_layout", "LayoutParams"),
    ("ep_rt_check_topk_idx", "LayoutParams"),
    ("ep_rt_internode_", "InternodeParams"),
    ("ep_rt_ll_", "LowLatencyParams"),
)

# What the notify kernels "publish" to the host on the CPU: every rank receives ROWS rows, each local expert 3.
ROWS = 24


def rows_everywhere(p):
    """What an internode notify publishes: (rows received, rows forwarded, longest stream, most rows received), each
    ROWS (a test of calls in rounds replaces it)."""
    return ROWS, ROWS, ROWS, ROWS


INTERNODE_COUNTS = rows_everywhere
# Every stand-in device tensor is kept alive for the trace (see on_cpu); a test of the host path's own memory turns
# this off once its Buffer is built, and records no trace.
KEEP_TENSORS = True


@contextlib.contextmanager
def stubs(trace: Trace, topology, rank: int, size: int, gate=None):
    """Everything the Buffer's host code calls that needs a GPU, NVSHMEM or peers, recorded into `trace`. gate: a
    threading.Event; the notify kernels then publish the host counters only once it is set (a late peer: the host
    waits meanwhile). It is set when the stubs end, so no publication outlives the memory it writes."""
    from ep_rt import buffer as buffer_mod
    from ep_rt.runtime import abi, driver, launch, modules
    from ep_rt.transport import nvshmem, topology as topology_mod

    keep = []  # host memory handed out as "mapped" (host pointer = device pointer)
    fake = {"next": 0x6000_0000_0000}
    compute = FakeStream(trace, "compute", 0x11)
    comm_streams = []

    def fake_ptr():
        fake["next"] += 0x1_0000_0000
        return fake["next"]

    def rec(name, result=None):
        def f(*a, **k):
            trace.add(f"driver.{name}", *a, *k.values())
            return result() if callable(result) else result

        return f

    def host_alloc_mapped(nbytes):
        buf = ctypes.create_string_buffer(nbytes)
        keep.append(buf)
        trace.add("driver.host_alloc_mapped", nbytes, ctypes.addressof(buf))
        return ctypes.addressof(buf), ctypes.addressof(buf)

    def params_of(name, address):
        struct_address = ctypes.c_void_p.from_address(address).value
        for prefix, type_name in _PARAMS:
            if name.startswith(prefix):
                return getattr(abi, type_name).from_address(struct_address)
        raise AssertionError(f"no parameter struct known for {name}")

    def publish(name, p):
        """The notify kernels write the host counters under the host token (what the host waits for)."""
        if name == "ep_rt_intranode_notify" and p.host_token:
            c = (ctypes.c_int32 * abi.EP_RT_HOST_COUNTER_WORDS).from_address(p.host_counters)
            c[abi.EP_RT_HOST_NUM_RECV] = ROWS
            c[abi.EP_RT_HOST_MAX_DISPATCH_ROWS] = c[abi.EP_RT_HOST_MAX_COMBINE_ROWS] = ROWS
            c[abi.EP_RT_HOST_MAX_TOKENS] = p.num_tokens  # (every rank has this rank's tokens)
            for i in range(p.num_experts // p.num_ranks):
                c[abi.EP_RT_HOST_EXPERT_COUNTS + i] = 3
            c[abi.EP_RT_HOST_TOKEN] = p.host_token
        if name == "ep_rt_internode_notify" and p.host_token:
            c = (ctypes.c_int32 * abi.EP_RT_IN_HOST_WORDS).from_address(p.host_counters)
            counts = INTERNODE_COUNTS(p)
            c[abi.EP_RT_IN_HOST_NUM_RECV], c[abi.EP_RT_IN_HOST_NUM_RDMA_RECV] = counts[0], counts[1]
            c[abi.EP_RT_IN_HOST_MAX_STREAM], c[abi.EP_RT_IN_HOST_MAX_RECV] = counts[2], counts[3]
            c[abi.EP_RT_IN_HOST_MAX_FWD] = counts[1]
            for i in range(p.num_experts // p.num_ranks):
                c[abi.EP_RT_IN_HOST_EXPERT_COUNTS + i] = 3
            c[abi.EP_RT_IN_HOST_TOKEN] = p.host_token

    publishers = []

    def do_launch(kind, config, function, grid, block, smem, stream, address, name):
        p = params_of(name, address)
        trace.add(kind, name, grid, block, smem, stream, config, p)
        if gate is None or gate.is_set():
            publish(name, p)
        else:
            copy = type(p).from_buffer_copy(p)  # (the launcher reuses its struct)
            publishers.append(threading.Thread(target=lambda: gate.wait() and publish(name, copy), daemon=True))
            publishers[-1].start()

    def make_launch_config(cooperative, cluster, programmatic=False):
        trace.add("driver.make_launch_config", cooperative, cluster, programmatic)
        return {"programmatic": programmatic, "cooperative": cooperative, "cluster": cluster}

    def stream_ctor(device=None, priority=0):
        s = FakeStream(trace, f"comm{len(comm_streams)}", 0x20 + len(comm_streams))
        comm_streams.append(s)
        trace.add("torch.cuda.Stream", device, priority)
        return s

    def on_cpu(real):
        """Device tensors become CPU tensors, all kept alive for the trace: no two of them share an address, so
        numbering addresses by first appearance is the same from run to run."""

        def f(*a, **k):
            dev = k.get("device")
            if dev is not None and torch.device(dev).type == "cuda":
                k["device"] = CPU
            t = real(*a, **k)
            if KEEP_TENSORS:
                keep.append(t)
            return t

        return f

    @contextlib.contextmanager
    def stream_ctx(s):
        yield

    class Event:
        def __init__(self, *a, **k):
            trace.add("torch.cuda.Event")

        def record(self, stream=None):
            trace.add("Event.record", stream)

        cuda_event = 0x30  # (events.wait_stream hands it to the driver's calls: stubbed below)

    def entry(family, nvshmem_linked):
        return {
            "family": family,
            "path": f"fake/{family}.cubin",
            "variant": "default",
            "needs_nvshmem": nvshmem_linked,
            "nvshmem": "3.4.5" if nvshmem_linked else None,
            "flavour": "cu13",
            "kernels": [],
            "blocks": shipped_blocks(family),
        }

    def load_family(device_index, family, aggressive=None):
        trace.add("modules.load_family", device_index, family)
        return FakeModule(trace, entry(family, False))

    def load_entry(device_index, e):
        trace.add("modules.load_entry", device_index, e["family"])
        return FakeModule(trace, e)

    def choose_entry(manifest, family, device_index, aggressive, flavour=None, chaos=None, packed=None):
        trace.add("modules.choose_entry", family, device_index, aggressive, flavour)
        return entry(family, True)

    def prepare(group, topo, wanted, device_version, num_qps_per_rank, allow_nvlink, allow_mnnvl):
        trace.add(
            "nvshmem.prepare",
            [wanted.kind, wanted.npes, wanted.my_pe, wanted.pe_base, wanted.pe_stride],
            device_version,
            num_qps_per_rank,
            allow_nvlink,
            allow_mnnvl,
        )
        plan = SimpleNamespace(ibgda_peers=topo.num_nodes > 1, qp_depth=1024)
        return SimpleNamespace(plan=plan, world=wanted, shared_values=lambda: {"NVSHMEM world": wanted.kind})

    class Session:
        error_slot = "nvshmem"  # as transport.nvshmem.NvshmemSession's (the code before issue 26 set it on the part)

        def __init__(self, group, prep, topo):
            trace.add("NvshmemSession", prep.world.kind)
            self.plan, self.qp_depth, self.world = prep.plan, prep.plan.qp_depth, prep.world
            self.pe_base, self.pe_stride = prep.world.pe_base, prep.world.pe_stride

        def pe_of_rank(self, r):
            return self.world.pe_of_rank(r)

        def register(self, module):
            trace.add("NvshmemSession.register", module.entry["family"])

        def destroy(self, collective):
            trace.add("NvshmemSession.destroy", collective)

    def all_gather_object(table, obj, group=None):
        trace.add("dist.all_gather_object", repr(obj) if not isinstance(obj, bytes) else obj)
        for r in range(size):
            table[r] = obj

    from ep_rt import events as events_mod

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "current_device", lambda: 0)
        mp.setattr(torch.cuda, "Stream", stream_ctor)
        mp.setattr(torch.cuda, "current_stream", lambda device=None: compute)
        mp.setattr(torch.cuda, "stream", stream_ctx)
        mp.setattr(torch.cuda, "Event", Event)
        mp.setattr(events_mod, "_stream_of_device", None)  # (events.current_stream: torch's way, patched above)
        mp.setattr(events_mod, "_fences", {})  # (events.wait_stream caches an event per stream: one per trace)
        mp.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        mp.setattr(torch.cuda, "synchronize", lambda device=None: trace.add("torch.cuda.synchronize", device))
        mp.setattr(torch.Tensor, "record_stream", lambda t, s: trace.add("Tensor.record_stream", t.data_ptr(), s))
        for name in ("empty", "empty_strided", "zeros", "tensor"):
            mp.setattr(torch, name, on_cpu(getattr(torch, name)))
        for name, result in (
            ("ensure_context", None),
            ("compute_capability", (9, 0)),
            ("multiprocessor_count", 132),
            ("memset_d8", None),
            ("memset_d32_async", None),
            ("ctx_synchronize", None),
            ("host_free", None),
            ("mem_free", None),
            ("ipc_close_handle", None),
            ("set_max_dynamic_smem", None),
            ("max_active_blocks", 2),
            ("module_unload", None),
            ("pci_bus_id", "0000:00:00.0"),
        ):
            mp.setattr(driver, name, rec(name, result))
        mp.setattr(driver, "mem_alloc", rec("mem_alloc", fake_ptr))
        mp.setattr(driver, "ipc_get_handle", lambda ptr: trace.add("driver.ipc_get_handle", ptr) or b"h%d" % rank)
        mp.setattr(driver, "ipc_open_handle", rec("ipc_open_handle", fake_ptr))
        mp.setattr(driver, "host_alloc_mapped", host_alloc_mapped)
        mp.setattr(driver, "make_stream", lambda handle: trace.add("driver.make_stream", handle) or handle)
        mp.setattr(driver, "make_event", lambda handle: trace.add("driver.make_event", handle) or handle)
        mp.setattr(driver, "record_and_wait", lambda ev, s, w: trace.add("driver.record_and_wait", ev, s, w))
        mp.setattr(driver, "make_launch_config", make_launch_config)
        mp.setattr(driver, "launch", lambda *a: do_launch("launch", None, *a))
        mp.setattr(driver, "launch_ex", lambda c, *a: do_launch("launch_ex", c, *a))
        mp.setattr(launch, "_streams", {})
        mp.setattr(modules, "load_family", load_family)
        mp.setattr(modules, "load_entry", load_entry)
        mp.setattr(modules, "choose_entry", choose_entry)
        mp.setattr(modules, "manifest", lambda: {"cubins": []})
        mp.setattr(nvshmem, "host_flavour", lambda: "cu13")
        mp.setattr(nvshmem, "host_version", lambda: "3.4.5")
        mp.setattr(nvshmem, "check_compatible", lambda v, ibgda: trace.add("nvshmem.check_compatible", v, ibgda))
        mp.setattr(nvshmem, "prepare", prepare)
        mp.setattr(nvshmem, "NvshmemSession", Session)
        mp.setattr(nvshmem, "align", rec("nvshmem.align", fake_ptr))
        mp.setattr(nvshmem, "barrier_all", rec("nvshmem.barrier_all"))
        mp.setattr(nvshmem, "free", rec("nvshmem.free"))
        mp.setattr(nvshmem, "peer_ptr", lambda sym, pe: trace.add("nvshmem.peer_ptr", sym, pe) or sym + (pe << 20))
        mp.setattr(buffer_mod.Topology, "gather", classmethod(lambda cls, group, bus: topology))
        mp.setattr(dist, "get_rank", lambda group=None: rank)
        mp.setattr(dist, "get_world_size", lambda group=None: size)
        mp.setattr(dist, "get_global_rank", lambda group, r: r)
        mp.setattr(dist, "all_gather_object", all_gather_object)
        mp.setattr(topology_mod, "nvlink_problems", lambda bus_ids: trace.add("nvlink_problems", bus_ids) or [])
        mp.setenv("EP_RT_TIMEOUT_S", "100")
        for knob in ("EP_RT_NET_TIMEOUT_S", "EP_RT_RANKS_PER_NODE", "EP_RT_AGGRESSIVE_PTX", "EP_RT_CONFIG_FILE"):
            mp.delenv(knob, raising=False)
        try:
            yield
        finally:
            if gate is not None:
                gate.set()
                for t in publishers:
                    t.join()


# ---- the scenarios: a Buffer built, its hot calls, its teardown -------------------------------------------------

SCENARIOS = {
    # name: (nodes, ranks per node, rank, Buffer keyword arguments)
    "intranode": (1, 2, 0, dict(num_nvl_bytes=1 << 22)),
    "intranode, finalizer teardown": (1, 2, 1, dict(num_nvl_bytes=1 << 22, explicitly_destroy=False)),
    "intranode + low latency": (1, 2, 0, dict(num_nvl_bytes=1 << 22, num_rdma_bytes=1 << 22, low_latency_mode=True)),
    "low latency, shrink, no NVL": (
        1,
        2,
        1,
        dict(
            num_rdma_bytes=1 << 22, low_latency_mode=True, enable_shrink=True, allow_nvlink_for_low_latency_mode=False
        ),
    ),
    "internode": (2, 2, 1, dict(num_nvl_bytes=1 << 24, num_rdma_bytes=1 << 24, timeout_s=30.0)),
    "internode + low latency": (
        2,
        2,
        2,
        dict(num_nvl_bytes=1 << 24, num_rdma_bytes=1 << 24, low_latency_mode=True, num_qps_per_rank=20),
    ),
    "low latency across nodes (no HT)": (2, 2, 3, dict(num_rdma_bytes=1 << 22, low_latency_mode=True)),
}

H, K, E, N = 256, 4, 8, 6  # hidden, top-k, experts, tokens per rank


def _inputs(R):
    """Made with torch.zeros (kept alive by the stubs, see on_cpu) and filled in place."""
    g = torch.Generator().manual_seed(7)
    idx = torch.zeros(N, K, dtype=torch.int64)
    idx.copy_(torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(N)]))
    idx[0, 1] = -1
    x = torch.zeros(N, H, dtype=torch.bfloat16)
    x.copy_(torch.randn(N, H, generator=g))
    w = torch.zeros(N, K)
    w.copy_(torch.rand(N, K, generator=g))
    fp8 = (torch.zeros(N, H, dtype=torch.float8_e4m3fn), torch.zeros(N, H // 128))
    fp8[0].copy_(x)
    fp8[1].copy_(torch.rand(N, H // 128, generator=g))
    return idx, x, w, fp8


def refused(trace, call, *args, **kwargs):
    """A call that must raise: its error's type and message are part of the trace."""
    try:
        call(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (any error is recorded, none expected to pass)
        trace.add("refused", type(e).__name__, str(e))
    else:
        trace.add("not refused", getattr(call, "__name__", "?"))


def _ht_calls(trace, buf):
    from ep_rt import Buffer, Config

    R = buf.group_size
    idx, x, w, fp8 = _inputs(R)
    mark = lambda what: trace.add("call", what)  # noqa: E731
    mark("get_dispatch_layout")
    per_rank, per_node, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    mark("get_dispatch_layout async")
    buf.get_dispatch_layout(idx, E, previous_event=Buffer.capture(), async_finish=True)
    cfg = Config(4, 6, 256, 6, 128)
    common = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    if per_node is not None:
        common["num_tokens_per_rdma_rank"] = per_node
    mark("dispatch bf16")
    recv_x, _, recv_w, counts, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, config=cfg, **common)
    trace.add("result", counts, list(recv_x.shape))
    mark("dispatch fp8, config=None, async")
    buf.dispatch(fp8, topk_idx=idx, topk_weights=w, async_finish=True, **common)
    mark("dispatch num_worst_tokens")
    buf.dispatch(x, topk_idx=idx, topk_weights=w, config=cfg, num_worst_tokens=32, **common)
    mark("dispatch without top-k")
    buf.dispatch(x, config=cfg, **common)
    mark("cached dispatch")
    buf.dispatch(x, handle=handle, config=cfg)
    mark("cached dispatch fp8 from a plain tuple")
    buf.dispatch(fp8, handle=tuple(handle), config=cfg)
    mark("combine")
    buf.combine(recv_x, handle, topk_weights=recv_w)
    mark("combine with bias, async, allocate_on_comm_stream")
    bias = torch.zeros(N, H, dtype=torch.bfloat16)
    buf.combine(
        recv_x,
        tuple(handle),
        bias=(bias, bias),
        previous_event=Buffer.capture(),
        async_finish=True,
        allocate_on_comm_stream=True,
    )
    if buf.is_internode:
        mark("internode_dispatch / internode_combine")
        buf.internode_dispatch(x, topk_idx=idx, topk_weights=w, config=cfg, **common)
        buf.internode_combine(recv_x, handle)
        mark("internode_barrier")
        buf.internode_barrier(buf.get_comm_stream())
    else:
        refused(trace, buf.internode_dispatch, x, topk_idx=idx, topk_weights=w, config=cfg, **common)
        refused(trace, buf.internode_combine, recv_x, handle)
        refused(trace, buf.internode_barrier, buf.get_comm_stream())
    refused(trace, buf.combine, recv_x, handle[:-1])
    refused(trace, buf.dispatch, x, handle=handle, topk_idx=idx, config=cfg)
    refused(trace, buf.get_local_buffer_tensor, torch.int32, None, 1 << 40)
    mark("nvl_barrier")
    buf.nvl_barrier(buf.get_comm_stream(), synchronize=False)

    class Timer:
        def around(self, name, stream, launch):
            trace.add("timer.around", name, stream)
            launch()

    mark("timed dispatch and combine")
    buf.set_kernel_timer(Timer())
    recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, config=cfg, **common)
    buf.combine(recv_x, handle)
    buf.set_kernel_timer(None)
    trace.add("ht_serial is an int", isinstance(buf.ht_serial, int))


def _ll_calls(trace, buf):
    mark = lambda what: trace.add("call", what)  # noqa: E731
    R = buf.group_size
    T = 8
    idx, x, w, _ = _inputs(R)
    mark("low_latency_dispatch fp8")
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E)
    mark("low_latency_dispatch bf16 with hook")
    recv, count, handle, _, hook = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False, return_recv_hook=True)
    hook()
    mark("low_latency_dispatch ue8m0 async")
    buf.low_latency_dispatch(
        torch.zeros(N, 512, dtype=torch.bfloat16), idx, T, E, round_scale=True, use_ue8m0=True, async_finish=True
    )
    y = torch.zeros(E // R, R * T, H, dtype=torch.bfloat16)
    mark("low_latency_combine")
    buf.low_latency_combine(y, idx, w, handle)
    mark("low_latency_combine logfmt with hook, out=")
    _, _, hook = buf.low_latency_combine(
        y, idx, w, handle, use_logfmt=True, return_recv_hook=True, out=torch.empty(N, H, dtype=torch.bfloat16)
    )
    hook()
    refused(trace, buf.low_latency_combine, y, idx, w, handle, use_logfmt=True, zero_copy=True)
    refused(trace, buf.low_latency_dispatch, x, idx, T, E, async_finish=True, return_recv_hook=True)
    mark("clean_low_latency_buffer")
    buf.clean_low_latency_buffer(T, H, E)
    if buf.enable_shrink:
        mark("mask buffers")
        buf.low_latency_update_mask_buffer(0, True)
        status = torch.zeros(R, dtype=torch.int32)
        buf.low_latency_query_mask_buffer(status)
        trace.add("mask", status.tolist())
        buf.low_latency_clean_mask_buffer()


def scenario(name: str):
    """(topology, rank, ranks, Buffer keyword arguments) of scenario `name`."""
    from ep_rt.transport.topology import Topology

    nodes, G, rank, kwargs = SCENARIOS[name]
    R = nodes * G
    topo = Topology.from_table(rank, [f"h{r // G}" for r in range(R)], [f"b{r}" for r in range(R)])
    return topo, rank, R, {"explicitly_destroy": True, **kwargs}


def build(kwargs):
    """A Buffer made under the stubs (a fake group), its device set to the CPU's."""
    from ep_rt import Buffer

    buf = Buffer(object(), **kwargs)
    # The stand-in device tensors are CPU tensors; the argument checks compare devices.
    buf.device = CPU
    for part in (getattr(buf, "_ll", None), getattr(buf, "_ht", None)):
        if part is not None and hasattr(part, "device"):
            part.device = CPU
    return buf


@contextlib.contextmanager
def driven(name: str, gate=None):
    """The stubs of scenario `name`, on while the caller drives Buffers in them: yields (trace, make), make() building
    a Buffer of the scenario (as often as the caller likes)."""
    topo, rank, R, kwargs = scenario(name)
    trace = Trace()
    with stubs(trace, topo, rank, R, gate):
        yield trace, lambda: build(kwargs)


def ht_inputs(buf):
    """(x, topk_idx, topk_weights, the layout arguments of dispatch) for scenario Buffers (the layout call runs)."""
    idx, x, w, _ = _inputs(buf.group_size)
    per_rank, per_node, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    common = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    if per_node is not None:
        common["num_tokens_per_rdma_rank"] = per_node
    return x, idx, w, common


def run_scenario(name: str, inspect=None) -> list:
    """The trace of scenario `name`; inspect(buffer), if given, runs right after construction (stubs still on)."""
    topo, rank, R, kwargs = scenario(name)
    trace = Trace()
    with stubs(trace, topo, rank, R):
        trace.add("call", "Buffer()")
        buf = build(kwargs)
        if inspect is not None:
            inspect(buf)
        trace.add(
            "state",
            buf.is_internode,
            buf.low_latency_mode,
            buf.runtime.get_num_rdma_ranks(),
            buf.runtime.is_internode_available(),
        )
        if buf.num_nvl_bytes:
            _ht_calls(trace, buf)
        if buf.low_latency_mode:
            _ll_calls(trace, buf)
        trace.add("call", "teardown")
        if buf.explicitly_destroy:
            buf.destroy()
        else:
            buf.__del__()
    return trace.events


def run_all() -> dict:
    return {name: run_scenario(name) for name in SCENARIOS}


def differences(got: dict, want: dict) -> list:
    out = []
    for name in sorted(set(got) | set(want)):
        a, b = got.get(name), want.get(name)
        if a == b:
            continue
        if a is None or b is None:
            out.append(f"{name}: only in {'golden' if a is None else 'this run'}")
            continue
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                out.append(
                    f"{name}: event {i} differs:\n  now:    {json.dumps(x)[:600]}\n  golden: {json.dumps(y)[:600]}"
                )
                break
        else:
            out.append(f"{name}: {len(a)} events now, {len(b)} in the golden trace")
    return out


def main(argv) -> int:
    got = run_all()
    if "--write" in argv:
        lines = [
            f"{json.dumps(name)}: [\n" + ",\n".join(json.dumps(e, sort_keys=True) for e in events) + "\n]"
            for name, events in sorted(got.items())
        ]
        GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one event a line: readable diffs
        print(f"wrote {GOLDEN} ({sum(len(v) for v in got.values())} events)")
        return 0
    diffs = differences(got, json.loads(GOLDEN.read_text()))
    print("\n".join(diffs) or f"same trace ({sum(len(v) for v in got.values())} events)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
