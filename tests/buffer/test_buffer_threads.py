"""Two threads and one Buffer (ep_rt.call_guard), on the CPU with CUDA stubbed (tests/host_trace.py): a call made
while another thread is inside a call of the same Buffer is refused, naming both threads and calls, and launches
nothing; threads that take turns, a receive hook called from another thread, and calls under CUDA-graph capture go
through. The GPU side (a real late peer) is tests/gpu/test_server_gpu.py."""

import sys
import threading
import time

import pytest
import torch

from ep_rt import call_guard
from ep_rt.errors import EpRtError

from .. import host_trace


def _launches(trace) -> int:
    return sum(1 for e in trace.events if e[0] in ("launch", "launch_ex"))


def _in_host_wait(thread: threading.Thread, timeout_s: float = 10.0) -> None:
    """Until `thread` is inside the host's wait for the notify kernel's token."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident)
        while frame is not None:
            if frame.f_code.co_name == "wait_for_token":
                return
            frame = frame.f_back
        time.sleep(0.01)
    raise AssertionError("the dispatch thread never reached the host wait")


def _dispatch_in_thread(buf, inputs, name="scheduler"):
    x, idx, w, common = inputs
    box = {}

    def run():
        try:
            box["result"] = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        except BaseException as e:  # noqa: BLE001 (reported to the test)
            box["error"] = e

    t = threading.Thread(target=run, name=name)
    t.start()
    _in_host_wait(t)
    return t, box


def test_a_call_while_another_thread_is_inside_one_is_refused_naming_both():
    gate = threading.Event()
    with host_trace.driven("intranode", gate) as (trace, make):
        buf = make()
        inputs = host_trace.ht_inputs(buf)
        x, idx, w, common = inputs
        t, box = _dispatch_in_thread(buf, inputs)
        before = _launches(trace)
        with pytest.raises(EpRtError) as e:
            buf.get_dispatch_layout(idx, host_trace.E)
        msg = str(e.value)
        assert "thread 'MainThread'" in msg and "called Buffer.get_dispatch_layout" in msg, msg
        assert "thread 'scheduler'" in msg and "inside Buffer.dispatch" in msg, msg
        assert "one thread at a time" in msg
        with pytest.raises(EpRtError, match="inside Buffer.dispatch"):
            buf.combine(x, (1, 2, 3, 4, 5, 6))
        with pytest.raises(EpRtError, match="called Buffer.destroy"):
            buf.destroy()
        assert _launches(trace) == before  # the refused calls launched nothing
        gate.set()  # the late peer arrives
        t.join(10)
        assert "error" not in box, box.get("error")
        assert box["result"][3] == [3] * (host_trace.E // buf.group_size)  # the counts the stub published
        # The threads took turns: the main thread's calls go through now, the Buffer is healthy.
        recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        buf.combine(recv_x, handle)
        buf.destroy()
    assert not buf._errors.failed


def test_threads_taking_turns_and_a_hook_from_another_thread_are_fine():
    with host_trace.driven("intranode + low latency") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        out = {}

        def worker():
            out["dispatch"] = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)

        t = threading.Thread(target=worker, name="ubatch-1")
        t.start()
        t.join()
        buf.combine(out["dispatch"][0], out["dispatch"][4])  # the main thread, after the worker's call
        _, _, handle, _, hook = buf.low_latency_dispatch(x, idx, 8, host_trace.E, return_recv_hook=True)
        launches = _launches(trace)
        t = threading.Thread(target=hook, name="hook-caller")
        t.start()
        t.join()
        assert _launches(trace) == launches + 1  # the hook launched the receive kernel
        buf.destroy()
    assert not buf._errors.failed


def test_a_hook_called_while_another_thread_is_inside_a_call_is_refused():
    gate = threading.Event()
    with host_trace.driven("intranode + low latency", gate) as (trace, make):
        buf = make()
        inputs = host_trace.ht_inputs(buf)
        x, idx, _, _ = inputs
        _, _, _, _, hook = buf.low_latency_dispatch(x, idx, 8, host_trace.E, return_recv_hook=True)
        t, box = _dispatch_in_thread(buf, inputs)
        with pytest.raises(
            EpRtError,
            match="called Buffer.low_latency_dispatch's receive hook while thread "
            "'scheduler' .* is inside Buffer.dispatch",
        ):
            hook()
        gate.set()
        t.join(10)
        assert "error" not in box
        launches = _launches(trace)
        hook()  # its turn now
        assert _launches(trace) == launches + 1
        buf.destroy()


def test_calls_under_cuda_graph_capture_go_through_the_guard(monkeypatch):
    """The guard runs on the host only (no CUDA call: the host trace is unchanged); inside a capture the LL calls,
    their hooks and a num_worst_tokens dispatch still launch what they launch."""
    with host_trace.driven("intranode + low latency") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        launches = _launches(trace)
        _, _, handle, _, hook = buf.low_latency_dispatch(x, idx, 8, host_trace.E, return_recv_hook=True)
        hook()
        y = torch.zeros(host_trace.E // buf.group_size, buf.group_size * 8, host_trace.H, dtype=torch.bfloat16)
        _, _, hook = buf.low_latency_combine(y, idx, w, handle, return_recv_hook=True)
        hook()
        buf.dispatch(x, topk_idx=idx, topk_weights=w, num_worst_tokens=32, **common)
        assert _launches(trace) == launches + 7  # send + receive, twice; the id check, notify and dispatch
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        buf.destroy()


def test_the_wrapper_keeps_the_methods_signature_and_refuses_what_it_cannot_forward():
    import inspect

    from ep_rt import Buffer

    assert list(inspect.signature(Buffer.dispatch).parameters)[:3] == ["self", "x", "handle"]
    assert Buffer.dispatch.__wrapped__.__name__ == "dispatch"

    def variadic(self, *args):
        pass

    with pytest.raises(TypeError, match="cannot forward"):
        call_guard.one_at_a_time(None)(variadic)

    class Plain:
        rank = 3

        @call_guard.one_at_a_time(None)
        def call(self, a, b=2, *, c=3):
            return a, b, c

    assert Plain().call(1, c=5) == (1, 2, 5)
    assert Plain().call(a=1, b=4) == (1, 4, 3)


def test_a_new_thread_binds_the_device_context_once_before_it_launches():
    """A thread that has not used CUDA has no current context, and the driver-API launches would fail: the first
    call or hook of a Buffer on a new thread makes the device's primary context current (once per thread), the
    constructing thread never again."""
    with host_trace.driven("intranode + low latency") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        binds = lambda: sum(1 for e in trace.events if e[0] == "driver.ensure_context")  # noqa: E731
        after_init = binds()
        _, _, handle, _, hook = buf.low_latency_dispatch(x, idx, 8, host_trace.E, return_recv_hook=True)
        assert binds() == after_init  # the constructing thread is bound already
        order = []

        def on_new_thread():
            hook()
            order.append(binds())
            _, _, _, _, hook2 = buf.low_latency_dispatch(x, idx, 8, host_trace.E, return_recv_hook=True)
            hook2()
            order.append(binds())

        t = threading.Thread(target=on_new_thread, name="hook-caller")
        t.start()
        t.join()
        assert order == [after_init + 1, after_init + 1], order  # bound once, at its first call, before launching
        buf.destroy()
    assert not buf._errors.failed
