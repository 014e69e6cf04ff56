"""The switch between the two modes of a Buffer whose internode high-throughput op and low-latency op share one
symmetric buffer (DeepEP's LL-compatibility case, buffer_plan.BufferPlan.shared_symmetric).

Both ops put their payload in the caller's num_rdma_bytes; their control areas (signals, credits, barrier words)
follow it one after the other and never overlap. So the only hazard is the payload: a rank that starts a call of
one mode writes into its peers' buffers (and reuses its own) while a peer may still run, or still have messages in
flight from, a call of the other mode. The first call of a mode after a call of the other mode therefore starts
behind a barrier kernel on the stream it runs on (LowLatencyOp.launch_barrier: a deadline, masked ranks skipped, no
host sync). What that rests on, step by step (docs/INTERNODE_DESIGN.md, "One symmetric buffer for both modes"):

1. A peer's barrier signal leaves only after the kernels before the barrier on its stream ended (CUDA stream order),
   so every peer's earlier call, its reads of its own buffer included, is over.
2. Each of those calls ended only after its ranks received every message sent to them: every receive waits for
   every message its protocol counts, by signal. A put-with-signal's signal is delivered after its data (NVSHMEM's
   contract), so every byte this rank put was delivered, and read from its source: this rank may rewrite its
   sources (the evidence the LL buffer credits use, not a quiet).
3. The calls after the barrier on this stream start after it ended (CUDA stream order).

The caller's own writes into the payload count as LL use: get_next_low_latency_combine_buffer taken after
high-throughput calls runs the switch there, and the caller's stream waits for it.

DeepEP asks its callers for clean_low_latency_buffer() between high-throughput and low-latency calls; ep_rt inserts
the barrier itself. Not inside a CUDA-graph capture: a captured barrier would replay with the sequence number of
its capture and meet nobody, so the switch stays pending for the next call outside a capture, and a graph of LL
calls replayed right after high-throughput calls needs clean_low_latency_buffer() (or one eager LL call) between,
as DeepEP's does.
"""

from __future__ import annotations

import torch

from ..errors import EpRtError

HT, LL = "high-throughput", "low-latency"


class ModeSwitch:
    """Tracks which mode ran last on a shared symmetric buffer and puts the barrier between modes."""

    def __init__(self, ll_op, comm_stream: torch.cuda.Stream):
        self.ll = ll_op
        self.comm_stream = comm_stream
        self.last = None  # HT, LL, or None (nothing ran since construction, or since a clean: every rank met)
        self.switches = 0  # barriers launched (what the tests count)
        self._hook_done = None  # an event after the last LL receive hook, which ran on the caller's stream

    def before_high_throughput(self) -> None:
        """Before the kernels of an internode high-throughput call (after its comm stream waited for the caller):
        refuse while an LL receive hook is pending, and put the barrier on the comm stream after LL calls."""
        if any(self.ll.pending_recv):
            raise EpRtError(
                "a low-latency receive hook was never called; its receive still reads the symmetric buffer that "
                "this Buffer's high-throughput calls share (low_latency_mode with an NVL buffer across nodes, as "
                "DeepEP's). Call the hook before the next high-throughput call."
            )
        if self.last is None:  # nothing of the other mode since construction or a clean
            self.last = HT
        if self.last == HT or torch.cuda.is_current_stream_capturing():
            return
        if self._hook_done is not None:  # the last LL receive ran on the caller's stream of that time
            self.comm_stream.wait_event(self._hook_done)
        self._switch(self.comm_stream, HT)

    def before_low_latency(self) -> bool:
        """Before an LL call's first kernel, or before the caller writes into the LL send buffer (a zero-copy
        combine's): after high-throughput calls, the barrier on the comm stream, which the LL kernels then follow
        (eager calls run there; a hooked call's stream waits for it: LowLatencyOp.run). True if it was launched."""
        if self.last is None:
            self.last = LL
        if self.last == LL or torch.cuda.is_current_stream_capturing():
            return False
        self._switch(self.comm_stream, LL)
        self.ll.on_comm_stream = True  # a hooked call's current stream waits for the comm stream first
        return True

    def after_receive_hook(self) -> None:
        """An LL receive hook just launched its kernel on the current stream: a later high-throughput call's comm
        stream waits for it before the barrier."""
        if self._hook_done is None:
            self._hook_done = torch.cuda.Event()
        self._hook_done.record(torch.cuda.current_stream())

    def cleaned(self) -> None:
        """clean_low_latency_buffer ran: every rank met after every earlier kernel (host-synchronised barriers)."""
        self.last = None
        self._hook_done = None

    def _switch(self, stream, to: str) -> None:
        self.ll.launch_barrier(stream)
        self.switches += 1
        self.last = to
        self._hook_done = None
