"""Exceptions ep_rt raises, and the decoding of the error record kernels fill in.

Codes and phases are named by their mirrors in runtime/abi.py, the one Python source of the kernel interface (a
leaf that imports nothing of ep_rt, so this base module may read it); tests/runtime/test_errors.py checks that
every code and phase params.h defines has its words here."""

from __future__ import annotations

from .runtime import abi


class EpRtError(RuntimeError):
    """Base class of every ep_rt error."""


class CudaDriverError(EpRtError):
    """A CUDA driver call failed (the message names the call and the CUDA error)."""


class CubinNotFoundError(EpRtError):
    """No shipped cubin matches the GPU or the requested kernel family."""


class TopologyError(EpRtError):
    """The ranks of one node cannot reach each other over NVLink."""


class BufferTooSmallError(EpRtError):
    """The communication buffer cannot hold what a call needs."""


class CommTimeoutError(EpRtError):
    """A peer rank did not arrive in time; the buffer is unusable afterwards."""


class ConfigFileError(EpRtError):
    """The config file EP_RT_CONFIG_FILE names is missing or invalid."""


class NetworkSettingError(EpRtError, ValueError):
    """An NVSHMEM / network setting is invalid, or the environment sets it to what a Buffer argument or an ep_rt
    knob contradicts (the message names the variable)."""


class GroupError(EpRtError, ValueError):
    """Buffer was given no usable torch.distributed process group."""


class NoGpuError(EpRtError):
    """ep_rt's kernels need a CUDA GPU, and this process has none (or a CPU-only torch)."""


class RankMismatchError(EpRtError, ValueError):
    """The ranks of a Buffer's group passed different values for something every rank must share (a buffer size, a
    mode, the node size, a knob that shapes a collective allocation); raised on every rank, naming the ranks."""


class PeerSetupError(EpRtError):
    """Another rank of the group failed while setting up the same Buffer (its error is in the message); raised on
    every other rank, so that none waits in a collective that the failed rank never enters."""


class KernelError(EpRtError):
    """A kernel reported a failure through the error record."""


# The words for the codes and phases of params.h, keyed by their mirrors in runtime/abi.py (the one Python source
# of the kernel interface; tests/runtime/test_errors.py fails when params.h gains a code or phase that has no
# entry here).
ERROR_CODES = {
    abi.EP_RT_ERR_NONE: "none (the record is clear)",
    abi.EP_RT_ERR_TIMEOUT: "timeout (a peer, or the kernel's own blocks, did not arrive in time)",
    abi.EP_RT_ERR_CAPACITY: "capacity (more rows than a buffer, or an expert's slots, hold)",
    abi.EP_RT_ERR_WORST_TOKENS: "worst tokens (more tokens arrived than num_worst_tokens)",
    abi.EP_RT_ERR_MISMATCH: "mismatch (ranks called with different shapes)",
    abi.EP_RT_ERR_BAD_EXPERT: "bad expert (an expert id in topk_idx out of range)",
}
PHASES = {
    abi.EP_RT_PHASE_BARRIER: "barrier",
    abi.EP_RT_PHASE_NOTIFY: "dispatch notify (exchanging token counts)",
    abi.EP_RT_PHASE_DISPATCH_HANDSHAKE: "cached dispatch handshake",
    abi.EP_RT_PHASE_DISPATCH_RECV: "dispatch (receiving tokens)",
    abi.EP_RT_PHASE_COMBINE_HANDSHAKE: "combine handshake",
    abi.EP_RT_PHASE_COMBINE_RECV: "combine (receiving tokens)",
    abi.EP_RT_PHASE_LL_DISPATCH_RECV: "low-latency dispatch (receiving)",
    abi.EP_RT_PHASE_LL_COMBINE_RECV: "low-latency combine (receiving)",
    abi.EP_RT_PHASE_LL_DISPATCH_SEND: "low-latency dispatch (sending)",
    abi.EP_RT_PHASE_LL_BUFFER_FREE: "low-latency send (waiting until the peer has read the previous call on this buffer)",
    abi.EP_RT_PHASE_LL_BARRIER: "low-latency barrier (clean_low_latency_buffer or teardown)",
    abi.EP_RT_PHASE_LAYOUT_IDS: "get_dispatch_layout (checking topk_idx)",
    abi.EP_RT_PHASE_DISPATCH_IDS: "dispatch (checking topk_idx)",
    abi.EP_RT_PHASE_IN_NOTIFY: "internode dispatch notify (exchanging token counts over the network)",
    abi.EP_RT_PHASE_IN_HANDSHAKE: "internode cached dispatch handshake",
    abi.EP_RT_PHASE_IN_FORWARD: "internode dispatch (waiting for a source node's tokens, as its forwarder)",
    abi.EP_RT_PHASE_IN_RECV: "internode dispatch (receiving tokens from this node's forwarder)",
    abi.EP_RT_PHASE_IN_COMBINE_HANDSHAKE: "internode combine handshake",
    abi.EP_RT_PHASE_IN_COMBINE_FORWARD: "internode combine (waiting for this node's ranks' rows, as a forwarder)",
    abi.EP_RT_PHASE_IN_COMBINE_REDUCE: "internode combine (waiting for a node's partial sums)",
    abi.EP_RT_PHASE_IN_NOTIFY_RELAY: "internode dispatch notify (waiting for a source's counts, which its forwarder on this node relays)",
}
# The internode kernels' phases (every EP_RT_PHASE_IN_*; tests/runtime/test_errors.py checks): timeouts name nodes
# there.
INTERNODE_PHASES = frozenset(
    (
        abi.EP_RT_PHASE_IN_NOTIFY,
        abi.EP_RT_PHASE_IN_HANDSHAKE,
        abi.EP_RT_PHASE_IN_FORWARD,
        abi.EP_RT_PHASE_IN_RECV,
        abi.EP_RT_PHASE_IN_COMBINE_HANDSHAKE,
        abi.EP_RT_PHASE_IN_COMBINE_FORWARD,
        abi.EP_RT_PHASE_IN_COMBINE_REDUCE,
        abi.EP_RT_PHASE_IN_NOTIFY_RELAY,
    )
)
# The handshakes whose second half waits for this node's ranks, each of which first waits for its rail peers.
_RAIL_GATED_PHASES = (abi.EP_RT_PHASE_BARRIER, abi.EP_RT_PHASE_IN_HANDSHAKE, abi.EP_RT_PHASE_IN_COMBINE_HANDSHAKE)
# Low-latency receives: a mismatch there carries the shape digests, not a hidden size and top-k.
_LL_RECV_PHASES = (abi.EP_RT_PHASE_LL_DISPATCH_RECV, abi.EP_RT_PHASE_LL_COMBINE_RECV)


def describe_kernel_error(
    code: int,
    phase: int,
    rank: int,
    peer: int,
    channel: int,
    detail0: int,
    detail1: int,
    ranks_per_node: int | None = None,
) -> EpRtError:
    """Turn an error record into the exception to raise, with a message a user can act on. With ranks_per_node
    (internode), ranks are named with their node."""
    where = PHASES.get(phase, f"phase {phase}")
    chan = f", channel {channel}" if channel >= 0 else ""
    if ranks_per_node:
        G = ranks_per_node
        me, them = f"rank {rank} (node {rank // G})", f"rank {peer} (node {peer // G})"
    else:
        me, them = f"rank {rank}", f"rank {peer}"
    if code == abi.EP_RT_ERR_TIMEOUT and peer >= 0 and phase == abi.EP_RT_PHASE_IN_NOTIFY_RELAY and ranks_per_node:
        # the peer is the source whose counts never came; the forwarder of my node that relays them has its local
        # index (either may be the rank that is gone)
        f = rank // ranks_per_node * ranks_per_node + peer % ranks_per_node
        fwd = f"rank {f} (node {f // ranks_per_node})"
        return CommTimeoutError(
            f"{me}: timed out in {where} waiting for the counts of {them}, which {fwd} relays (expected call "
            f"#{detail0}, saw #{detail1}). {them[0].upper() + them[1:]} or {fwd} did not make the same ep_rt call, "
            f"died, or its node is unreachable. The Buffer is unusable now: destroy it and create a new one "
            f"(timeout: EP_RT_NET_TIMEOUT_S)."
        )
    if (
        code == abi.EP_RT_ERR_TIMEOUT
        and peer >= 0
        and phase in _RAIL_GATED_PHASES
        and ranks_per_node
        and peer // ranks_per_node == rank // ranks_per_node
    ):
        # A handshake's second half (internode.cu handshake): my node's ranks each raise their NVL word only after
        # their own rail peers on the other nodes answered, so a wait here may be for a rank of another node.
        who = "its own rail peers" if peer == rank else f"{them}, which itself waits for its rail peers"
        return CommTimeoutError(
            f"{me}: timed out in {where} waiting for {who} on the other nodes (expected call #{detail0}, saw "
            f"#{detail1}). A rank of another node (or of this one) did not make the same ep_rt call, died, or its node "
            f"is unreachable. The Buffer is unusable now: destroy it and create a new one (timeout: "
            f"EP_RT_NET_TIMEOUT_S)."
        )
    if code == abi.EP_RT_ERR_TIMEOUT and peer >= 0 and phase in INTERNODE_PHASES:
        return CommTimeoutError(
            f"{me}: timed out in {where} waiting for {them}{chan} (expected call #{detail0}, saw #{detail1}). "
            f"{them[0].upper() + them[1:]} did not make the same ep_rt call, died, or its node is unreachable. The "
            f"Buffer is unusable now: destroy it and create a new one (timeout: EP_RT_NET_TIMEOUT_S)."
        )
    if code == abi.EP_RT_ERR_CAPACITY and phase == abi.EP_RT_PHASE_IN_NOTIFY:
        return BufferTooSmallError(
            f"{me}: {where}: one rank sends {detail0} tokens to one node but the RDMA buffer holds {detail1} per "
            f"node for this call's token size, so that call moved no data (its outputs are undefined). Every rank "
            f"finished the call and the Buffer stays usable; construct a Buffer with a larger num_rdma_bytes "
            f"(Config.get_rdma_buffer_size_hint(hidden_bytes, num_ranks, num_tokens) sizes one pass of num_tokens per rank)."
        )
    # a combine from a handle without ep_rt's facts (a rebuilt tuple)
    if code == abi.EP_RT_ERR_CAPACITY and phase == abi.EP_RT_PHASE_IN_COMBINE_FORWARD:
        return BufferTooSmallError(
            f"{me}: {where}: this combine returns {detail0} tokens to one node{chan} but the RDMA buffer holds "
            f"{detail1} per node at this hidden size, so the tokens past that were dropped (the outputs are "
            f"incomplete; a handle rebuilt as a plain tuple skips the check that refuses such a call up front). Every "
            f"rank finished the call and the Buffer stays usable; construct a Buffer with a larger num_rdma_bytes "
            f"(Config.get_rdma_buffer_size_hint(hidden_bytes, num_ranks, num_tokens) sizes one pass of num_tokens per rank)."
        )
    # the records the forwarders push into one rank's NVL buffer
    if code == abi.EP_RT_ERR_CAPACITY and phase == abi.EP_RT_PHASE_IN_FORWARD:
        return BufferTooSmallError(
            f"{me}: {where}: one rank receives {detail0} tokens but the NVL buffers hold {detail1} of this call's "
            f"token records, so that call moved no data past that (its outputs are undefined). Every rank finished "
            f"the call and the Buffer stays usable; construct a Buffer with a larger num_nvl_bytes "
            f"(Config.get_nvl_buffer_size_hint(hidden_bytes, num_ranks, num_tokens) sizes one pass of num_tokens per rank)."
        )
    if code == abi.EP_RT_ERR_TIMEOUT and peer < 0:  # no peer: the kernel's own blocks never all met at its grid barrier
        return CommTimeoutError(
            f"rank {rank}: timed out in {where} waiting for the other blocks of its own kernel (arrival counter "
            f"{detail0}, needed {detail1}): the GPU could not run the whole grid at once, e.g. fewer SMs are "
            f"available to this process than the device has (an MPS limit). The Buffer is unusable now: destroy "
            f"it and create a new one."
        )
    if code == abi.EP_RT_ERR_TIMEOUT:
        return CommTimeoutError(
            f"rank {rank}: timed out in {where} waiting for rank {peer}{chan} (expected call #{detail0}, "
            f"saw #{detail1}). Rank {peer} did not make the same ep_rt call, or died. The Buffer is unusable "
            f"now: destroy it and create a new one (timeout: EP_RT_TIMEOUT_S or Buffer(timeout_s=...))."
        )
    if code == abi.EP_RT_ERR_CAPACITY and peer < 0:
        return KernelError(
            f"rank {rank}: {where}: {detail0} rows for one expert exceed the {detail1} slots "
            f"(num_max_dispatch_tokens_per_rank); a token lists the same expert more than once?"
        )
    if code == abi.EP_RT_ERR_CAPACITY:
        return BufferTooSmallError(
            f"rank {rank}: {where}: rank {peer} would receive {detail0} rows but its buffer holds {detail1}, so that "
            f"call's outputs are incomplete. Every rank finished the call and the Buffer stays usable; construct a "
            f"Buffer with a larger num_nvl_bytes (Config.get_nvl_buffer_size_hint(hidden_bytes, num_ranks, num_tokens) sizes one pass of num_tokens per rank)."
        )
    if code == abi.EP_RT_ERR_WORST_TOKENS:
        return KernelError(
            f"rank {rank}: {where}: {detail0} tokens arrived but num_worst_tokens={detail1}; rows past "
            f"num_worst_tokens were dropped, so that call's outputs are incomplete. Every rank finished the call and "
            f"the Buffer stays usable: repeat the call with num_worst_tokens >= {detail0}."
        )
    if code == abi.EP_RT_ERR_MISMATCH and phase in _LL_RECV_PHASES:  # LL: the digest of the shape a peer called with
        return KernelError(
            f"rank {rank}: {where}: rank {peer} called with a different shape (num_max_dispatch_tokens_per_rank, "
            f"hidden, num_experts, use_fp8 or use_logfmt differ; shape digests {detail0:#06x} and {detail1:#06x}); "
            f"every rank must pass the same. Its messages were not read. The Buffer is unusable now: destroy it "
            f"and create a new one."
        )
    if code == abi.EP_RT_ERR_MISMATCH:
        return KernelError(
            f"rank {rank}: {where}: rank {peer} called with different shapes (its hidden bytes {detail0}, "
            f"top-k {detail1}, or channel / expert counts differ); every rank must pass the same "
            f"hidden size, top-k, number of experts and config. The Buffer is unusable now: destroy it and create "
            f"a new one."
        )
    if code == abi.EP_RT_ERR_BAD_EXPERT:
        return KernelError(
            f"rank {rank}: {where}: topk_idx holds expert id {detail0}, but num_experts is {detail1}; "
            f"valid ids are -1 and 0..{detail1 - 1}. That token selection was skipped, every rank "
            f"finished the call, and the Buffer stays usable."
        )
    return KernelError(f"rank {rank}: kernel error code {code} in {where} (peer {peer}{chan}, {detail0}, {detail1})")


def error_from_record(record, ranks_per_node: int | None = None) -> EpRtError | None:
    """The exception an ErrorRecord (params.ErrorRecord in host-mapped memory) holds, or None if it is clear."""
    if record.code == abi.EP_RT_ERR_NONE:
        return None
    return describe_kernel_error(
        record.code,
        record.phase,
        record.rank,
        record.peer,
        record.channel,
        record.detail0,
        record.detail1,
        ranks_per_node,
    )
