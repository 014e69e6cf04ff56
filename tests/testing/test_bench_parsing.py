"""The LL benchmark's reading of profiler kernel records (CPU: fake records in the profiler's shape)."""

import math
from types import SimpleNamespace

from ep_rt.testing import bench


class _Kernel:
    def __init__(self, name, start, end):
        self._name, self._start, self._end = name, start, end

    def name(self):
        return self._name

    def start_ns(self):
        return self._start

    def end_ns(self):
        return self._end

    def duration_ns(self):
        return self._end - self._start


def _prof(kernels):
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: kernels)))


def _round(t0, send_ns, recv_ns, gap_ns, one_kernel_ns=None):
    """One bench round in stream order, as bench_ll launches it: 3 hook calls (send, recv), then 8 whole calls, each
    a (send, recv) pair (EP_RT_LL_TWO_KERNELS) or, with one_kernel_ns, one kernel of that duration."""
    kernels, t = [], t0
    ops = ["dispatch", "combine", "combine"] + ["dispatch", "combine"] + ["dispatch", "combine", "combine"] * 2
    for i, op in enumerate(ops):
        if i >= 3 and one_kernel_ns is not None:
            kernels.append(_Kernel(f"ep_rt_ll_{op}", t, t + one_kernel_ns))
            t += one_kernel_ns + 100_000
            continue
        kernels.append(_Kernel(f"ep_rt_ll_{op}_send", t, t + send_ns))
        t += send_ns + gap_ns
        kernels.append(_Kernel(f"ep_rt_ll_{op}_recv", t, t + recv_ns))
        t += recv_ns + 100_000
    return kernels


def test_profiled_ll_takes_durations_and_spans():
    rounds = [_round(r * 10**9, send_ns=20_000, recv_ns=8_000, gap_ns=2_000) for r in range(3)]
    noise = [_Kernel("some_other_kernel", 5, 10)]
    got = bench._profiled_ll(_prof([k for r in reversed(rounds) for k in r] + noise), rounds=3)
    for op in ("dispatch", "combine", "logfmt"):
        assert math.isclose(got[op]["send"], 20.0) and math.isclose(got[op]["recv"], 8.0)
        assert math.isclose(got[op]["kernel"], 30.0)  # send start to recv end, gap included


def test_profiled_ll_takes_one_kernel_calls_whole():
    rounds = [_round(r * 10**9, 20_000, 8_000, 2_000, one_kernel_ns=25_000) for r in range(2)]
    got = bench._profiled_ll(_prof([k for r in rounds for k in r]), rounds=2)
    for op in ("dispatch", "combine", "logfmt"):
        assert math.isclose(got[op]["send"], 20.0) and math.isclose(got[op]["recv"], 8.0)  # the hook halves
        assert math.isclose(got[op]["kernel"], 25.0)  # the one kernel's own duration


def test_profiled_ll_gives_nothing_when_kernels_are_missing():
    kernels = _round(0, 20_000, 8_000, 2_000)[:-1]
    assert bench._profiled_ll(_prof(kernels), rounds=1) == {}
    one = _round(0, 20_000, 8_000, 2_000, one_kernel_ns=25_000)
    assert bench._profiled_ll(_prof(one[:-1]), rounds=1) == {}  # a call missing
    assert bench._profiled_ll(_prof(one[1:]), rounds=1) == {}  # a receive without its send


def test_ll_table_shows_profiler_and_event_times_and_marks_missing_profiler_times():
    row = {
        "name": "LL dispatch FP8",
        "experts": 256,
        "gbps": 250.0,
        "call": 120.0,
        "profiler": {"kernel": 29.0, "send": 20.0, "recv": 9.0},
        "events": {"kernel": 33.0, "send": 24.0, "recv": 13.0},
    }
    text = bench.format_ll_rows([row, dict(row, profiler=None)], rank=0).splitlines()
    assert len(text) == 3 and "experts" in text[0]
    assert "256" in text[1] and "29.0" in text[1] and "33.0" in text[1]
    assert "nan" in text[2] and "33.0" in text[2]
