"""Intranode (NVLink) dispatch and combine (kernels_src/intranode.cu).

Dispatch = notify kernel (exchange counts, derive the prefix matrices; the host reads the receive
count from mapped memory unless num_worst_tokens is given) + dispatch kernel. Combine = one kernel.
With num_worst_tokens nothing waits on the host, so dispatch (and any combine or cached dispatch) can be
captured in a CUDA graph: the kernels number their calls on the GPU (kernels_src/include/ep_rt/sync.cuh).
The handle has DeepEP's six entries: (rank_prefix_matrix [R,R], channel_prefix_matrix [R,C],
recv_channel_prefix_matrix [R,C], recv_src_idx [rows], is_token_in_rank [N,R], send_pos [N,R]).
In ep_rt every column of rank_prefix_matrix is valid, and the last entry holds each token's
position among those sent to a rank (-1 if not sent) instead of DeepEP's ring-slot counters.

A call whose rows do not fit the NVL buffer runs in rounds (issue 22; nvl_layout.Rounds): after the whole call's
notify, round k is a notify and a dispatch of every rank's tokens [k*T, (k+1)*T), each row written to its row in the
whole call's output, so the outputs and the handle are those of one pass; the handle also carries the rounds
(`rounds`), which its combine and cached dispatch go through the same way.
"""

from __future__ import annotations

import torch

from .. import validate
from ..errors import BufferTooSmallError
from ..events import allocating_on
from ..handles import DispatchResult, HandleFacts, IntranodeHandle, IntranodeRounds, next_serial, with_facts
from ..ht_op import DispatchCall
from ..runtime import abi, modules
from ..runtime.call_plans import copy_struct as _copy, plan_for
from ..runtime.launch import Launcher
from ..transport import nvl_layout
from ..transport.nvl import NvlBuffer


def _ptr(t) -> int:
    return t.data_ptr() if t is not None else 0


def _row_ptr(t, row: int) -> int:
    """Address of row `row` of t (0 for an absent tensor): a round's first token."""
    return t.data_ptr() + row * t.stride(0) * t.element_size() if t is not None else 0


class _DispatchPlan:
    """One dispatch shape's parameter structs, filled once (issue 23, docs/HOST_PATH.md): the notify and dispatch
    kernels' fields that depend only on (hidden bytes, hidden, scales, top-k, experts, channels, alignment,
    num_worst_tokens or not), with the NVL layout of the call and the row capacities of it and of its combine. A
    call copies them into the launchers' structs and patches its tensors' pointers and token counts."""

    __slots__ = ("notify", "dispatch", "capacity", "combine_capacity")


class _CombinePlan:
    """One combine shape's (hidden, top-k, channels) parameter struct, filled once."""

    __slots__ = ("combine", "capacity")


class IntranodeOp:
    """ep_rt.ht_op.HighThroughputOp over the NVL buffer of one node (owned by the Buffer)."""

    is_internode = False

    def __init__(self, nvl: NvlBuffer):
        self.nvl = nvl
        module = modules.load_family(nvl.device_index, "intranode")
        self.notify = Launcher(module, "ep_rt_intranode_notify", abi.NotifyParams)
        # A build whose kernels stage rows in per-warp shared memory asks for it per kernel
        # (requested_dynamic_smem: `<kernel>_dynamic_smem` in the module; 0 where the module declares none). The
        # shipped sm_90 tma cubins declare it for the combine's bulk loads (192 KiB;
        # docs/experiments/applied/ht_tma_combine.patch); every variant is asked, so a build that moves those loads
        # into another variant needs no change here.
        smem_of = modules.requested_dynamic_smem
        self.dispatch_kernel = Launcher(
            module, "ep_rt_intranode_dispatch", abi.DispatchParams, smem=smem_of(module, "ep_rt_intranode_dispatch")
        )
        self.combine_kernel = Launcher(
            module, "ep_rt_intranode_combine", abi.CombineParams, smem=smem_of(module, "ep_rt_intranode_combine")
        )
        for k in (self.notify, self.dispatch_kernel, self.combine_kernel):
            nvl.fill_common(k.params)
        self.serial = next_serial()  # the owner its handles name
        self.timer = None  # ep_rt.testing.bench.KernelTimer while benchmarking

    # Made on first use (an op built with object.__new__, as the CPU tests do, has them too).
    call_plans = None  # (kind, shape...) -> _DispatchPlan / _CombinePlan
    _capacities = None  # check_handle_capacity's (hidden bytes, scales, combine hidden, top-k) -> rows

    def _plan_for(self, key):
        return plan_for(self, key, self._dispatch_plan if key[0] != "combine" else self._combine_plan)

    def _dispatch_plan(
        self, kind, hidden_bytes, hidden, S, K, num_experts, num_channels, expert_alignment, worst
    ) -> _DispatchPlan:
        """kind "dispatch" (after a notify) or "cached" (from a handle: K and num_experts 0, alignment 1)."""
        nvl = self.nvl
        plan = _DispatchPlan()
        d = plan.dispatch = abi.DispatchParams.from_buffer_copy(self.dispatch_kernel.params)  # its fixed fields
        dispatch_rows = nvl_layout.DispatchRows(hidden_bytes, S, K)
        plan.capacity = dispatch_rows.fill(d.region, nvl.num_nvl_bytes)
        d.num_channels, d.hidden_bytes, d.num_scales, d.num_topk = num_channels, hidden_bytes, S, K
        d.num_local_experts = num_experts // nvl.num_ranks
        d.fill_unused_rows, d.handshake = int(worst), int(kind == "cached")
        d.round_rpm = d.full_rpm = d.round = d.token_offset = 0  # one pass (a call in rounds patches these)
        d.recv_topk_idx_bits = (
            validate.bits(None) if kind == "cached" or not K else torch.iinfo(validate.topk_idx_t).bits
        )
        if kind == "cached":
            d.topk_idx = d.topk_weights = d.recv_topk_idx = d.recv_topk_weights = 0
            d.topk_idx_bits = validate.bits(None)
            plan.notify, plan.combine_capacity = None, None
            return plan
        combine_rows = nvl_layout.CombineRows(hidden, K)
        plan.combine_capacity = combine_rows.fill(abi.CombineRegion(), nvl.num_nvl_bytes)
        n = plan.notify = abi.NotifyParams.from_buffer_copy(self.notify.params)
        n.host_counters = nvl.counters_dev_ptr
        n.dispatch_row_bytes, n.combine_row_bytes = sum(dispatch_rows.widths()), sum(combine_rows.widths())
        n.num_channels, n.num_experts, n.expert_alignment = num_channels, num_experts, expert_alignment
        n.hidden_bytes, n.num_topk = hidden_bytes, K
        return plan

    def _combine_plan(self, kind, hidden, K, num_channels) -> _CombinePlan:
        plan = _CombinePlan()
        c = plan.combine = abi.CombineParams.from_buffer_copy(self.combine_kernel.params)
        plan.capacity = nvl_layout.CombineRows(hidden, K).fill(c.region, self.nvl.num_nvl_bytes)
        c.num_channels, c.hidden, c.num_topk = num_channels, hidden, K
        c.round_rpm = c.full_rpm = c.round = 0
        return plan

    def raise_if_failed(self) -> None:
        self.nvl.raise_if_failed()

    def _run(self, name: str, kernel: Launcher, grid: int, stream) -> None:
        if self.timer is None:
            kernel(grid, stream)
        else:
            self.timer.around(name, stream, lambda: kernel(grid, stream))

    # ---- ep_rt.ht_op.HighThroughputOp ------------------------------------------------------------
    def check_dispatch(self, call: DispatchCall) -> None:
        """Nothing of its own: on one node num_tokens_per_rdma_rank is not read (DeepEP passes None here)."""

    def run_dispatch(self, call: DispatchCall, alloc_stream, comm_stream) -> DispatchResult:
        if call.handle is not None:
            x, x_scales = call.x, call.x_scales
            self.check_handle_capacity(
                call.handle, x.size(1) * x.element_size(), x_scales.size(1) if x_scales is not None else 0, None, 0
            )
            recv_x, recv_scales, tensors = self.cached_dispatch(x, x_scales, call.handle, alloc_stream, comm_stream)
            return DispatchResult(recv_x, recv_scales, None, None, None, None, tensors)
        return self.dispatch(
            call.x,
            call.x_scales,
            call.topk_idx,
            call.topk_weights,
            call.num_tokens_per_rank,
            call.is_token_in_rank,
            call.num_tokens_per_expert,
            call.expert_alignment,
            call.num_worst_tokens,
            call.num_channels,
            alloc_stream,
            comm_stream,
        )

    def combine_handle(self, x, handle, topk_weights):
        self.check_handle_capacity(handle, 0, 0, x.size(1), topk_weights.size(1) if topk_weights is not None else 0)
        return handle

    # ---- dispatch -------------------------------------------------------------------------------
    def dispatch(
        self,
        x,
        x_scales,
        topk_idx,
        topk_weights,
        num_tokens_per_rank,
        is_token_in_rank,
        num_tokens_per_expert,
        expert_alignment: int,
        num_worst_tokens: int,
        num_channels: int,
        alloc_stream,
        comm_stream,
    ) -> DispatchResult:
        """alloc_stream None: allocate on the current stream (no stream context)."""
        nvl, R, me = self.nvl, self.nvl.num_ranks, self.nvl.rank
        N, hidden = x.shape
        hidden_bytes = hidden * x.element_size()
        K = topk_idx.size(1) if topk_idx is not None else 0
        S = x_scales.size(1) if x_scales is not None else 0
        num_experts = num_tokens_per_expert.numel() if num_tokens_per_expert is not None else 0
        L = num_experts // R
        dev = x.device
        worst = num_worst_tokens > 0
        plan = self._plan_for(
            ("dispatch", hidden_bytes, hidden, S, K, num_experts, num_channels, expert_alignment, worst)
        )
        # num_worst_tokens: the host does not wait for the counts (token 0 tells notify not to publish them), unless
        # the buffer may be too small for one pass: then the counts decide whether the call runs in rounds. Inside a
        # CUDA-graph capture it cannot wait: one pass, and the kernels report a call that does not fit.
        wait = not worst or (num_worst_tokens > plan.capacity and not torch.cuda.is_current_stream_capturing())
        host_token = nvl.next_host_token() if wait else 0

        with allocating_on(alloc_stream):
            rank_prefix_matrix = torch.empty(R, R, dtype=torch.int32, device=dev)
            channel_prefix_matrix = torch.empty(R, num_channels, dtype=torch.int32, device=dev)
            recv_channel_prefix_matrix = torch.empty(R, num_channels, dtype=torch.int32, device=dev)
            send_pos = torch.empty(N, R, dtype=torch.int32, device=dev)

        n = self.notify.params
        _copy(n, plan.notify)
        n.num_tokens_per_rank = num_tokens_per_rank.data_ptr()
        n.num_tokens_per_expert = num_tokens_per_expert.data_ptr() if num_experts else 0
        n.is_token_in_rank, n.send_pos = is_token_in_rank.data_ptr(), send_pos.data_ptr()
        n.channel_prefix_matrix = channel_prefix_matrix.data_ptr()
        n.rank_prefix_matrix = rank_prefix_matrix.data_ptr()
        n.recv_channel_prefix_matrix = recv_channel_prefix_matrix.data_ptr()
        n.host_token, n.num_tokens = host_token, N
        self._run("notify", self.notify, R, comm_stream)

        # Before the host wait, everything of the dispatch kernel that does not depend on the counts: after it only
        # the outputs are allocated and their pointers written (the GPU is idle from the counts to the launch).
        d = self.dispatch_kernel.params
        _copy(d, plan.dispatch)
        d.x, d.x_scales, d.topk_idx, d.topk_weights = x.data_ptr(), _ptr(x_scales), _ptr(topk_idx), _ptr(topk_weights)
        d.send_pos, d.rank_prefix_matrix = send_pos.data_ptr(), rank_prefix_matrix.data_ptr()
        d.recv_channel_prefix_matrix = recv_channel_prefix_matrix.data_ptr()
        if S:
            d.scale_token_stride, d.scale_hidden_stride = x_scales.stride(0), x_scales.stride(1)
        else:
            d.scale_token_stride = d.scale_hidden_stride = 0
        d.num_tokens, d.topk_idx_bits = N, validate.bits(topk_idx)

        max_dispatch = max_combine = None  # over all ranks; known on the host unless num_worst_tokens
        rounds, num_recv = None, None
        counters = nvl.counters
        num_rows = num_worst_tokens
        if wait:
            nvl.wait_host_counters(host_token, "dispatch notify")
            num_recv = counters[abi.EP_RT_HOST_NUM_RECV]
            num_rows = num_rows if worst else num_recv
            max_dispatch = counters[abi.EP_RT_HOST_MAX_DISPATCH_ROWS]
            max_combine = counters[abi.EP_RT_HOST_MAX_COMBINE_ROWS]
            if max_dispatch > plan.capacity or max_combine > plan.combine_capacity:
                # Every rank sees the same maxima and token counts, so every rank takes the same rounds (or raises).
                rounds = self._rounds(plan, counters[abi.EP_RT_HOST_MAX_TOKENS], hidden_bytes, hidden)
            # A num_worst_tokens below what arrives: the rounds run into room for all of it (the peers go on in
            # step) and the call raises at its end; in one pass the kernel reports it.
            if rounds is not None and num_recv > num_rows:
                num_rows = num_recv

        with allocating_on(alloc_stream):
            recv_x = torch.empty(num_rows, hidden, dtype=x.dtype, device=dev)
            recv_x_scales = torch.empty(num_rows, S, dtype=x_scales.dtype, device=dev) if S else None
            recv_topk_idx = torch.empty(num_rows, K, dtype=validate.topk_idx_t, device=dev) if K else None
            recv_topk_weights = torch.empty(num_rows, K, dtype=torch.float32, device=dev) if K else None
            recv_src_idx = torch.empty(num_rows, dtype=torch.int32, device=dev)
        d.recv_x, d.recv_x_scales, d.recv_src_idx = recv_x.data_ptr(), _ptr(recv_x_scales), recv_src_idx.data_ptr()
        d.recv_topk_idx, d.recv_topk_weights = _ptr(recv_topk_idx), _ptr(recv_topk_weights)
        d.num_out_rows = num_rows
        if rounds is None:
            self._run("dispatch", self.dispatch_kernel, num_channels, comm_stream)
            round_state = None
        else:
            round_state = self._dispatch_in_rounds(
                rounds,
                x,
                x_scales,
                topk_idx,
                topk_weights,
                is_token_in_rank,
                rank_prefix_matrix,
                plan,
                alloc_stream,
                comm_stream,
            )
            if worst and K and num_recv < num_rows:  # rows past the real count carry no expert
                with torch.cuda.stream(comm_stream):
                    recv_topk_idx[num_recv:] = -1

        # Read after the launch (only notify writes the host counters; this call's is done): the GPU is busy already.
        # notify publishes them whenever num_tokens_per_expert is given (always: ht_args requires it).
        base = abi.EP_RT_HOST_EXPERT_COUNTS
        per_expert = [] if worst else counters[base : base + L]
        handle = IntranodeHandle(
            rank_prefix_matrix,
            channel_prefix_matrix,
            recv_channel_prefix_matrix,
            recv_src_idx,
            is_token_in_rank,
            send_pos,
        )
        with_facts(
            handle, HandleFacts.of(handle, self.serial, max_dispatch_rows=max_dispatch, max_combine_rows=max_combine)
        )
        handle.rounds = round_state
        if rounds is not None and worst and num_recv > num_worst_tokens:
            raise ValueError(
                f"rank {me}: num_worst_tokens={num_worst_tokens} but this rank receives {num_recv} tokens; pass "
                f"num_worst_tokens >= {num_recv} (the peers' calls completed)"
            )
        tensors = [
            x,
            x_scales,
            topk_idx,
            topk_weights,
            num_tokens_per_rank,
            num_tokens_per_expert,
            recv_x,
            recv_x_scales,
            recv_topk_idx,
            recv_topk_weights,
            *handle,
            *(round_state.tensors() if round_state is not None else ()),
        ]
        return DispatchResult(recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, per_expert, handle, tensors)

    # ---- a call in rounds (larger than the NVL buffer) ------------------------------------------------
    def _rounds(self, plan: _DispatchPlan, max_tokens: int, hidden_bytes: int, hidden: int) -> nvl_layout.Rounds:
        nvl = self.nvl
        rounds = nvl_layout.rounds_for(plan.capacity, plan.combine_capacity, nvl.num_ranks, max_tokens)
        if rounds is None:  # the same capacities on every rank: every rank raises here
            need = nvl_layout.nvl_bytes_for(max(hidden_bytes, 2 * hidden), nvl.num_ranks)
            raise BufferTooSmallError(
                f"rank {nvl.rank}: the NVL buffer ({nvl.num_nvl_bytes} bytes) holds {plan.capacity} rows "
                f"({plan.combine_capacity} in combine), less than one round of {nvl.num_ranks} rows (a token from "
                f"each rank); create the Buffer with num_nvl_bytes >= {need}"
            )
        return rounds

    def _dispatch_in_rounds(
        self, rounds, x, x_scales, topk_idx, topk_weights, is_token_in_rank, full_rpm, plan, alloc_stream, comm_stream
    ) -> IntranodeRounds:
        """The rounds of a dispatch whose whole-call notify ran: per round a notify of the round's tokens (its own
        prefix matrices and send positions) and the dispatch kernel writing rows to their rows in the outputs."""
        nvl, R, N = self.nvl, self.nvl.num_ranks, x.size(0)
        n, T, C = rounds.num_rounds, rounds.tokens_per_round, plan.dispatch.num_channels
        dev = x.device
        with allocating_on(alloc_stream):
            rpm = torch.empty(n, R, R, dtype=torch.int32, device=dev)
            cpm = torch.empty(n, R, C, dtype=torch.int32, device=dev)
            rcpm = torch.empty(n, R, C, dtype=torch.int32, device=dev)
            send_pos = torch.empty(N, R, dtype=torch.int32, device=dev)
        with torch.cuda.stream(comm_stream):  # each round's num_tokens_per_rank, on the GPU
            padded = torch.zeros(n * T, R, dtype=torch.int32, device=dev)
            padded[:N] = is_token_in_rank
            per_rank = padded.view(n, T, R).sum(1, dtype=torch.int32)
        # Round 0's notify rewrites the notify slots: every peer must have read the whole call's first.
        nvl.barrier(comm_stream, synchronize=False)
        state = IntranodeRounds(T, n, rpm, rcpm, send_pos)
        note = self.notify.params
        note.host_token = 0
        d = self.dispatch_kernel.params
        d.round_rpm, d.full_rpm, d.fill_unused_rows = rpm.data_ptr(), full_rpm.data_ptr(), 0
        for k in range(n):
            t0, t1 = rounds.token_range(k, N)
            note.num_tokens, note.num_tokens_per_rank = t1 - t0, per_rank[k].data_ptr()
            note.is_token_in_rank, note.send_pos = _row_ptr(is_token_in_rank, t0), _row_ptr(send_pos, t0)
            note.channel_prefix_matrix, note.rank_prefix_matrix = cpm[k].data_ptr(), rpm[k].data_ptr()
            note.recv_channel_prefix_matrix = rcpm[k].data_ptr()
            self._run("notify", self.notify, R, comm_stream)
            self._point_round(d, state, k, t0, t1, x, x_scales, topk_idx, topk_weights)
            self._run("dispatch", self.dispatch_kernel, C, comm_stream)
        return state

    @staticmethod
    def _point_round(d, state: IntranodeRounds, k, t0, t1, x, x_scales, topk_idx, topk_weights) -> None:
        """Dispatch params at round k's tokens [t0, t1) and prefix matrices (the outputs stay the whole call's)."""
        d.x, d.x_scales = _row_ptr(x, t0), _row_ptr(x_scales, t0)
        d.topk_idx, d.topk_weights = _row_ptr(topk_idx, t0), _row_ptr(topk_weights, t0)
        d.send_pos = _row_ptr(state.send_pos, t0)
        d.rank_prefix_matrix = state.rank_prefix_matrix[k].data_ptr()
        d.recv_channel_prefix_matrix = state.recv_channel_prefix_matrix[k].data_ptr()
        d.round, d.token_offset, d.num_tokens = k, t0, t1 - t0

    def check_handle_capacity(
        self, handle, hidden_bytes: int, num_scales: int, combine_hidden: int | None, combine_topk: int
    ) -> None:
        """A cached dispatch (combine_hidden None) or a combine whose rows would not fit the NVL buffer, refused on
        every rank alike: the maxima in the handle's facts are the same on all ranks. Without facts (a rebuilt
        handle, or num_worst_tokens) the kernels check, report on every rank concerned, and the Buffer stays usable."""
        facts = getattr(handle, "facts", None)
        if facts is None:
            return
        rounds = getattr(handle, "rounds", None)
        if rounds is not None:  # a round brings at most R * tokens_per_round rows to any rank
            facts = HandleFacts(facts.owner, facts.tensor_ptrs, *(2 * (self.nvl.num_ranks * rounds.tokens_per_round,)))
        nbytes = self.nvl.num_nvl_bytes
        if combine_hidden is None:
            rows, what = facts.max_dispatch_rows, "cached dispatch"
            capacity = nvl_layout.DispatchRows(hidden_bytes, num_scales, 0).fill(abi.DispatchRegion(), nbytes)
            row_bytes = hidden_bytes + 4 * num_scales
        else:
            rows, what = facts.max_combine_rows, "combine"
            capacity = nvl_layout.CombineRows(combine_hidden, combine_topk).fill(abi.CombineRegion(), nbytes)
            row_bytes = 2 * combine_hidden + 4 * combine_topk
        if rows is not None and rows > capacity:
            raise BufferTooSmallError(
                f"rank {self.nvl.rank}: this {what} needs room for {rows} rows on some rank but the NVL buffer "
                f"({nbytes} bytes) holds {capacity}; create the Buffer with num_nvl_bytes >= "
                f"{nvl_layout.nvl_bytes_for(row_bytes, rows)} (nothing was launched; the Buffer stays usable)"
            )

    def cached_dispatch(self, x, x_scales, handle, alloc_stream, comm_stream):
        rank_prefix_matrix, _, recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_pos = handle
        N, hidden = x.shape
        hidden_bytes = hidden * x.element_size()
        S = x_scales.size(1) if x_scales is not None else 0
        num_rows = recv_src_idx.size(0)
        num_channels = recv_channel_prefix_matrix.size(1)
        plan = self._plan_for(("cached", hidden_bytes, hidden, S, 0, 0, num_channels, 1, False))
        with allocating_on(alloc_stream):
            recv_x = torch.empty(num_rows, hidden, dtype=x.dtype, device=x.device)
            recv_x_scales = torch.empty(num_rows, S, dtype=x_scales.dtype, device=x.device) if S else None
            # The kernel writes each row's source index; a cached call returns none, but the kernel needs the room.
            scratch_src_idx = torch.empty(num_rows, dtype=torch.int32, device=x.device)
        d = self.dispatch_kernel.params
        _copy(d, plan.dispatch)
        d.x, d.x_scales, d.send_pos = x.data_ptr(), _ptr(x_scales), send_pos.data_ptr()
        d.rank_prefix_matrix = rank_prefix_matrix.data_ptr()
        d.recv_channel_prefix_matrix = recv_channel_prefix_matrix.data_ptr()
        d.recv_x, d.recv_x_scales, d.recv_src_idx = recv_x.data_ptr(), _ptr(recv_x_scales), scratch_src_idx.data_ptr()
        if S:
            d.scale_token_stride, d.scale_hidden_stride = x_scales.stride(0), x_scales.stride(1)
        else:
            d.scale_token_stride = d.scale_hidden_stride = 0
        d.num_tokens, d.num_out_rows = N, num_rows
        rounds = getattr(handle, "rounds", None)
        if rounds is None:
            self._run("dispatch", self.dispatch_kernel, num_channels, comm_stream)
        else:  # the dispatch's rounds again; its handshake keeps each round's rows out of a peer still reading
            d.round_rpm, d.full_rpm = rounds.rank_prefix_matrix.data_ptr(), rank_prefix_matrix.data_ptr()
            split = nvl_layout.Rounds(rounds.tokens_per_round, rounds.num_rounds)
            for k in range(rounds.num_rounds):
                t0, t1 = split.token_range(k, N)
                self._point_round(d, rounds, k, t0, t1, x, x_scales, None, None)
                self._run("dispatch", self.dispatch_kernel, num_channels, comm_stream)
        tensors = [x, x_scales, recv_x, recv_x_scales, scratch_src_idx, *handle]
        return recv_x, recv_x_scales, tensors

    # ---- combine --------------------------------------------------------------------------------
    def combine(self, x, handle, topk_weights, bias0, bias1, alloc_stream, comm_stream):
        rank_prefix_matrix, _, recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_pos = handle
        N, hidden = is_token_in_rank.size(0), x.size(1)
        K = topk_weights.size(1) if topk_weights is not None else 0
        num_channels = recv_channel_prefix_matrix.size(1)
        plan = self._plan_for(("combine", hidden, K, num_channels))
        with allocating_on(alloc_stream):
            combined_x = torch.empty(N, hidden, dtype=torch.bfloat16, device=x.device)
            combined_w = torch.empty(N, K, dtype=torch.float32, device=x.device) if K else None
        c = self.combine_kernel.params
        _copy(c, plan.combine)
        c.x, c.topk_weights, c.bias0, c.bias1 = x.data_ptr(), _ptr(topk_weights), _ptr(bias0), _ptr(bias1)
        c.send_pos, c.rank_prefix_matrix = send_pos.data_ptr(), rank_prefix_matrix.data_ptr()
        c.recv_channel_prefix_matrix = recv_channel_prefix_matrix.data_ptr()
        c.combined_x, c.combined_topk_weights = combined_x.data_ptr(), _ptr(combined_w)
        c.num_tokens, c.num_in_rows = N, x.size(0)
        rounds = getattr(handle, "rounds", None)
        if rounds is None:
            self._run("combine", self.combine_kernel, num_channels, comm_stream)
        else:  # the dispatch's rounds, each reducing its tokens into their rows of the outputs
            c.round_rpm, c.full_rpm = rounds.rank_prefix_matrix.data_ptr(), rank_prefix_matrix.data_ptr()
            split = nvl_layout.Rounds(rounds.tokens_per_round, rounds.num_rounds)
            for k in range(rounds.num_rounds):
                t0, t1 = split.token_range(k, N)
                c.send_pos = _row_ptr(rounds.send_pos, t0)
                c.rank_prefix_matrix = rounds.rank_prefix_matrix[k].data_ptr()
                c.recv_channel_prefix_matrix = rounds.recv_channel_prefix_matrix[k].data_ptr()
                c.combined_x, c.combined_topk_weights = _row_ptr(combined_x, t0), _row_ptr(combined_w, t0)
                c.bias0, c.bias1 = _row_ptr(bias0, t0), _row_ptr(bias1, t0)
                c.num_tokens, c.round = t1 - t0, k
                self._run("combine", self.combine_kernel, num_channels, comm_stream)
        tensors = [x, topk_weights, bias0, bias1, combined_x, combined_w, *handle]
        return combined_x, combined_w, tensors
