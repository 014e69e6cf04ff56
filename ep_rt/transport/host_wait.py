"""The host's wait for a token that a notify kernel publishes in mapped host memory (with the receive counts)."""
from __future__ import annotations

import time

from ..errors import EpRtError
from .error_record import ErrorRecords


def wait_for_token(counters, index: int, token: int, timeout_s: float, errors: ErrorRecords, slot: str, who: str,
                   phase: str) -> None:
    """Spin until counters[index] == token. The kernel's own error (which names the missing peer) is raised as soon
    as it is recorded; past 1.5 x timeout_s + 2 s (later than the kernels' deadline, so theirs comes first) the slot
    is failed with a host timeout. `who` names the rank in the message."""
    deadline = time.monotonic() + 1.5 * timeout_s + 2.0
    spins = 0
    while counters[index] != token:
        spins += 1
        if spins % 256 == 0:
            errors.raise_if_failed(slot)
            if time.monotonic() > deadline:
                raise errors.fail(slot, EpRtError(
                    f"{who}: host timed out after {timeout_s:.1f} s in {phase}: the GPU never published the receive "
                    f"counts. A peer rank did not make the same call, or the GPU is stuck behind earlier work. The "
                    f"Buffer is unusable now; destroy it."))
