"""Events and stream rules shared by every communication call (DeepEP's semantics)."""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Tuple

import torch

from .runtime import driver, launch

# torch.cuda.current_stream() costs about 4 us of Python per call on an H100 host (device-index normalisation, a
# new Stream object; tools/host_profile.py, attempt 20261206T030429Z), and every call takes it at least once. These
# are the two C calls it makes; a torch without them (no CUDA build) takes the plain way.
_device_index = getattr(torch._C, "_cuda_getDevice", None)
_stream_of_device = getattr(torch._C, "_cuda_getCurrentStream", None)
_streams: dict = {}  # (stream id, device index, device type) -> its Stream object


def current_stream() -> torch.cuda.Stream:
    """torch.cuda.current_stream() of the current device, the Stream object kept per stream."""
    if _stream_of_device is None:
        return torch.cuda.current_stream()
    key = _stream_of_device(_device_index())
    stream = _streams.get(key)
    if stream is None:
        if len(_streams) >= 256:  # a caller cycling through new streams: keep the table small
            _streams.clear()
        stream = _streams[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return stream


# One reusable event per stream for stream-to-stream waits (torch's Stream.wait_stream makes a new CUDA event on
# every call), recorded and waited for through the driver. The raw driver pair is 0.6 us faster than torch's, but
# the lookups around it take most of that back: on one H100 host this fence took 1.70 us against 1.71 for torch's
# pair alone (tools/host_profile.py, attempt 20261207T035415Z; docs/HOST_PATH.md). torch makes the event (at its
# first record, on the waitee's device, which is how the event gets the right context) and destroys it with the
# Event object, also when a wait for it is still queued. Recording it again at once is safe: a wait already queued
# keeps its point.
_fences: dict = {}  # (device index, waitee handle) -> (torch Event, its CUevent, the waitee's CUstream)


def _fence_of(waitee, handle) -> tuple:
    key = (waitee.device_index, handle)
    fence = _fences.get(key)
    if fence is None:
        if len(_fences) >= 256:  # a caller cycling through new streams: keep the table small
            _fences.clear()
        event = torch.cuda.Event()
        event.record(waitee)
        fence = _fences[key] = (event, driver.make_event(event.cuda_event), launch.driver_stream(waitee))
    return fence


def wait_stream(waiter, waitee) -> None:
    """`waiter` waits for the work queued on `waitee` so far, as waiter.wait_stream(waitee) but with the waitee's
    reused fence event and the driver's calls. A stream object without a handle (a stand-in) waits the plain way."""
    handle = getattr(waitee, "cuda_stream", None)
    if handle is None or getattr(waiter, "cuda_stream", None) is None:
        waiter.wait_stream(waitee)
        return
    _, event, stream = _fence_of(waitee, handle)
    driver.record_and_wait(event, stream, launch.driver_stream(waiter))


_UNCHANGED = contextlib.nullcontext()


def allocating_on(stream):
    """`with allocating_on(s):` allocates on stream s; s None means the current stream, which needs no
    torch.cuda.stream context (entering one that changes nothing costs a few microseconds of Python per call)."""
    return _UNCHANGED if stream is None else torch.cuda.stream(stream)


class EventHandle:
    """A CUDA event recorded on a stream (the current stream by default)."""

    def __init__(self, stream: Optional[torch.cuda.Stream] = None):
        self.event = torch.cuda.Event()
        self.event.record(stream if stream is not None else current_stream())

    def current_stream_wait(self) -> None:
        current_stream().wait_event(self.event)


class EventOverlap:
    """What every call returns: an optional event to wait on, plus tensors kept alive until then
    (a CUDA-graph-friendly stand-in for record_stream). Usable as a context manager."""

    def __init__(self, event: Optional[EventHandle] = None, extra_tensors: Optional[Tuple[Any, ...]] = None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is None:
            raise RuntimeError("this EventOverlap holds no event (the call was not async_finish)")
        self.event.current_stream_wait()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.event is not None:
            self.event.current_stream_wait()


def event_of(previous_event) -> Optional[EventHandle]:
    """The EventHandle a call's previous_event holds, or None. As in DeepEP, an EventOverlap without an event
    (what a call without async_finish returns) means "no event": Megatron passes get_dispatch_layout's event on
    to dispatch whatever it holds."""
    if previous_event is None:
        return None
    if not isinstance(previous_event, EventOverlap):
        raise TypeError(
            f"previous_event must be an EventOverlap (e.g. Buffer.capture()), got {type(previous_event).__name__}"
        )
    event = previous_event.event
    if event is not None and not isinstance(event, EventHandle):
        raise TypeError(f"previous_event.event must be an EventHandle, got {type(event).__name__}")
    return event


class StreamScope:
    """One call's stream discipline: the comm stream waits `previous_event` (or the current stream),
    kernels run on the comm stream, then either an event is returned (async_finish, tensors recorded
    on the comm stream) or the current stream waits the comm stream."""

    def __init__(
        self,
        comm_stream: torch.cuda.Stream,
        previous_event: Optional[EventOverlap],
        async_finish: bool,
        allocate_on_comm_stream: bool,
    ):
        previous_event = event_of(previous_event)
        if allocate_on_comm_stream and not (previous_event is not None and async_finish):
            raise ValueError(
                "allocate_on_comm_stream=True requires previous_event (holding an event) and async_finish=True"
            )
        self.comm = comm_stream
        self.compute = current_stream()
        self.async_finish = async_finish
        self.allocate_on_comm = allocate_on_comm_stream
        if previous_event is not None:
            self.comm.wait_event(previous_event.event)
        else:
            wait_stream(self.comm, self.compute)

    def alloc_stream(self) -> Optional[torch.cuda.Stream]:
        """The stream the call's outputs are allocated on: the comm stream, or None for the current one (what
        allocating_on takes: no stream context is entered for it)."""
        return self.comm if self.allocate_on_comm else None

    def finish(self, tensors) -> EventOverlap:
        if self.async_finish:
            event = EventHandle(self.comm)
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    t.record_stream(self.comm)
                    if self.allocate_on_comm:
                        t.record_stream(self.compute)
            return EventOverlap(event, tuple(t for t in tensors if isinstance(t, torch.Tensor)))
        wait_stream(self.compute, self.comm)
        return EventOverlap(None)
