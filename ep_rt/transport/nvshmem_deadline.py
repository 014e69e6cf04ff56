"""A deadline for NVSHMEM's collective host calls.

NVSHMEM's start (the unique-id bootstrap), a symmetric allocation (nvshmem_align), nvshmem_barrier_all, nvshmem_free
and the finalize each wait inside the library for every PE of the world, with no deadline of their own, and a thread
blocked in them cannot be interrupted from Python. A peer that failed or died after the Buffer's inputs were compared
(transport.agreement, which has the process group's deadline) would leave every other rank waiting there forever.
So each such call runs under a watchdog: past EP_RT_NVSHMEM_TIMEOUT_S (default 600 s, as torch's default collective
timeout) the process writes what it waited for and why, and ends with EXIT_CODE, so that the job fails (and a
launcher can restart it) instead of hanging. Ending the process is the only way out of a call that never returns;
0 turns the watchdog off (NVSHMEM's own behaviour).
"""

from __future__ import annotations

import os
import threading

from .. import env

EXIT_CODE = 124  # as timeout(1): the process was ended because a wait passed its deadline


class CollectiveDeadline:
    """`with CollectiveDeadline(what, rank):` around one NVSHMEM collective host call."""

    def __init__(self, what: str, rank: int | None = None, seconds: float | None = None):
        self.what, self.rank = what, rank
        self.seconds = env.nvshmem_timeout_s() if seconds is None else float(seconds)
        self._timer: threading.Timer | None = None

    def __enter__(self):
        if self.seconds > 0:
            timer = threading.Timer(self.seconds, self._expire)
            timer.daemon = True
            try:
                timer.start()
                self._timer = timer
            except RuntimeError:  # no new thread at interpreter shutdown: the call runs as NVSHMEM's own
                self._timer = None
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def message(self) -> str:
        who = "ep_rt" if self.rank is None else f"ep_rt: rank {self.rank}"
        return (
            f"{who}: {self.what} has waited {self.seconds:g} s for the other ranks, and NVSHMEM has no deadline of "
            f"its own: a rank that failed or died after the Buffer's inputs were compared leaves the others waiting "
            f"there forever. Ending this process (exit code {EXIT_CODE}) so that the job fails instead of hanging; "
            f"the first rank that failed says why. EP_RT_NVSHMEM_TIMEOUT_S sets this deadline (0: none).\n"
        )

    def _expire(self) -> None:
        # The main thread is inside NVSHMEM: write straight to the file descriptor, then end at once (no cleanup
        # can run while that call holds the library).
        try:
            os.write(2, self.message().encode())
        finally:
            os._exit(EXIT_CODE)
