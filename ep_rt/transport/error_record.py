"""The host-mapped error records kernels fill in, and a Buffer's failed state.

One page of host memory mapped into the device holds one ErrorRecord per kernel family that can fail on its own
(the NVL kernels, the low-latency kernels). A kernel's first failing block claims its family's device-memory
claim word, fills the record and writes `code` last; the host turns a set code into the exception to raise.

Two kinds of error. The caller's input was wrong but every rank finished the call (an expert id out of range,
more rows than num_worst_tokens or than the NVL buffer holds): raised once, then the record is re-armed and the part keeps working. Anything
else (a peer that never came, ranks that called with different shapes): the part stays failed, since its peers
may be anywhere in their calls; the other parts keep working.
"""

from __future__ import annotations

import ctypes

from ..errors import EpRtError, error_from_record
from ..runtime import abi, driver

RECORD_BYTES = 128
# "input": the expert ids the layout family checks (ops/layout.py); no communication kernel watches it, so an error
# there never stops a call midway, and the host raises it only at the end of a call (ep_rt.buffer).
INPUT_SLOT = "input"
SLOTS = ("nvl", "low_latency", "internode", INPUT_SLOT)
RECOVERABLE = (
    abi.EP_RT_ERR_BAD_EXPERT,
    abi.EP_RT_ERR_WORST_TOKENS,
    abi.EP_RT_ERR_CAPACITY,
)  # the call completed on every rank


class ErrorRecords:
    error_slot = None  # a transport part with no slot of its own: freed whatever the peers do

    def __init__(self, mapped: bool = True):
        """mapped=False: plain host memory no kernel can reach (CPU tests of the decoding and failed state)."""
        nbytes = RECORD_BYTES * len(SLOTS)
        if mapped:
            self.host_ptr, self.dev_ptr = driver.host_alloc_mapped(nbytes)
        else:
            self._plain = ctypes.create_string_buffer(nbytes)
            self.host_ptr, self.dev_ptr = ctypes.addressof(self._plain), 0
        self.mapped = mapped
        ctypes.memset(self.host_ptr, 0, nbytes)
        self.failed: dict[str, EpRtError] = {}
        self._rearm = {}
        self._ranks_per_node: dict[str, int] = {}  # slots whose messages name nodes (internode)
        self._codes: dict[str, ctypes.c_int32] = {}  # each slot's code word, viewed once (check)

    def on_rearm(self, slot: str, reset_claim) -> None:
        """How to re-arm `slot` after a recoverable error: reset_claim() clears the family's device claim word."""
        self._rearm[slot] = reset_claim

    def name_nodes(self, slot: str, ranks_per_node: int) -> None:
        """Messages of `slot` name each rank's node (nodes of ranks_per_node ranks)."""
        self._ranks_per_node[slot] = ranks_per_node

    def device_ptr(self, slot: str) -> int:
        return self.dev_ptr + RECORD_BYTES * SLOTS.index(slot)

    def record(self, slot: str) -> abi.ErrorRecord:
        return abi.ErrorRecord.from_address(self.host_ptr + RECORD_BYTES * SLOTS.index(slot))

    def check(self, slot: str) -> EpRtError | None:
        """The error `slot` holds (a kernel's record, or one the host set), if any. A recoverable one is returned
        once and the slot re-armed. Every call checks its parts' slots (some twice), so an unset record costs one
        read of its code word through a view made once (a kernel writes the code last)."""
        err = self.failed.get(slot)
        if err is not None or not self.host_ptr:
            return err
        code = self._codes.get(slot)
        if code is None:
            code = self._codes[slot] = ctypes.c_int32.from_address(
                self.host_ptr + RECORD_BYTES * SLOTS.index(slot) + abi.ErrorRecord.code.offset
            )
        if code.value == 0:
            return None
        rec = self.record(slot)
        err = self._decoded(slot)
        if err is not None and rec.code in RECOVERABLE and slot in self._rearm:
            import torch

            torch.cuda.synchronize()  # the failing kernel has finished before its claim is reset
            self._rearm[slot]()
            ctypes.memset(ctypes.addressof(rec), 0, ctypes.sizeof(rec))
            return err
        if err is not None:
            self.failed[slot] = err
        return self.failed.get(slot)

    def raise_if_failed(self, slot: str | None = None) -> None:
        for s in SLOTS if slot is None else (slot,):
            err = self.check(s)
            if err is not None:
                raise err

    def peer_may_be_gone(self) -> bool:
        """Whether any slot holds a CommTimeoutError: a peer did not come, so a collective teardown would wait for
        it (Buffer.destroy then frees NVSHMEM without one)."""
        from ..errors import CommTimeoutError

        def recorded(slot):  # decoded without re-arming a recoverable one (a timeout never is)
            if slot in self.failed or not self.host_ptr:
                return self.failed.get(slot)
            return self._decoded(slot)

        return any(isinstance(recorded(s), CommTimeoutError) for s in SLOTS)

    def _decoded(self, slot: str) -> EpRtError | None:
        """The error the kernel's record of `slot` says (None while its code is unset); no side effect."""
        return error_from_record(self.record(slot), self._ranks_per_node.get(slot))

    def fail(self, slot: str, err: EpRtError) -> EpRtError:
        """Mark `slot` failed by the host (a host-side timeout, a released Buffer); returns the error."""
        self.failed.setdefault(slot, err)
        return self.failed[slot]

    def destroy(self, collective: bool) -> None:
        if self.host_ptr and self.mapped:
            driver.host_free(self.host_ptr)
        self.host_ptr = 0
        self._codes.clear()
