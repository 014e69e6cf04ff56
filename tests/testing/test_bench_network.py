"""The benchmarks' network operation counts (the chaos transport's cost mode) on the CPU: bench_internode and bench_ll
run on stand-in Buffers whose counters grow with each call (the barrier and the line-ups too), with CUDA's events,
syncs and sleeps, the process group's barrier and the profiler replaced by stand-ins that log what happens. The log
shows when the counters are zeroed and read (never while a timed event pair is open) and how many calls they saw."""

import contextlib
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from ep_rt.testing import bench

STATS = ("put_signals", "signals", "quiets", "fences", "bytes", "charged_ns")
PER_CALL = {  # what one call of each kind adds to the counters (charged: one quiet of 500 ns)
    "dispatch": {"put_signals": 10, "signals": 2, "quiets": 1, "fences": 0, "bytes": 4096, "charged_ns": 500},
    "combine": {"put_signals": 6, "signals": 2, "quiets": 0, "fences": 1, "bytes": 2048, "charged_ns": 500},
    "logfmt": {"put_signals": 6, "signals": 2, "quiets": 0, "fences": 0, "bytes": 1024, "charged_ns": 0},
    "barrier": {"put_signals": 0, "signals": 1, "quiets": 0, "fences": 0, "bytes": 0, "charged_ns": 0},
}


class Log:
    """Every event record, count access and call, with how many timed event pairs were open at each."""

    def __init__(self):
        self.entries, self.open, self.serial = [], 0, 0

    def add(self, what):
        self.entries.append((what, self.open))


class StandInEvent:
    """torch.cuda.Event: the benchmarks make them in (start, end) pairs; a pair is open from start's record to
    end's."""

    def __init__(self, log):
        self.log, self.is_start = log, log.serial % 2 == 0
        log.serial += 1

    def record(self, stream=None):
        self.log.open += 1 if self.is_start else -1
        self.log.add("record")

    def elapsed_time(self, end):
        return 0.05  # ms


@pytest.fixture
def log(monkeypatch):
    log = Log()

    @contextlib.contextmanager
    def no_profiler(**kwargs):
        log.add("profiler")
        yield SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: [])))

    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: StandInEvent(log))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.add("sync"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(dist, "barrier", lambda group=None: log.add("dist barrier"))
    monkeypatch.setattr(torch.profiler, "profile", no_profiler)
    return log


class StandInBuffer:
    """What the benchmarks use of a Buffer, on the CPU; `chaos`: counters as the chaos cubins keep them, else
    network_operation_counts() is None as with the normal cubins."""

    def __init__(self, log, op, chaos):
        self.log, self.op, self.chaos = log, op, chaos
        self.totals = dict.fromkeys(STATS, 0)
        self.device, self.rank, self.group, self.group_size = torch.device("cpu"), 0, "group", 2
        self.is_internode, self.topology = op == "internode", SimpleNamespace(emulated=True)
        self.timer = None
        self.calls = []

    def network_operation_counts(self, reset=False):
        self.log.add("counts (reset)" if reset else "counts")
        if not self.chaos:
            return None
        counts = {self.op: dict(self.totals)}
        if reset:
            self.totals = dict.fromkeys(STATS, 0)
        return counts

    def made(self, kind):
        self.calls.append(kind)
        self.log.add(kind)
        for name, value in PER_CALL[kind].items():
            self.totals[name] += value

    # ---- internode ----
    def get_dispatch_layout(self, idx, num_experts):
        T = idx.size(0)
        per_node = torch.full((2,), T)
        return torch.full((2,), T), per_node, torch.zeros(num_experts), torch.ones(T, 2, dtype=torch.bool), None

    def set_kernel_timer(self, timer):
        self.timer = timer

    def internode_barrier(self, stream):
        self.made("barrier")

    def _kernels(self, names):
        for name in names:
            if self.timer is not None:
                self.timer.around(name, "stream", lambda: None)

    def dispatch(self, x, **args):
        self.made("dispatch")
        self._kernels(("notify",) + bench.IN_KERNELS["dispatch"])
        rows = torch.zeros(6, 128, dtype=torch.bfloat16)
        return rows, None, torch.zeros(6, 2), None, "handle", None

    def combine(self, x, handle, topk_weights=None, config=None):
        self.made("combine")
        self._kernels(bench.IN_KERNELS["combine"])
        return x, None, None

    # ---- low latency ----
    def low_latency_dispatch(self, x, idx, T, E, return_recv_hook=False):
        self.made("dispatch")
        return None, None, "handle", None, (lambda: self.log.add("recv half")) if return_recv_hook else None

    def low_latency_combine(self, y, idx, w, handle, use_logfmt=False, return_recv_hook=False):
        self.made("logfmt" if use_logfmt else "combine")
        return None, None, (lambda: self.log.add("recv half")) if return_recv_hook else None


def run_internode(log, chaos):
    buf = StandInBuffer(log, "internode", chaos)
    rows = bench.bench_internode(buf, num_tokens=8, hidden=128, num_topk=2, num_experts=8, warmup=2, iters=3)
    return buf, rows


def run_ll(log, chaos):
    buf = StandInBuffer(log, "low_latency", chaos)
    rows = bench.bench_ll(buf, num_tokens=4, hidden=128, num_topk=2, num_experts=8, warmup=2, iters=3, profiled_iters=1)
    return buf, rows


def counts_accesses(log):
    return [(what, open_pairs) for what, open_pairs in log.entries if what.startswith("counts")]


def expected(kind):
    return {name: float(value) for name, value in PER_CALL[kind].items()}


def test_internode_rows_count_one_call_each_outside_the_timed_loop(log):
    buf, rows = run_internode(log, chaos=True)
    assert [r.network for r in rows] == [expected("dispatch"), expected("dispatch"), expected("combine")]
    accesses = counts_accesses(log)
    assert len(accesses) == 6 and all(open_pairs == 0 for _, open_pairs in accesses), accesses
    # Each workload: its timed loop (2 warm-up + 3 timed calls, each after a barrier), then zero, 3 calls, read.
    kinds = [what for what, _ in log.entries if what in ("dispatch", "combine", "barrier") or what.startswith("counts")]

    def workload(kind):
        return ["barrier", kind] * 5 + ["counts (reset)", kind, kind, kind, "counts"]

    assert kinds == ["dispatch"] + workload("dispatch") * 2 + workload("combine")  # the first: the combine's handle


def test_internode_without_chaos_counts_nothing_and_reports_nothing(log):
    buf, rows = run_internode(log, chaos=False)
    assert all(r.network is None for r in rows)
    assert buf.calls.count("dispatch") == 1 + 2 * 5 and buf.calls.count("combine") == 5  # no counting calls
    assert all("network" not in bench.internode_record(r) for r in rows)
    text = bench.format_internode_rows(rows, 0)
    assert len(text.splitlines()) == 1 + 3 + 1 and "network per call" not in text and "chaos" not in text


def test_ll_rows_count_each_workload_apart_from_the_rounds(log):
    buf, rows = run_ll(log, chaos=True)
    assert {r["name"]: r["network"] for r in rows} == {
        "LL dispatch FP8": expected("dispatch"),
        "LL combine BF16": expected("combine"),
        "LL combine LogFMT": expected("logfmt"),
    }
    accesses = counts_accesses(log)
    assert len(accesses) == 6 and all(open_pairs == 0 for _, open_pairs in accesses), accesses
    first = next(i for i, (what, _) in enumerate(log.entries) if what.startswith("counts"))
    assert not any(what == "record" for what, _ in log.entries[first:])  # every timed round came before
    text = bench.format_ll_rows(rows, 0).splitlines()
    assert text[2] == (
        "rank 0:   network per call: 10 put-with-signal, 2 signal, 1 quiet, 0 fence, 0.00 MB, 0.5 us charged"
    )
    assert text[-1].startswith("rank 0: (chaos transport (EP_RT_CHAOS_TRANSPORT=1): these times are not network")


def test_ll_without_chaos_counts_nothing_and_reports_nothing(log):
    buf, rows = run_ll(log, chaos=False)
    assert all("network" not in r for r in rows)
    rounds = 2 + 3 + 1  # warm-up, timed, profiled
    loop = bench._LOOP_WARMUP + 3  # the back-to-back loop: untimed, then `iters` timed
    assert buf.calls.count("dispatch") == 1 + 4 * rounds + loop and buf.calls.count("logfmt") == 3 * rounds + loop
    assert all(r["loop"] > 0 and r["loop_host"] > 0 for r in rows), rows
    # the loop: after one barrier and sync, the calls back to back with no barrier or sync between them
    what = [w for w, _ in log.entries if w in ("dispatch", "combine", "logfmt", "dist barrier", "sync")]
    run = ["dist barrier", "sync"] + ["dispatch", "combine", "logfmt"] * loop + ["sync"]
    assert any(what[i : i + len(run)] == run for i in range(len(what))), what
    text = bench.format_ll_rows(rows, 0)
    assert len(text.splitlines()) == 1 + 3 and "network" not in text and "chaos" not in text
    # each row says how much of its call time was the call's own Python (timed around the call)
    assert text.splitlines()[0].endswith("call us  host us |  loop us  host us") and all(r["host"] > 0 for r in rows)


class Counting:
    """A Buffer's network_operation_counts with one op's counters, growing by `per_call` at each call()."""

    def __init__(self, per_call, chaos=True):
        self.per_call, self.chaos, self.totals, self.log = per_call, chaos, dict.fromkeys(STATS, 7), []

    def network_operation_counts(self, reset=False):
        self.log.append("reset" if reset else "read")
        if not self.chaos:
            return None
        counts = {"low_latency": dict(self.totals)}
        if reset:
            self.totals = dict.fromkeys(STATS, 0)
        return counts

    def call(self):
        self.log.append("call")
        for name, value in self.per_call.items():
            self.totals[name] += value


def test_network_ops_per_call_zeroes_first_and_divides_by_the_calls():
    buf = Counting({**PER_CALL["dispatch"], "put_signals": 3})
    buf.call()  # a warm-up call's operations (and the 7s before it) are zeroed away
    got = bench.network_ops_per_call(buf, "low_latency", buf.call, 4)
    assert got == {**expected("dispatch"), "put_signals": 3.0}
    assert buf.log == ["call", "reset", "call", "call", "call", "call", "read"]
    buf = Counting({**PER_CALL["dispatch"], "put_signals": 1})
    buf.totals["put_signals"] = 1  # a call that varies: the mean
    assert bench.network_ops_per_call(buf, "low_latency", buf.call, 2)["put_signals"] == 1.0


def test_network_ops_per_call_without_counters_makes_no_call():
    buf = Counting(PER_CALL["dispatch"], chaos=False)
    assert bench.network_ops_per_call(buf, "low_latency", buf.call, 4) is None
    assert buf.log == ["reset"]


def test_the_line_under_a_row_rounds_a_mean_and_keeps_whole_counts():
    counts = {"put_signals": 1904.0, "signals": 64.5, "quiets": 0.0, "fences": 2.0, "bytes": 14.2e6, "charged_ns": 5600}
    assert bench.format_network(counts, 3) == (
        "rank 3:   network per call: 1904 put-with-signal, 64.5 signal, 0 quiet, 2 fence, 14.20 MB, 5.6 us charged"
    )


def test_every_shape_is_timed_before_the_first_profiler_session(log):
    """kineto may leave CUPTI attached after a profiler session (pytorch/pytorch#144455): bench_ll_shapes takes every
    host and call time of every shape before it profiles any."""
    buf = StandInBuffer(log, "low_latency", chaos=False)
    rows = bench.bench_ll_shapes(buf, (8, 4), num_tokens=4, hidden=128, num_topk=2, warmup=2, iters=3, profiled_iters=1)
    assert [r["experts"] for r in rows] == [8, 8, 8, 4, 4, 4]
    whats = [what for what, _ in log.entries]
    first_profile = whats.index("profiler")
    assert whats.count("profiler") == 2
    rounds, loop = 2 + 3, bench._LOOP_WARMUP + 3  # each shape's timed rounds (warm-up included) and its loop
    assert whats[:first_profile].count("dispatch") == 2 * (1 + 4 * rounds + loop)
    assert whats[first_profile:].count("dispatch") == 2 * 4  # after it: one profiled round per shape, nothing else
    assert all(r["host"] > 0 and r["loop_host"] > 0 for r in rows)
