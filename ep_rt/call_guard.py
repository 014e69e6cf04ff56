"""One call at a time on a Buffer, and the state an interrupt leaves (Buffer's public calls are wrapped in
`one_at_a_time`).

Threads. A Buffer's calls are collective: every rank must make them in the same order. Two threads of a process
inside calls of one Buffer at the same time would launch kernels in an order that can differ from rank to rank, and
serialising them with a lock would not fix that order, so the overlap is refused: the second thread gets EpRtError
naming both threads and both calls. Threads that take turns are fine (vLLM's dual-batch overlap ping-pongs two
threads over one Buffer; a receive hook called from another thread once the call returned): only calls in flight
at the same time are refused. DeepEP itself has no check; its users keep one thread per Buffer at a time.

Interrupts. KeyboardInterrupt or SystemExit (SIGINT, or a SIGTERM handler that calls sys.exit) raised inside a call
can leave this rank's kernels launched up to some point while its peers wait for the rest: the slot of the call's
op is marked failed ("interrupted during ..."), so later calls raise that error and destroy() frees that part
without a collective that could wait for peers that never come. The interrupt itself propagates, with a note.

The wrapper reads four Buffer names (_errors, rank, is_internode, _context_device) and keeps its lock as
Buffer._call_lock."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from _thread import get_ident

from .errors import EpRtError
from .runtime import driver

# The kind of a call: which ErrorRecords slot an interrupt inside it fails. HT: the high-throughput op's ("nvl"
# intranode, "internode" across nodes); None: a call that runs nothing collective (an interrupt leaves no peer
# waiting).
HT, LL, NVL = "ht", "low_latency", "nvl"

_making = threading.Lock()
_GUARDS: set = set()  # the code objects of the wrappers (how _holder finds the thread inside a call)

# The wrapper of one method, with the method's own parameters: forwarding them as they are costs a fraction of
# `*args, **kwargs` (about 1 us a call for dispatch's 14 on a loaded CPU). The lock's acquire(False) is atomic, so two
# threads cannot both get in; it is reentrant because internode_dispatch calls dispatch.
_TEMPLATE = """
def {name}({params}):
    try:
        lock = self._call_lock
    except AttributeError:
        lock = _lock_of(self)
    if not lock.acquire(False):
        raise _overlap(self, {name!r})
    try:
        _bind(self)
        result = _method({args})
    except BaseException as e:
        if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: not the caller's bad input
            _interrupted(self, _kind, {name!r}, e)
        raise
    finally:
        lock.release()
    if _hook and result[-1] is not None:
        result = (*result[:-1], _guarded_hook(self, result[-1], _kind, {hook_name!r}))
    return result
"""

_TEMPLATE_NAMES = {"lock", "result", "e"}  # the wrapper's own locals: no method parameter may be named so


def one_at_a_time(kind: str | None, hook: bool = False):
    """Wrap a Buffer method: refuse it while another thread is inside a call of the same Buffer, and mark the
    `kind` slot failed when an interrupt leaves it. hook: the method returns a tuple whose last item is a receive
    hook (or None), which is wrapped the same way."""

    def wrap(method):
        params, args, defaults = [], [], {}
        for p in inspect.signature(method).parameters.values():
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.name in _TEMPLATE_NAMES:
                raise TypeError(f"one_at_a_time: {method.__name__} has a parameter it cannot forward: {p}")
            if p.kind == p.KEYWORD_ONLY and "*" not in params:
                params.append("*")
            if p.default is p.empty:
                params.append(p.name)
            else:
                defaults[f"_default_{p.name}"] = p.default
                params.append(f"{p.name}=_default_{p.name}")
            args.append(p.name if p.kind == p.POSITIONAL_OR_KEYWORD else f"{p.name}={p.name}")
        names = dict(
            defaults,
            _method=method,
            _kind=kind,
            _hook=hook,
            _lock_of=_lock_of,
            _overlap=_overlap,
            _interrupted=interrupted,
            _guarded_hook=_guarded_hook,
            _bind=bind_context,
        )
        source = _TEMPLATE.format(
            name=method.__name__,
            hook_name=method.__name__ + "'s receive hook",
            params=", ".join(params),
            args=", ".join(args),
        )
        exec(compile(source, f"<ep_rt.call_guard {method.__name__}>", "exec"), names)
        guarded = names[method.__name__]
        _GUARDS.add(guarded.__code__)
        return functools.wraps(method)(guarded)

    return wrap


def _guarded_hook(buf, run, kind: str | None, what: str):
    def hook():
        self = buf  # (named as in the wrappers: _holder looks for `self`)
        lock = self._call_lock
        if not lock.acquire(False):
            raise _overlap(self, what)
        try:
            bind_context(self)
            return run()
        except BaseException as e:
            if not isinstance(e, Exception):
                interrupted(self, kind, what, e)
            raise
        finally:
            lock.release()

    return hook


_GUARDS.update(c for c in _guarded_hook.__code__.co_consts if inspect.iscode(c))  # the hook's code


# The devices whose primary context is current on this thread, as far as ep_rt made it so. A thread that has not
# used CUDA yet (a hook called from a new thread, a second thread taking turns) has no current context, and the
# driver API launches would fail with CUDA_ERROR_INVALID_CONTEXT; torch binds its context lazily, and a call may
# launch before any torch CUDA operation of that thread. Per thread (threading.local dies with its thread; thread ids
# are reused).
_bound = threading.local()


def mark_context_bound(device_index: int) -> None:
    """This thread has the device's primary context current (Buffer's constructor made it so)."""
    devices = getattr(_bound, "devices", None)
    if devices is None:
        devices = _bound.devices = set()
    devices.add(device_index)


def bind_context(buf) -> None:
    """Make the Buffer's device context current on this thread, once per thread and device."""
    dev = getattr(buf, "_context_device", None)
    if dev is None:  # (a Buffer built without __init__, as the host-path tools and stand-ins do)
        return
    devices = getattr(_bound, "devices", None)
    if devices is None or dev not in devices:
        driver.ensure_context(dev)
        mark_context_bound(dev)


def _lock_of(buf):
    """The Buffer's call lock, made at its first call (a Buffer built without __init__, as the host-path tools do,
    gets one too)."""
    with _making:
        lock = buf.__dict__.get("_call_lock")
        if lock is None:
            lock = buf._call_lock = threading.RLock()
        return lock


def _holder(buf) -> tuple[str, str]:
    """(the thread, the call) inside a call of `buf`: looked up in the threads' stacks, only when a call is refused
    (so the hot path stores nothing)."""
    for ident, frame in sys._current_frames().items():
        if ident == get_ident():
            continue
        while frame is not None:
            if frame.f_code in _GUARDS and frame.f_locals.get("self") is buf:
                what = frame.f_locals.get("what", frame.f_code.co_name)
                return _thread_name(ident), what
            frame = frame.f_back
    return "(another thread, gone by now)", "a call"


def _thread_name(ident: int) -> str:
    for t in threading.enumerate():
        if t.ident == ident:
            return f"{t.name!r} (id {ident})"
    return f"id {ident}"


def _overlap(buf, what: str) -> EpRtError:
    holder, inside = _holder(buf)
    return EpRtError(
        f"rank {getattr(buf, 'rank', '?')}: thread {_thread_name(get_ident())} called Buffer.{what} while thread "
        f"{holder} is inside Buffer.{inside} of the same Buffer. A Buffer's calls are collective and must be made "
        f"in the same order on every rank, so ep_rt does not run two at once: make each Buffer's calls from one "
        f"thread at a time (threads that take turns are fine), or give each thread its own Buffer. Nothing was "
        f"launched for this call; the other call goes on."
    )


def interrupted(buf, kind: str | None, what: str, exc: BaseException) -> None:
    """Mark the slot of a `kind` call failed after `exc` (an interrupt) left it; a note on `exc` says so. A failure
    the call recorded first (the host wait's, which names the phase) is kept."""
    errors = getattr(buf, "_errors", None)
    if kind is None or errors is None or any(str(n).startswith("ep_rt:") for n in getattr(exc, "__notes__", ())):
        return  # nothing collective, or noted by an inner call already
    slot = ("internode" if buf.is_internode else NVL) if kind == HT else kind
    err = errors.fail(
        slot,
        EpRtError(
            f"rank {buf.rank}: interrupted ({type(exc).__name__}) during Buffer.{what}: this rank left the call while "
            f"its peers may still be in it, so this Buffer's {slot} calls are unusable now. destroy() frees the Buffer "
            f"without waiting for those peers; then create a new Buffer (every rank)."
        ),
    )
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(f"ep_rt: {err}")
