"""An interrupt inside a Buffer call (ep_rt.call_guard, transport/host_wait.py), on the CPU with CUDA stubbed
(tests/host_trace.py): KeyboardInterrupt or a SIGTERM handler's SystemExit during the host wait or between the
launches of one call propagates; the call's slot is failed ("interrupted during ..."), later calls raise that error,
destroy() frees the part without its collective barrier, and a new Buffer works. The interrupt comes the way Ctrl-C
and `kill` deliver it: a signal (or _thread.interrupt_main) handled in the main thread while it waits."""

import _thread
import os
import signal
import threading

import pytest

from ep_rt.errors import EpRtError
from ep_rt.runtime import driver
from ep_rt.transport.error_record import ErrorRecords
from ep_rt.transport.host_wait import wait_for_token

from .. import host_trace
from .test_buffer_threads import _in_host_wait


@pytest.fixture(autouse=True)
def _sigint_raises_keyboardinterrupt():
    """Python's own SIGINT handler for each test: a process started in the background by a non-interactive shell
    inherits SIGINT ignored, and then _thread.interrupt_main does nothing (the wait ran to its host timeout)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _events_after(trace, start: int, kind: str):
    return [e for e in trace.events[start:] if e[0] == kind or (kind == "launch" and e[0] == "launch_ex")]


def _launched(trace, start: int) -> list:
    return [e[1] for e in _events_after(trace, start, "launch")]


def _interrupt_after(seconds: float) -> threading.Timer:
    t = threading.Timer(seconds, _thread.interrupt_main)
    t.start()
    return t


def _interrupt_in_host_wait() -> threading.Thread:
    """Interrupt the main thread once it is inside the host wait (however slow the machine is to get there)."""
    main = threading.main_thread()

    def run():
        _in_host_wait(main)
        _thread.interrupt_main()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---- the host wait on its own (counters in a list: the token never comes) -----------------------------------------
def test_an_interrupt_during_the_host_wait_fails_the_slot_and_propagates():
    errors = ErrorRecords(mapped=False)
    timer = _interrupt_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        wait_for_token([0], 0, 5, 30.0, errors, "nvl", "rank 1", "dispatch notify")
    timer.join()
    with pytest.raises(EpRtError, match="rank 1: interrupted \\(KeyboardInterrupt\\) during dispatch notify"):
        errors.raise_if_failed("nvl")
    assert "low_latency" not in errors.failed and "internode" not in errors.failed


def test_a_sigterm_handler_that_exits_during_the_host_wait_fails_the_slot():
    def exit_on_term(signum, frame):
        raise SystemExit(143)

    errors = ErrorRecords(mapped=False)
    old = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        with pytest.raises(SystemExit):
            wait_for_token([0], 0, 5, 30.0, errors, "internode", "rank 3 (node 1)", "internode dispatch notify")
        timer.join()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert "interrupted (SystemExit) during internode dispatch notify" in str(errors.failed["internode"])


def test_the_callers_own_errors_do_not_count_as_interrupts():
    class Broken:
        def __getitem__(self, i):
            raise ValueError("bad counters")

    errors = ErrorRecords(mapped=False)
    with pytest.raises(ValueError):
        wait_for_token(Broken(), 0, 5, 30.0, errors, "nvl", "rank 0", "dispatch notify")
    assert not errors.failed


# ---- a Buffer: the interrupt in its host wait, between its launches, in a hook ------------------------------------
def test_an_interrupt_in_a_dispatchs_host_wait_leaves_a_failed_buffer_that_destroys_and_a_new_one_works():
    gate = threading.Event()  # never set during the call: the peer never comes
    with host_trace.driven("intranode", gate) as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        timer = _interrupt_in_host_wait()
        with pytest.raises(KeyboardInterrupt) as e:
            buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        timer.join()
        assert any("interrupted (KeyboardInterrupt) during dispatch notify" in n for n in e.value.__notes__)
        for later in (
            lambda: buf.dispatch(x, topk_idx=idx, topk_weights=w, **common),
            lambda: buf.get_dispatch_layout(idx, host_trace.E),
        ):
            with pytest.raises(EpRtError, match="rank 0: interrupted \\(KeyboardInterrupt\\) during dispatch notify"):
                later()
        start = len(trace.events)
        buf.destroy()
        assert _launched(trace, start) == []  # no NVL barrier: the peers may never come to one
        # A new Buffer of the same group works (its own NVL buffer), and frees collectively.
        gate.set()  # the peers are back
        new = make()
        x, idx, w, common = host_trace.ht_inputs(new)
        recv_x, _, _, counts, handle, _ = new.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        assert counts == [3] * (host_trace.E // new.group_size)
        new.combine(recv_x, handle)
        start = len(trace.events)
        new.destroy()
        assert _launched(trace, start) == ["ep_rt_intranode_barrier"]  # what the check above would have seen


def _raise_at(monkeypatch, kernel: str, exc=KeyboardInterrupt):
    """The stubbed launch of `kernel` raises `exc`, once: a signal handled between two launches of a call."""
    real = {"launch": driver.launch, "launch_ex": driver.launch_ex}
    armed = {"on": True}

    def wrap(name):
        def f(*a):
            if armed["on"] and a[-1] == kernel:
                armed["on"] = False
                raise exc()
            return real[name](*a)

        return f

    monkeypatch.setattr(driver, "launch", wrap("launch"))
    monkeypatch.setattr(driver, "launch_ex", wrap("launch_ex"))


def test_an_interrupt_between_the_launches_of_an_internode_dispatch(monkeypatch):
    with host_trace.driven("internode") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        _raise_at(monkeypatch, "ep_rt_internode_forward")  # after notify, the host wait and send
        start = len(trace.events)
        with pytest.raises(KeyboardInterrupt) as e:
            buf.internode_dispatch(x, topk_idx=idx, topk_weights=w, **common)
        assert _launched(trace, start) == ["ep_rt_check_topk_idx", "ep_rt_internode_notify", "ep_rt_internode_send"]
        notes = [n for n in e.value.__notes__ if n.startswith("ep_rt:")]
        assert len(notes) == 1 and "interrupted (KeyboardInterrupt) during Buffer.dispatch" in notes[0], notes
        with pytest.raises(EpRtError, match="rank 1: interrupted .* during Buffer.dispatch: .* internode calls"):
            buf.combine(x, (None,) * 10)
        assert "nvl" not in buf._errors.failed  # the NVL buffer's peers finished with it: it frees collectively
        start = len(trace.events)
        buf.destroy()
        assert _launched(trace, start) == ["ep_rt_intranode_barrier"]  # no internode barrier
        assert ["NvshmemSession.destroy", False] in trace.events[start:]
        assert not _events_after(trace, start, "nvshmem.barrier_all")
        new = make()
        x, idx, w, common = host_trace.ht_inputs(new)
        new.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        start = len(trace.events)
        new.destroy()
        assert ["NvshmemSession.destroy", True] in trace.events[start:]


def test_an_interrupt_in_a_low_latency_call_fails_only_the_low_latency_slot(monkeypatch):
    with host_trace.driven("intranode + low latency") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        _raise_at(monkeypatch, "ep_rt_ll_dispatch", SystemExit)
        with pytest.raises(SystemExit):
            buf.low_latency_dispatch(x, idx, 8, host_trace.E)
        with pytest.raises(EpRtError, match="interrupted \\(SystemExit\\) during Buffer.low_latency_dispatch"):
            buf.low_latency_dispatch(x, idx, 8, host_trace.E)
        recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)  # HT still works
        buf.combine(recv_x, handle)
        start = len(trace.events)
        buf.destroy()
        assert _launched(trace, start) == ["ep_rt_intranode_barrier"]  # no LL barrier
        assert ["NvshmemSession.destroy", False] in trace.events[start:]


def test_an_interrupt_in_a_receive_hook_fails_the_low_latency_slot(monkeypatch):
    with host_trace.driven("low latency, shrink, no NVL") as (trace, make):
        buf = make()
        idx, x, w, _ = host_trace._inputs(buf.group_size)
        _, _, _, _, hook = buf.low_latency_dispatch(x, idx, 8, host_trace.E, return_recv_hook=True)
        _raise_at(monkeypatch, "ep_rt_ll_dispatch_recv")
        with pytest.raises(KeyboardInterrupt):
            hook()
        with pytest.raises(EpRtError, match="during Buffer.low_latency_dispatch's receive hook"):
            buf.low_latency_dispatch(x, idx, 8, host_trace.E)
        buf.destroy()


def test_an_interrupt_in_a_local_call_leaves_the_buffer_usable(monkeypatch):
    """get_dispatch_layout runs one kernel of this rank only: no peer waits for the rest of it."""
    with host_trace.driven("intranode") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        _raise_at(monkeypatch, "ep_rt_get_dispatch_layout")
        with pytest.raises(KeyboardInterrupt):
            buf.get_dispatch_layout(idx, host_trace.E)
        assert not buf._errors.failed
        buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        start = len(trace.events)
        buf.destroy()
        assert _launched(trace, start) == ["ep_rt_intranode_barrier"]


# ---- inside Buffer(): the caller never gets the Buffer, so its construction frees what it made -------------------
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, RuntimeError], ids=["ctrl-c", "sigterm", "error"])
def test_a_construction_that_fails_midway_frees_its_parts_without_collectives(monkeypatch, exc):
    import gc
    import warnings

    with host_trace.driven("internode + low latency") as (trace, make):
        _raise_at(monkeypatch, "ep_rt_internode_barrier", exc)  # the internode op's first barrier, mid-construction
        start = len(trace.events)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(exc):
                make()
            gc.collect()  # the half-built Buffer's finalizer has nothing left to warn about
        assert not [w for w in caught if "not destroyed" in str(w.message)], [str(w.message) for w in caught]
        after = trace.events[start:]
        assert ["NvshmemSession.destroy", False] in after  # freed, without NVSHMEM's collective teardown
        assert not _events_after(trace, start, "nvshmem.barrier_all")
        # every host page mapped for the device was freed again
        mapped = [e for e in after if e[0] == "driver.host_alloc_mapped"]
        freed = [e for e in after if e[0] == "driver.host_free"]
        assert mapped and len(freed) == len(mapped), (mapped, freed)
        new = make()  # and a new Buffer works
        x, idx, w, common = host_trace.ht_inputs(new)
        new.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        new.destroy()


# ---- inside destroy(): an interrupt makes the rest of the teardown local, and everything is still freed -----------
@pytest.mark.parametrize(
    "kernel,nvshmem_collective",
    [("ep_rt_internode_barrier", False), ("ep_rt_intranode_barrier", True)],
    ids=["in the NVSHMEM users' barrier", "in the NVL buffer's barrier"],
)
def test_an_interrupt_inside_destroy_still_frees_every_part_and_propagates(monkeypatch, kernel, nvshmem_collective):
    """The NVSHMEM users' barrier interrupted: NVSHMEM's collective teardown is skipped. The NVL buffer's barrier
    interrupted (it comes after NVSHMEM's teardown, whose barrier every peer passed): the parts after it are freed
    without collectives. Either way the interrupted barrier's kernel ends before any memory is freed."""
    with host_trace.driven("internode + low latency") as (trace, make):
        start = len(trace.events)
        buf = make()
        _raise_at(monkeypatch, kernel, lambda: trace.add("interrupt", kernel) or KeyboardInterrupt())
        at_destroy = len(trace.events)
        with pytest.raises(KeyboardInterrupt):
            buf.destroy()
        after = trace.events[at_destroy:]
        mapped = [e for e in trace.events[start:] if e[0] == "driver.host_alloc_mapped"]
        freed = [e for e in after if e[0] == "driver.host_free"]
        assert mapped and len(freed) == len(mapped), (mapped, freed)
        assert ["NvshmemSession.destroy", nvshmem_collective] in after
        hit = after.index(["interrupt", kernel])
        frees = [i for i, e in enumerate(after) if e[0] in ("driver.host_free", "driver.mem_free") and i > hit]
        syncs = [i for i, e in enumerate(after) if e[0] == "torch.cuda.synchronize" and i > hit]
        assert frees and syncs and syncs[0] < frees[0], (hit, syncs, frees)  # the barrier's kernel ended first
        buf.destroy()  # a second destroy() does nothing
        new = make()
        x, idx, w, common = host_trace.ht_inputs(new)
        new.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        new.destroy()
