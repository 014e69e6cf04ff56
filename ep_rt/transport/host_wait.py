"""The host's wait for a token that a notify kernel publishes in mapped host memory (with the receive counts)."""

from __future__ import annotations

import ctypes
import os
import sys
import time

from ..errors import EpRtError
from .error_record import ErrorRecords

# The first microseconds the wait spins holding the GIL (most notify kernels publish within them). After that every
# turn yields the GIL and the CPU (os.sched_yield releases the GIL and sets no timer), so the caller's other Python
# threads, and the host proxy thread of NVSHMEM's IBRC / UCX / libfabric transports, keep running while a dispatch
# waits (shared/docs/NETWORK.md §8); a host far ahead of its GPU waits in this phase. Past YIELD_S the wait is long
# (a late peer) and naps NAP_S between looks, leaving the CPU to other processes; a look per nap costs a wait that
# long at most 0.2 %. No timed sleep before that: Linux stretches every sleep by the thread's timer slack (50 us by
# default), so time.sleep(0) took ~60 us on the CPU machine, and the GPU sat idle that long after the counts came
# (docs/HOST_PATH.md, tools/host_wait_latency.py); the naps run with a fine slack, restored when the wait ends.
SPIN_S = 50e-6
YIELD_S = 50e-3
NAP_S = 20e-6
FINE_SLACK_NS = 1000  # the naps' timer slack (the calling thread's own, restored when the wait ends)
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()


def timer_slack_ns() -> int | None:
    """This thread's timer slack (Linux), or None where it cannot be read."""
    return None if _prctl is None else int(_prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0))


def set_timer_slack_ns(ns: int) -> bool:
    """Set this thread's timer slack (Linux); False where it cannot be set."""
    return _prctl is not None and _prctl(_PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0


def wait_for_token(
    counters, index: int, token: int, timeout_s: float, errors: ErrorRecords, slot: str, who: str, phase: str
) -> None:
    """Wait until counters[index] == token: spin for SPIN_S, then yield the GIL between looks (past YIELD_S, nap
    NAP_S between them, with this thread's timer slack lowered to FINE_SLACK_NS until the wait ends). The kernel's own
    error (which names the missing peer) is raised as soon as it is recorded; past 1.5 x timeout_s + 2 s (later than
    the kernels' deadline, so theirs comes first) the slot is failed with a host timeout. `who` names the rank in
    the message. An interrupt (KeyboardInterrupt, SystemExit) during the wait fails the slot ("interrupted
    during <phase>") and propagates."""
    slack = None  # the thread's own timer slack while the naps use a fine one
    try:
        start = time.monotonic()
        deadline = start + 1.5 * timeout_s + 2.0
        spin_until, nap_after = start + SPIN_S, start + YIELD_S
        spins = 0
        while counters[index] != token:
            spins += 1
            if spins % 32 == 0:
                now = time.monotonic()
                if now > nap_after:
                    if slack is None:
                        slack = timer_slack_ns() or 0
                        if slack > FINE_SLACK_NS and not set_timer_slack_ns(FINE_SLACK_NS):
                            slack = 0
                    time.sleep(NAP_S)  # a long wait: leave the GIL to the other threads between looks
                elif now > spin_until:
                    os.sched_yield()  # releases the GIL, yields the CPU, no timer
                if spins % 256 == 0:
                    errors.raise_if_failed(slot)
                    if now > deadline:
                        raise errors.fail(
                            slot,
                            EpRtError(
                                f"{who}: host timed out after {timeout_s:.1f} s in {phase}: the GPU never published "
                                f"the receive counts. A peer rank did not make the same call, or the GPU is stuck behind "
                                f"earlier work. The Buffer is unusable now; destroy it."
                            ),
                        )
    except BaseException as e:
        if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: this rank leaves, its peers go on
            errors.fail(
                slot,
                EpRtError(
                    f"{who}: interrupted ({type(e).__name__}) during {phase}, in the host's wait for the receive counts: "
                    f"this rank left the call while its peers may still be in it. The Buffer is unusable now; destroy() "
                    f"frees it without waiting for those peers; then create a new Buffer (every rank)."
                ),
            )
        raise
    finally:
        if slack and slack > FINE_SLACK_NS:
            set_timer_slack_ns(slack)


def settle_after_interrupt(device) -> None:
    """An interrupt (Ctrl-C, SIGTERM's SystemExit) cut a host wait short during a teardown: wait for this device's
    kernels (every wait they make has a deadline) before their memory is freed; a second interrupt skips the wait,
    and the memory is freed anyway, as asked."""
    import torch

    try:
        torch.cuda.synchronize(device)
    except BaseException:  # noqa: BLE001
        pass
