"""The host's wait for a token that a notify kernel publishes in mapped host memory (with the receive counts)."""

from __future__ import annotations

import time

from ..errors import EpRtError
from .error_record import ErrorRecords

# The first microseconds the wait spins holding the GIL (most notify kernels publish within them); after that every
# turn yields the GIL and the CPU (time.sleep(0)), so the caller's other Python threads, and the host proxy thread of
# NVSHMEM's IBRC / UCX / libfabric transports, keep running while a dispatch waits (shared/docs/NETWORK.md §8). Past
# YIELD_S a wait is long (a late peer) and naps NAP_S between looks: a sleep(0) takes the GIL back at once, and
# another thread then loses it every few microseconds (on the CPU: 0.93 median, 0.69 worst of a busy thread's alone
# rate with sleep(0) only, 0.98 and 0.84 with the naps; one look per nap costs at most ~0.1 ms of a wait that already
# took 1 ms).
SPIN_S = 50e-6
YIELD_S = 1e-3
NAP_S = 50e-6


def wait_for_token(
    counters, index: int, token: int, timeout_s: float, errors: ErrorRecords, slot: str, who: str, phase: str
) -> None:
    """Wait until counters[index] == token: spin for SPIN_S, then yield the GIL between looks (past YIELD_S, nap
    NAP_S between them). The kernel's own
    error (which names the missing peer) is raised as soon as it is recorded; past 1.5 x timeout_s + 2 s (later than
    the kernels' deadline, so theirs comes first) the slot is failed with a host timeout. `who` names the rank in
    the message. An interrupt (KeyboardInterrupt, SystemExit) during the wait fails the slot ("interrupted
    during <phase>") and propagates."""
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
                    time.sleep(NAP_S)  # a long wait: leave the GIL to the other threads between looks
                elif now > spin_until:
                    time.sleep(0)  # releases the GIL, yields the CPU
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


def settle_after_interrupt(device) -> None:
    """An interrupt (Ctrl-C, SIGTERM's SystemExit) cut a host wait short during a teardown: wait for this device's
    kernels (every wait they make has a deadline) before their memory is freed; a second interrupt skips the wait,
    and the memory is freed anyway, as asked."""
    import torch

    try:
        torch.cuda.synchronize(device)
    except BaseException:  # noqa: BLE001
        pass
