"""Benchmarks of the high-throughput path in DeepEP's formulas (docs/PERF.md of the project brief).

Kernel time: CUDA events on the comm stream around each kernel (notify excluded from "dispatch", as
DeepEP reports it), median over iterations after warm-up, L2 flushed (256 MB write) before each
iteration, inputs rotated. Whole-call time: events on the caller's stream around the Python call,
what a user waits for (includes the notify kernel and the host reading the receive count).

Network operation counts (the chaos cubins only, EP_RT_CHAOS_TRANSPORT=1): the LL and internode rows also carry what
the chaos transport counted per call (Buffer.network_operation_counts), from untimed calls made after the timing: a
count is read by syncing the device, and the timed loops mix in calls (line-ups, barriers, the other LL workloads)
whose operations the module's counters would add to the row's.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from .. import reference
from ..config import Config


@dataclass
class BenchRow:
    name: str
    num_sms: int
    kernel_us: float
    notify_us: float
    call_us: float  # lined up: the Python before the first launch runs under a sleep, as when the host is ahead
    host_us: float  # the call's Python, waits included, with the GPU idle when it starts (no line-up)
    gbps: float
    num_recv: int
    caller_us: float = float("nan")  # events around those calls: the host's Python, waits and kernels in a row


class KernelTimer:
    """Plugged into IntranodeOp: events recorded on the launch stream around each kernel."""

    def __init__(self):
        self.pending = []

    def around(self, name, stream, launch):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        launch()
        end.record(stream)
        self.pending.append((name, start, end))

    def collect(self) -> dict:
        out = {}
        for name, start, end in self.pending:
            out.setdefault(name, []).append(start.elapsed_time(end) * 1000.0)
        self.pending = []
        return out


# ---- network operation counts (the chaos transport's cost mode) ------------------------------------------------------
CHAOS_NOTE = (
    "chaos transport (EP_RT_CHAOS_TRANSPORT=1): these times are not network timings, they include its delays and "
    "charged sweeps; the network counts are per call, from untimed calls after the timing"
)


def network_ops_per_call(buffer, op: str, call, calls: int) -> Optional[dict]:
    """What the chaos transport counts per call of `call` for the Buffer's `op` ("internode" or "low_latency"):
    the counters zeroed, `calls` untimed calls made, the counters read, the totals divided by `calls`. Zeroing and
    reading sync the device, so the benchmarks count after their timed loops, never inside one. None with the
    normal cubins (they count nothing), and then no call is made."""
    if buffer.network_operation_counts(reset=True) is None:
        return None
    for _ in range(calls):
        call()
    totals = buffer.network_operation_counts()[op]
    return {name: value / calls for name, value in totals.items()}


def _count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def format_network(counts: dict, rank) -> str:
    """The line under a row with network counts: the operations of one call, its bytes and its charged sweeps."""
    c = counts
    return (
        f"rank {rank}:   network per call: {_count(c['put_signals'])} put-with-signal, {_count(c['signals'])} signal, "
        f"{_count(c['quiets'])} quiet, {_count(c['fences'])} fence, {c['bytes'] / 1e6:.2f} MB, "
        f"{c['charged_ns'] / 1e3:.1f} us charged"
    )


def ht_inputs(num_tokens, hidden, num_topk, num_experts, device, copies=2, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(copies):
        x = torch.randn(num_tokens, hidden, device=device, generator=g).to(torch.bfloat16)
        scores = torch.rand(num_tokens, num_experts, device=device, generator=g)
        idx = torch.topk(scores, num_topk, dim=1).indices
        w = torch.rand(num_tokens, num_topk, device=device, generator=g)
        sets.append((x, reference.per_token_cast_to_fp8(x), idx, w))
    return sets


HT_WORKLOADS = ("dispatch BF16", "dispatch FP8", "combine BF16")


def bench_ht(
    buffer,
    num_tokens=4096,
    hidden=7168,
    num_topk=8,
    num_experts=256,
    num_sms=24,
    warmup=5,
    iters=30,
    workloads=HT_WORKLOADS,
):
    """Dispatch BF16, dispatch FP8 and combine (of a BF16 dispatch's rows) on the HT reference workload, or those of
    `workloads`; one row each. Kernel times come from events around each kernel, after an L2 flush and a device
    barrier that starts both ranks together; host time from calls without that line-up."""
    unknown = [w for w in workloads if w not in HT_WORKLOADS]
    if unknown:
        raise ValueError(f"unknown HT workloads {unknown}; known: {list(HT_WORKLOADS)}")
    dev = buffer.device
    config = Config(num_sms, 6, 256, 6, 128)
    sets = ht_inputs(num_tokens, hidden, num_topk, num_experts, dev)
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
    timer = KernelTimer()
    rows = []

    def one_call(name, it, lined_up):
        """One timed call: (kernel times by name, call us from events, host us, received rows)."""
        x, x_fp8, idx, w = sets[it % len(sets)]
        per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, num_experts)
        args = dict(
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
            config=config,
        )
        if name.startswith("combine"):
            recv_x, _, recv_w, _, handle, _ = buffer.dispatch(x, **args)
        flush.zero_()
        torch.cuda.synchronize()
        if lined_up:
            # Line the ranks' GPUs up: a sleep covers this host's enqueueing, then a device barrier releases both
            # GPUs together, so a kernel that waits for its peer is not charged for the other host arriving late
            # (a dispatch's hosts then also get their counts, and launch the dispatch kernel, together).
            torch.cuda._sleep(_SLEEP_CYCLES_COVER)
            buffer.nvl_barrier(torch.cuda.current_stream(), synchronize=False)
        buffer.set_kernel_timer(timer)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        if name == "dispatch BF16":
            recv = buffer.dispatch(x, **args)[0]
        elif name == "dispatch FP8":
            recv = buffer.dispatch(x_fp8, **args)[0][0]
        else:
            buffer.combine(recv_x, handle, topk_weights=recv_w, config=config)
            recv = recv_x
        end.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        buffer.set_kernel_timer(None)
        return timer.collect(), start.elapsed_time(end) * 1000.0, (t1 - t0) * 1e6, recv.size(0)

    for name in workloads:
        samples, calls, num_recv = {}, [], 0
        for it in range(warmup + iters):
            got, call_us, _, num_recv = one_call(name, it, lined_up=True)
            if it >= warmup:
                for k, v in got.items():
                    samples.setdefault(k, []).extend(v)
                calls.append(call_us)
        # Without the line-up (whose sleep a dispatch would wait through for its counts), the GPU idle when each
        # call starts: its host time, and its events (what a caller waits for from the call's first line).
        unlined = [one_call(name, it, lined_up=False) for it in range(iters)]
        hosts, callers = [u[2] for u in unlined], [u[1] for u in unlined]
        kernel_name = "combine" if name.startswith("combine") else "dispatch"
        kernel_us = statistics.median(samples[kernel_name])
        notify_us = statistics.median(samples["notify"]) if "notify" in samples else 0.0
        bytes_moved = num_recv * hidden * 2
        if name == "dispatch FP8":
            bytes_moved = bytes_moved * (1 + 4 / 128) / 2
        rows.append(
            BenchRow(
                name,
                num_sms,
                kernel_us,
                notify_us,
                statistics.median(calls),
                statistics.median(hosts),
                bytes_moved / kernel_us / 1e3,
                num_recv,
                statistics.median(callers),
            )
        )
    return rows


def format_rows(rows, rank) -> str:
    lines = [
        f"rank {rank}: {'workload':<14} {'SMs':>4} {'kernel us':>10} {'GB/s':>8} {'notify us':>10} "
        f"{'call us':>9} {'host us':>8} {'caller us':>10} {'recv tokens':>11}"
    ]
    for r in rows:
        lines.append(
            f"rank {rank}: {r.name:<14} {r.num_sms:>4} {r.kernel_us:>10.1f} {r.gbps:>8.1f} "
            f"{r.notify_us:>10.1f} {r.call_us:>9.1f} {r.host_us:>8.1f} {r.caller_us:>10.1f} {r.num_recv:>11}"
        )
    return "\n".join(lines)


_SLEEP_CYCLES_COVER = 4_000_000  # ~2 ms of GPU work: covers the host enqueueing everything timed after it
_SLEEP_CYCLES_GAP = 400_000  # ~200 us between a send half and its receive half: the peers' sends land


def ll_inputs(num_tokens, hidden, num_topk, num_experts, num_ranks, device, seed):
    """The LL reference workload: bf16 tokens, top-k of random scores, weights, expert outputs (plain, and scaled
    so every LogFMT division is castable, as expert outputs mostly are)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(num_tokens, hidden, device=device, generator=g).to(torch.bfloat16)
    idx = torch.topk(torch.rand(num_tokens, num_experts, device=device, generator=g), num_topk, dim=1).indices
    w = torch.rand(num_tokens, num_topk, device=device, generator=g)
    L = num_experts // num_ranks
    y = torch.randn(L, num_ranks * num_tokens, hidden, device=device, generator=g).to(torch.bfloat16)
    y_castable = (0.05 * y.float()).to(torch.bfloat16)
    return x, idx, w, y, y_castable


LL_OPS = (("dispatch", "LL dispatch FP8"), ("combine", "LL combine BF16"), ("logfmt", "LL combine LogFMT"))
# What one round launches, as calls: 3 hook calls (send kernel, receive kernel), then 2 line-up calls, 3 timed
# whole calls and 3 calls timed as the caller sees them; each whole call is one kernel (ep_rt_ll_dispatch /
# ep_rt_ll_combine), or a send and a receive kernel under EP_RT_LL_TWO_KERNELS.
_ROUND_HOOK_CALLS, _ROUND_CALLS = 3, 3 + 2 + 3 + 3
_ROUND_KERNEL_CALLS = range(5, 8)  # the whole calls timed as "kernel"
_LOOP_WARMUP = 5  # untimed iterations of the back-to-back loop


def bench_ll(buffer, num_tokens=128, hidden=7168, num_topk=8, num_experts=288, warmup=10, iters=50, profiled_iters=20):
    """LL dispatch (FP8), combine and LogFMT combine (medians) at one shape: bench_ll_shapes for one expert count."""
    return bench_ll_shapes(buffer, (num_experts,), num_tokens, hidden, num_topk, warmup, iters, profiled_iters)


def bench_ll_shapes(
    buffer, expert_counts, num_tokens=128, hidden=7168, num_topk=8, warmup=10, iters=50, profiled_iters=20
):
    """LL dispatch (FP8), combine and LogFMT combine (medians), each expert count in turn; its rows in that order.
    Every timing of every shape comes before the first profiler session, so no session can touch a timing (kineto
    may leave CUPTI attached after one ends: pytorch/pytorch#144455). That was suspected of the 256-expert rows'
    higher host times, and refuted: they stayed higher with no session before them (2026-12-06, 7e4c572).

    Each round runs:

    * the hook halves, DeepEP's method: the send kernel, then ~200 us of other GPU work (DeepEP runs a GEMM) so
      the peers' data has landed, then the receive kernel (the hook);
    * an untimed dispatch + combine that lines the ranks' GPUs up (its receives wait for every peer's send);
    * whole non-hook calls (one kernel on the comm stream, or two with EP_RT_LL_TWO_KERNELS, including the wait for
      the peers), a sleep kernel covering the host's enqueueing: "kernel" time, what DeepEP's one-kernel time
      compares to;
    * whole calls without a covering sleep: "call" time, what a caller waits for (Python included), right after
      a barrier and a device sync (the CPU had been waiting), with "host" the calls' own Python.
    After the rounds, "loop": the three calls back to back `iters` times with no barrier or sync between them, as a
    decode loop makes them, each timed by events on the caller's stream (a call whose host is slower than the GPU
    spans its host time; one queued behind GPU work spans its GPU time) and by perf_counter ("loop host").
    Times come from CUDA events and, in extra rounds under the torch profiler (profiled_iters of them; 0: none),
    from the kernels' own start and end (as DeepEP's kineto numbers: no event or launch gaps; a whole call spans
    send start to receive end).
    Bandwidth in DeepEP's LL formula over this rank's valid selections (bf16 bytes for both combines, as DeepEP
    reports LogFMT) divided by the kernel time (the profiler's when available). With the chaos cubins each row also
    has "network": the operations per call (network_ops_per_call, over `iters` untimed calls after the rounds)."""
    workloads = [_LLWorkload(buffer, num_tokens, hidden, num_topk, e) for e in expert_counts]
    medians = [w.time(warmup, iters) for w in workloads]
    rows = []
    for w, med in zip(workloads, medians):
        profiled = w.profile(profiled_iters) if profiled_iters else {}
        rows += w.rows(med, profiled, iters)
    return rows


class _LLWorkload:
    """One LL shape's inputs and calls, as bench_ll_shapes times them."""

    def __init__(self, buffer, num_tokens, hidden, num_topk, num_experts):
        self.buffer, self.T, self.hidden, self.num_experts = buffer, num_tokens, hidden, num_experts
        self.x, self.idx, self.w, self.y, self.y_castable = ll_inputs(
            num_tokens, hidden, num_topk, num_experts, buffer.group_size, buffer.device, 1234 + buffer.rank
        )
        self.handle = None

    def run(self, op, hook=False):
        buffer = self.buffer
        if op == "dispatch":
            out = buffer.low_latency_dispatch(self.x, self.idx, self.T, self.num_experts, return_recv_hook=hook)
            self.handle = out[2]
            return out[4]
        out = buffer.low_latency_combine(
            self.y_castable if op == "logfmt" else self.y,
            self.idx,
            self.w,
            self.handle,
            use_logfmt=op == "logfmt",
            return_recv_hook=hook,
        )
        return out[2]

    @staticmethod
    def timed(pending, key, fn, host=None):
        a, b = _event(), _event()
        a.record()
        t0 = time.perf_counter()
        result = fn()
        t1 = time.perf_counter()
        b.record()
        pending.append((key, a, b))
        if host is not None:  # the call's own Python, inside the events (what of "call" is the host's)
            host.append((t1 - t0) * 1e6)
        return result

    def one_round(self, pending, hosts):
        import torch.distributed as dist

        group, run, timed = self.buffer.group, self.run, self.timed
        dist.barrier(group=group)
        torch.cuda.synchronize()
        torch.cuda._sleep(_SLEEP_CYCLES_COVER)
        for op, _ in LL_OPS:
            hook = timed(pending, f"{op} send", lambda: run(op, hook=True))
            torch.cuda._sleep(_SLEEP_CYCLES_GAP)
            timed(pending, f"{op} recv", hook)
        dist.barrier(group=group)
        torch.cuda.synchronize()
        torch.cuda._sleep(_SLEEP_CYCLES_COVER)
        run("dispatch")
        run("combine")
        for op, _ in LL_OPS:
            timed(pending, f"{op} kernel", lambda: run(op))
        dist.barrier(group=group)
        torch.cuda.synchronize()
        for op, _ in LL_OPS:
            timed(pending, f"{op} call", lambda: run(op), hosts.setdefault(op, []))
        torch.cuda.synchronize()

    def time(self, warmup, iters) -> dict:
        """Medians (us) of every timed quantity: the rounds, then the back-to-back loop."""
        import torch.distributed as dist

        samples = {
            f"{op} {what}": []
            for op, _ in LL_OPS
            for what in ("kernel", "send", "recv", "call", "host", "loop", "loop host")
        }
        self.run("dispatch")
        for it in range(warmup + iters):
            pending, hosts = [], {}
            self.one_round(pending, hosts)
            if it >= warmup:
                for key, a, b in pending:
                    samples[key].append(a.elapsed_time(b) * 1000)
                for op, us in hosts.items():
                    samples[f"{op} host"] += us
        # The steady state: calls back to back (a few untimed first), one sync at the end.
        dist.barrier(group=self.buffer.group)
        torch.cuda.synchronize()
        loop_pending = []
        for it in range(_LOOP_WARMUP + iters):
            pending, hosts = [], {}
            for op, _ in LL_OPS:
                self.timed(pending, f"{op} loop", lambda: self.run(op), hosts.setdefault(op, []))
            if it >= _LOOP_WARMUP:
                loop_pending.extend(pending)
                for op, us in hosts.items():
                    samples[f"{op} loop host"] += us
        torch.cuda.synchronize()
        for key, a, b in loop_pending:
            samples[key].append(a.elapsed_time(b) * 1000)
        return {k: statistics.median(v) for k, v in samples.items()}

    def profile(self, rounds) -> dict:
        """The kernels' own durations over `rounds` rounds under the torch profiler (_profiled_ll)."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(rounds):
                self.one_round([], {})
        return _profiled_ll(prof, rounds)

    def rows(self, med, profiled, iters) -> list:
        # The network counts apart from the rounds, which interleave the three workloads in the module's counters
        # (dispatch first: the combines reuse its handle).
        network = {
            op: network_ops_per_call(self.buffer, "low_latency", functools.partial(self.run, op), iters)
            for op, _ in LL_OPS
        }
        selections = int((self.idx >= 0).sum())
        fp8_bytes = selections * (self.hidden + self.hidden // 128 * 4 + 16)
        bf16_bytes = selections * self.hidden * 2
        rows = []
        for op, name in LL_OPS:
            nbytes = fp8_bytes if op == "dispatch" else bf16_bytes
            row = {
                "name": name,
                "experts": self.num_experts,
                "events": {k: med[f"{op} {k}"] for k in ("kernel", "send", "recv")},
                "call": med[f"{op} call"],
                "host": med[f"{op} host"],  # the Python of those calls (perf_counter around each)
                "loop": med[f"{op} loop"],  # back to back, no barrier between calls
                "loop_host": med[f"{op} loop host"],
                "profiler": profiled.get(op),
            }
            kernel = row["profiler"]["kernel"] if row["profiler"] else row["events"]["kernel"]
            row["gbps"] = nbytes / kernel / 1e3
            if network[op] is not None:
                row["network"] = network[op]
            rows.append(row)
        return rows


def _event():
    return torch.cuda.Event(enable_timing=True)


def _ll_calls(kernels) -> list | None:
    """The profiler's LL kernels (in start order) grouped into calls: a one-kernel call alone, a send kernel with the
    receive kernel after it; None if they do not pair up."""
    calls, i = [], 0
    while i < len(kernels):
        name = kernels[i].name()
        if name.endswith("_send"):
            if i + 1 >= len(kernels) or kernels[i + 1].name() != name[: -len("_send")] + "_recv":
                return None
            calls.append((kernels[i], kernels[i + 1]))
            i += 2
        elif name in ("ep_rt_ll_dispatch", "ep_rt_ll_combine"):
            calls.append((kernels[i],))
            i += 1
        else:
            return None
    return calls


def _profiled_ll(prof, rounds) -> dict:
    """Medians of the LL kernels' own durations per op: send, recv (hook halves) and kernel (a whole call, from its
    kernel's start to its end, or send start to receive end when it is two kernels). Empty if the profiler did not
    see exactly the calls the rounds made."""
    kernels = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name().startswith("ep_rt_ll_")),
        key=lambda e: e.start_ns(),
    )
    calls = _ll_calls(kernels)
    if calls is None or len(calls) != rounds * _ROUND_CALLS:
        return {}
    out = {op: {"send": [], "recv": [], "kernel": []} for op, _ in LL_OPS}
    for r in range(rounds):
        cs = calls[r * _ROUND_CALLS : (r + 1) * _ROUND_CALLS]
        if any(len(c) != 2 for c in cs[:_ROUND_HOOK_CALLS]):
            return {}  # the hook calls are always split
        for i, (op, _) in enumerate(LL_OPS):
            send, recv = cs[i]
            out[op]["send"].append(send.duration_ns() / 1e3)
            out[op]["recv"].append(recv.duration_ns() / 1e3)
            whole = cs[_ROUND_KERNEL_CALLS[i]]
            out[op]["kernel"].append((whole[-1].end_ns() - whole[0].start_ns()) / 1e3)
    return {op: {k: statistics.median(v) for k, v in d.items()} for op, d in out.items()}


def format_ll_rows(rows, rank) -> str:
    nan = {"kernel": float("nan"), "send": float("nan"), "recv": float("nan")}
    lines = [
        f"rank {rank}: {'workload':<17} {'experts':>7} {'kernel us':>10} {'GB/s':>7} {'send us':>8} "
        f"{'recv us':>8} | {'events: kernel':>14} {'send':>6} {'recv':>6} | {'call us':>8} {'host us':>8} | "
        f"{'loop us':>8} {'host us':>8}"
    ]
    for r in rows:
        p, e = r["profiler"] or nan, r["events"]
        lines.append(
            f"rank {rank}: {r['name']:<17} {r['experts']:>7} {p['kernel']:>10.1f} {r['gbps']:>7.1f} "
            f"{p['send']:>8.1f} "
            f"{p['recv']:>8.1f} | {e['kernel']:>14.1f} {e['send']:>6.1f} {e['recv']:>6.1f} | "
            f"{r['call']:>8.1f} {r.get('host', float('nan')):>8.1f} | "
            f"{r.get('loop', float('nan')):>8.1f} {r.get('loop_host', float('nan')):>8.1f}"
        )
        if "network" in r:
            lines.append(format_network(r["network"], rank))
    if any("network" in r for r in rows):
        lines.append(f"rank {rank}: ({CHAOS_NOTE})")
    return "\n".join(lines)


# ---- internode (emulated nodes here: EP_RT_RANKS_PER_NODE) ----------------------------------------------------
IN_WORKLOADS = ("internode dispatch BF16", "internode dispatch FP8", "internode combine BF16")
IN_KERNELS = {
    "dispatch": ("send", "forward", "recv"),
    "combine": ("combine_publish", "combine_forward", "combine_reduce"),
}


@dataclass
class InternodeBenchRow:
    name: str
    num_sms: int
    kernel_us: float  # median over calls of the call's kernels (dispatch: send + forward + receive; notify apart)
    notify_us: float
    call_us: float  # events around the whole Python call on the caller's stream
    rdma_gbps: float  # DeepEP's "RDMA" metric: tokens x nodes they reach (own node included) x bytes / kernel time
    nvl_gbps: float  # DeepEP's "NVL" metric: received rows x bytes / kernel time
    num_recv: int
    rdma_tokens: int
    emulated: bool  # nodes emulated on one host: the "RDMA" traffic went over NVLink, not a network
    network: Optional[dict] = None  # the chaos transport's counts per call (network_ops_per_call); else None
    rounds: int = 1  # rounds a call takes through the buffers (internode_rounds; 1: one pass)


def internode_record(row: InternodeBenchRow) -> dict:
    """A row as --json writes it: "network" only where the chaos transport counted."""
    record = asdict(row)
    if record["network"] is None:
        del record["network"]
    return record


def bench_internode(
    buffer,
    num_tokens=4096,
    hidden=7168,
    num_topk=8,
    num_experts=256,
    num_sms=24,
    warmup=3,
    iters=20,
    workloads=IN_WORKLOADS,
):
    """DeepEP's internode test workloads (dispatch BF16 / FP8, combine BF16) with DeepEP's metrics. Kernel times are
    CUDA events around each kernel, L2 flushed before each call, the ranks met at a barrier first. With the chaos
    cubins each row also has `network`: the operations per call (network_ops_per_call, over `iters` untimed calls
    after the timed ones)."""
    unknown = [w for w in workloads if w not in IN_WORKLOADS]
    if unknown:
        raise ValueError(f"unknown internode workloads {unknown}; known: {list(IN_WORKLOADS)}")
    if not buffer.is_internode:
        raise ValueError("bench_internode needs a Buffer whose ranks span several nodes (EP_RT_RANKS_PER_NODE)")
    dev = buffer.device
    config = Config(num_sms, 6, 256, 6, 128)
    sets = ht_inputs(num_tokens, hidden, num_topk, num_experts, dev, copies=1, seed=buffer.rank)
    x, x_fp8, idx, w = sets[0]
    per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, num_experts)
    args = dict(
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_node,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
        config=config,
    )
    rdma_tokens = int(per_node.sum()) if per_node is not None else 0
    recv_x, _, recv_w, _, handle, _ = buffer.dispatch(x, **args)
    in_rounds = getattr(handle, "rounds", None)  # the same inputs every call: the same rounds
    rounds = len(in_rounds.starts) if in_rounds is not None else 1
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
    timer = KernelTimer()
    rows = []

    def call(name):
        if name == "internode dispatch BF16":
            buffer.dispatch(x, **args)
        elif name == "internode dispatch FP8":
            buffer.dispatch(x_fp8, **args)
        else:
            buffer.combine(recv_x, handle, topk_weights=recv_w, config=config)

    for name in workloads:
        kernels = IN_KERNELS["combine" if "combine" in name else "dispatch"]
        sums, notifies, calls = [], [], []
        for it in range(warmup + iters):
            flush.zero_()
            buffer.internode_barrier(torch.cuda.current_stream())  # every rank here (the host waits), then launch
            buffer.set_kernel_timer(timer)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(name)
            end.record()
            torch.cuda.synchronize()
            buffer.set_kernel_timer(None)
            got = timer.collect()
            if it >= warmup:  # every launch of the call (a call in rounds launches each kernel once a round)
                sums.append(sum(sum(got.get(k, ())) for k in kernels))
                notifies.append(sum(got.get("notify", ())))
                calls.append(start.elapsed_time(end) * 1000.0)
        # Counted apart from the timed calls: each of those follows a barrier, itself network operations.
        network = network_ops_per_call(buffer, "internode", functools.partial(call, name), iters)
        kernel_us = statistics.median(sums)
        row_bytes = hidden * 2 if "FP8" not in name else hidden * (1 + 4 / 128)
        rows.append(
            InternodeBenchRow(
                name,
                num_sms,
                kernel_us,
                statistics.median(notifies),
                statistics.median(calls),
                rdma_tokens * row_bytes / kernel_us / 1e3,
                recv_x.size(0) * row_bytes / kernel_us / 1e3,
                recv_x.size(0),
                rdma_tokens,
                buffer.topology.emulated,
                network,
                rounds,
            )
        )
    return rows


def format_internode_rows(rows, rank) -> str:
    lines = [
        f"rank {rank}: {'workload':<24} {'SMs':>4} {'kernel us':>10} {'RDMA GB/s':>10} {'NVL GB/s':>9} "
        f"{'notify us':>10} {'call us':>9} {'recv':>6} {'rounds':>6}"
    ]
    for r in rows:
        lines.append(
            f"rank {rank}: {r.name:<24} {r.num_sms:>4} {r.kernel_us:>10.1f} {r.rdma_gbps:>10.1f} "
            f"{r.nvl_gbps:>9.1f} {r.notify_us:>10.1f} {r.call_us:>9.1f} {r.num_recv:>6} {r.rounds:>6}"
        )
        if r.network is not None:
            lines.append(format_network(r.network, rank))
    if any(r.network is not None for r in rows):
        lines.append(f"rank {rank}: ({CHAOS_NOTE})")
    if rows and rows[0].emulated:
        lines.append(
            f'rank {rank}: (emulated nodes: the "RDMA" traffic crossed NVLink inside one host, not a '
            f"network; only correctness and the NVLink side mean anything here)"
        )
    return "\n".join(lines)
