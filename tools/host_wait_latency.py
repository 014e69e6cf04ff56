"""How late the host's wait for a notify token (ep_rt/transport/host_wait.py) sees the token, on the CPU.

A second process publishes the token after a chosen delay (0.3, 5 and 20 ms: the yield phase; 80 ms: the naps);
the time from its store to the wait's return is what the GPU would sit idle for before the dispatch kernel's
launch even starts. Measured with this thread's timer slack as it is (50 us on Linux by default) and, for the
comparison, with the earlier wait (time.sleep(0) yields, 50 us naps, no slack change), which this file keeps.
No GPU; a loaded machine makes every figure larger. Usage: python tools/host_wait_latency.py [--runs N]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ep_rt.transport import host_wait  # noqa: E402


class _Records:
    def raise_if_failed(self, slot):
        pass


def _earlier_wait(counters, index, token):
    """The wait before the fine timer slack (commit b63c69a): sleep(0) turns, then 50 us naps."""
    start = time.monotonic()
    spin_until, nap_after, spins = start + 50e-6, start + 1e-3, 0
    while counters[index] != token:
        spins += 1
        if spins % 32 == 0:
            now = time.monotonic()
            if now > nap_after:
                time.sleep(50e-6)
            elif now > spin_until:
                time.sleep(0)


_PUBLISHER = """
import ctypes, mmap, sys, time
f = open(sys.argv[1], "r+b")
shm = mmap.mmap(f.fileno(), 16)
c = (ctypes.c_int64 * 2).from_buffer(shm)
for line in sys.stdin:  # one line per token: when to store it (perf_counter_ns); spin until then, store, report
    when = int(line)
    while time.perf_counter_ns() < when:
        pass
    c[1] = time.perf_counter_ns()
    c[0] = c[0] + 1
    print("ok", flush=True)
"""


class _Publisher:
    """A process without torch that stores tokens into shared memory at given times, as the GPU stores into mapped
    memory: no GIL hand-over, no process start or exit, is part of what is measured."""

    def __init__(self):
        self.path = f"/dev/shm/ep_rt_host_wait_{os.getpid()}"
        with open(self.path, "wb") as f:
            f.write(bytes(16))
        self._file = open(self.path, "r+b")
        self.shm = mmap.mmap(self._file.fileno(), 16)
        self.counters = (ctypes.c_int64 * 2).from_buffer(self.shm)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PUBLISHER, self.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def late(self, wait, delay_s: float) -> float:
        """Microseconds from the token's store to the wait's return."""
        token = self.counters[0] + 1
        self.proc.stdin.write(f"{time.perf_counter_ns() + int(delay_s * 1e9)}\n")
        self.proc.stdin.flush()
        wait(self.counters, token)
        done = time.perf_counter_ns()
        self.proc.stdout.readline()
        return (done - self.counters[1]) / 1e3

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
        del self.counters
        self.shm.close()
        self._file.close()
        os.unlink(self.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    waits = {
        "ep_rt now": lambda c, t: host_wait.wait_for_token(c, 0, t, 30.0, _Records(), "nvl", "rank 0", "bench"),
        "earlier": lambda c, t: _earlier_wait(c, 0, t),
    }
    print(f"timer slack of this thread: {host_wait.timer_slack_ns()} ns; {args.runs} waits each")
    print(f"{'wait':<10} {'token after':>11} {'median us':>10} {'p90 us':>8}")
    pub = _Publisher()
    try:
        for delay in (0.3e-3, 5e-3, 20e-3, 80e-3):
            for name, wait in waits.items():
                xs = sorted(pub.late(wait, delay) for _ in range(args.runs))
                print(
                    f"{name:<10} {delay * 1e3:>8.1f} ms {statistics.median(xs):>10.1f} {xs[int(0.9 * len(xs))]:>8.1f}"
                )
    finally:
        pub.close()


if __name__ == "__main__":
    main()
