"""NVSHMEM's collective host calls run under a deadline (ep_rt/transport/nvshmem_deadline.py): a call that never
returns (a peer gone after the Buffer's inputs were compared) ends the process with a plain message and exit code
124 instead of hanging; a call that returns in time leaves no watchdog behind; EP_RT_NVSHMEM_TIMEOUT_S sets it, and
0 turns it off. Each collective call of ep_rt/transport/nvshmem.py is wrapped (checked with a stand-in library)."""

import subprocess
import sys
import textwrap
import time

import pytest

from ep_rt import env
from ep_rt.transport import nvshmem, nvshmem_deadline

from ..repo import REPO


def _run(code: str, timeout_s: float = 60, **extra_env):
    import os

    environment = {**os.environ, "PYTHONPATH": str(REPO), **extra_env}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=environment,
    )
    return done, time.monotonic() - start


def test_a_call_that_never_returns_ends_the_process_with_a_message():
    done, took = _run(
        """
        import time
        from ep_rt.transport.nvshmem_deadline import CollectiveDeadline
        with CollectiveDeadline("nvshmem_barrier_all", rank=3, seconds=1):
            time.sleep(120)  # (a blocked C call: nothing in Python ends it)
        print("returned")
        """
    )
    assert done.returncode == nvshmem_deadline.EXIT_CODE == 124, (done.returncode, done.stderr)
    assert took < 30 and "returned" not in done.stdout
    assert "ep_rt: rank 3: nvshmem_barrier_all has waited 1 s for the other ranks" in done.stderr
    assert "EP_RT_NVSHMEM_TIMEOUT_S" in done.stderr and "exit code 124" in done.stderr


def test_a_call_that_returns_in_time_leaves_no_watchdog():
    done, _ = _run(
        """
        import time
        from ep_rt.transport.nvshmem_deadline import CollectiveDeadline
        with CollectiveDeadline("nvshmem_barrier_all", seconds=1):
            time.sleep(0.1)
        time.sleep(2)  # past the deadline, outside the call
        print("returned")
        """
    )
    assert done.returncode == 0 and "returned" in done.stdout, done.stderr


def test_zero_turns_it_off_and_the_knob_sets_it():
    done, _ = _run(
        """
        import time
        from ep_rt.transport.nvshmem_deadline import CollectiveDeadline
        with CollectiveDeadline("NVSHMEM's start") as d:
            assert d.seconds == 0
            time.sleep(1.5)
        print("returned")
        """,
        EP_RT_NVSHMEM_TIMEOUT_S="0",
    )
    assert done.returncode == 0 and "returned" in done.stdout, done.stderr


def test_the_knob(monkeypatch):
    monkeypatch.delenv("EP_RT_NVSHMEM_TIMEOUT_S", raising=False)
    assert env.nvshmem_timeout_s() == 600
    monkeypatch.setenv("EP_RT_NVSHMEM_TIMEOUT_S", "30")
    assert nvshmem_deadline.CollectiveDeadline("x").seconds == 30
    monkeypatch.setenv("EP_RT_NVSHMEM_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="EP_RT_NVSHMEM_TIMEOUT_S"):
        env.nvshmem_timeout_s()


def test_no_watchdog_thread_at_interpreter_shutdown_the_call_still_runs(monkeypatch):
    import threading

    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Timer, "start", refuse)
    ran = []
    with nvshmem_deadline.CollectiveDeadline("nvshmem_barrier_all", seconds=5) as d:
        ran.append(True)
    assert ran == [True] and d._timer is None


class _Lib:
    """A stand-in NVSHMEM library that records, for each collective call, whether a deadline was armed around it."""

    def __init__(self, armed):
        self.armed, self.calls = armed, []

    def _call(self, name, result=0):
        self.calls.append((name, bool(self.armed)))
        return result

    def nvshmem_align(self, alignment, nbytes):
        return self._call("nvshmem_align", 4096)

    def nvshmem_free(self, ptr):
        return self._call("nvshmem_free")

    def nvshmem_barrier_all(self):
        return self._call("nvshmem_barrier_all")

    def nvshmemx_hostlib_finalize(self):
        return self._call("nvshmemx_hostlib_finalize")


def test_every_collective_call_runs_under_the_deadline(monkeypatch):
    armed = []

    class Recording(nvshmem_deadline.CollectiveDeadline):
        def __enter__(self):
            armed.append(self.what)
            return self

        def __exit__(self, *exc):
            armed.pop()

    lib = _Lib(armed)
    monkeypatch.setattr(nvshmem, "CollectiveDeadline", Recording)
    monkeypatch.setattr(nvshmem, "_lib", lambda: lib)
    monkeypatch.setitem(nvshmem._state, "users", 1)
    nvshmem.align(1 << 20)
    nvshmem.barrier_all()
    nvshmem.free(4096)
    nvshmem.finalize()
    assert lib.calls == [
        ("nvshmem_align", True),
        ("nvshmem_barrier_all", True),
        ("nvshmem_free", True),
        ("nvshmemx_hostlib_finalize", True),
    ]
    assert armed == []


def test_the_start_runs_under_the_deadline():
    """nvshmemx_hostlib_init_attr (the bootstrap that waits for every PE) is called inside the deadline (a source
    check: the start needs a process group and NVSHMEM's library to run)."""
    import inspect

    lines = inspect.getsource(nvshmem.init).splitlines()
    at = next(i for i, line in enumerate(lines) if "with _deadline(" in line)
    indent = len(lines[at]) - len(lines[at].lstrip())
    block = []
    for line in lines[at + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break  # the with block ended
        block.append(line)
    assert sum("lib.nvshmemx_hostlib_init_attr(" in line for line in block) == 2  # at once, or rail by rail
    assert sum("lib.nvshmemx_hostlib_init_attr(" in line for line in lines) == 2  # and nowhere else
