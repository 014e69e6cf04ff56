"""Intranode (NVLink) dispatch and combine (kernels_src/intranode.cu).

Dispatch = notify kernel (exchange counts, derive the prefix matrices; the host reads the receive
count from mapped memory unless num_worst_tokens is given) + dispatch kernel. Combine = one kernel.
With num_worst_tokens nothing waits on the host, so dispatch (and any combine or cached dispatch) can be
captured in a CUDA graph: the kernels number their calls on the GPU (kernels_src/include/ep_rt/sync.cuh).
The handle has DeepEP's six entries: (rank_prefix_matrix [R,R], channel_prefix_matrix [R,C],
recv_channel_prefix_matrix [R,C], recv_src_idx [rows], is_token_in_rank [N,R], send_pos [N,R]).
In ep_rt every column of rank_prefix_matrix is valid, and the last entry holds each token's
position among those sent to a rank (-1 if not sent) instead of DeepEP's ring-slot counters.
"""
from __future__ import annotations


import torch

from .. import validate
from ..errors import BufferTooSmallError
from ..handles import DispatchResult, HandleFacts, IntranodeHandle, next_serial, with_facts
from ..ht_op import DispatchCall
from ..runtime import abi, modules
from ..runtime.launch import Launcher
from ..transport import nvl_layout
from ..transport.nvl import NvlBuffer


class IntranodeOp:
    """ep_rt.ht_op.HighThroughputOp over the NVL buffer of one node (owned by the Buffer)."""

    is_internode = False

    def __init__(self, nvl: NvlBuffer):
        self.nvl = nvl
        module = modules.load_family(nvl.device_index, "intranode")
        self.notify = Launcher(module, "ep_rt_intranode_notify", abi.NotifyParams)
        self.dispatch_kernel = Launcher(module, "ep_rt_intranode_dispatch", abi.DispatchParams)
        self.combine_kernel = Launcher(module, "ep_rt_intranode_combine", abi.CombineParams)
        for k in (self.notify, self.dispatch_kernel, self.combine_kernel):
            nvl.fill_common(k.params)
        self.serial = next_serial()  # the owner its handles name
        self.timer = None  # ep_rt.testing.bench.KernelTimer while benchmarking

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
            self.check_handle_capacity(call.handle, x.size(1) * x.element_size(),
                                       x_scales.size(1) if x_scales is not None else 0, None, 0)
            recv_x, recv_scales, tensors = self.cached_dispatch(x, x_scales, call.handle, alloc_stream, comm_stream)
            return DispatchResult(recv_x, recv_scales, None, None, None, None, tensors)
        return self.dispatch(call.x, call.x_scales, call.topk_idx, call.topk_weights, call.num_tokens_per_rank,
                             call.is_token_in_rank, call.num_tokens_per_expert, call.expert_alignment,
                             call.num_worst_tokens, call.num_channels, alloc_stream, comm_stream)

    def combine_handle(self, x, handle, topk_weights):
        self.check_handle_capacity(handle, 0, 0, x.size(1), topk_weights.size(1) if topk_weights is not None else 0)
        return handle

    # ---- dispatch -------------------------------------------------------------------------------
    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                 num_tokens_per_expert, expert_alignment: int, num_worst_tokens: int, num_channels: int,
                 alloc_stream, comm_stream) -> DispatchResult:
        nvl, R, me = self.nvl, self.nvl.num_ranks, self.nvl.rank
        N, hidden = x.shape
        hidden_bytes = hidden * x.element_size()
        K = topk_idx.size(1) if topk_idx is not None else 0
        S = x_scales.size(1) if x_scales is not None else 0
        num_experts = num_tokens_per_expert.numel() if num_tokens_per_expert is not None else 0
        L = num_experts // R
        dev = x.device
        # num_worst_tokens: the host does not wait for the counts (token 0 tells notify not to publish them).
        host_token = 0 if num_worst_tokens > 0 else nvl.next_host_token()

        dispatch_rows = nvl_layout.DispatchRows(hidden_bytes, S, K)
        combine_rows = nvl_layout.CombineRows(hidden, K)
        d = self.dispatch_kernel.params
        capacity = dispatch_rows.fill(d.region, nvl.num_nvl_bytes)
        combine_capacity = combine_rows.fill(abi.CombineRegion(), nvl.num_nvl_bytes)

        with torch.cuda.stream(alloc_stream):
            rank_prefix_matrix = torch.empty(R, R, dtype=torch.int32, device=dev)
            channel_prefix_matrix = torch.empty(R, num_channels, dtype=torch.int32, device=dev)
            recv_channel_prefix_matrix = torch.empty(R, num_channels, dtype=torch.int32, device=dev)
            send_pos = torch.empty(N, R, dtype=torch.int32, device=dev)

        counters = nvl.counters
        self.notify.set(num_tokens_per_rank=num_tokens_per_rank.data_ptr(),
                        num_tokens_per_expert=num_tokens_per_expert.data_ptr() if num_experts else 0,
                        is_token_in_rank=is_token_in_rank.data_ptr(), send_pos=send_pos.data_ptr(),
                        channel_prefix_matrix=channel_prefix_matrix.data_ptr(),
                        rank_prefix_matrix=rank_prefix_matrix.data_ptr(),
                        recv_channel_prefix_matrix=recv_channel_prefix_matrix.data_ptr(),
                        host_counters=nvl.counters_dev_ptr, host_token=host_token,
                        dispatch_row_bytes=sum(dispatch_rows.widths()), combine_row_bytes=sum(combine_rows.widths()),
                        num_tokens=N, num_channels=num_channels, num_experts=num_experts,
                        expert_alignment=expert_alignment, hidden_bytes=hidden_bytes, num_topk=K)
        self._run("notify", self.notify, R, comm_stream)

        max_dispatch = max_combine = None  # over all ranks; known on the host unless num_worst_tokens
        if num_worst_tokens > 0:
            num_rows, per_expert = num_worst_tokens, []
        else:
            nvl.wait_host_counters(host_token, "dispatch notify")
            num_rows = counters[abi.EP_RT_HOST_NUM_RECV]
            max_dispatch = counters[abi.EP_RT_HOST_MAX_DISPATCH_ROWS]
            max_combine = counters[abi.EP_RT_HOST_MAX_COMBINE_ROWS]
            if max_dispatch > capacity or max_combine > combine_capacity:
                # Every rank sees the same maxima, so every rank raises here: nothing hangs.
                need = nvl_layout.nvl_bytes_for(max(hidden_bytes, 2 * hidden), max(max_dispatch, max_combine))
                raise BufferTooSmallError(
                    f"rank {me}: this dispatch needs room for {max_dispatch} received rows (and {max_combine} rows "
                    f"in its combine) but the NVL buffer ({nvl.num_nvl_bytes} bytes) holds {capacity} "
                    f"({combine_capacity}); create the Buffer with num_nvl_bytes >= {need}")
            # notify publishes them whenever num_tokens_per_expert is given (always: ht_args requires it).
            per_expert = [counters[abi.EP_RT_HOST_EXPERT_COUNTS + i] for i in range(L)]

        with torch.cuda.stream(alloc_stream):
            recv_x = torch.empty(num_rows, hidden, dtype=x.dtype, device=dev)
            recv_x_scales = torch.empty(num_rows, S, dtype=x_scales.dtype, device=dev) if S else None
            recv_topk_idx = torch.empty(num_rows, K, dtype=validate.topk_idx_t, device=dev) if K else None
            recv_topk_weights = torch.empty(num_rows, K, dtype=torch.float32, device=dev) if K else None
            recv_src_idx = torch.empty(num_rows, dtype=torch.int32, device=dev)

        self._launch_dispatch(x, x_scales, topk_idx, topk_weights, send_pos, rank_prefix_matrix,
                              recv_channel_prefix_matrix, recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights,
                              recv_src_idx, num_channels, L, num_rows, fill_unused=num_worst_tokens > 0,
                              handshake=False, stream=comm_stream)
        handle = IntranodeHandle(rank_prefix_matrix, channel_prefix_matrix, recv_channel_prefix_matrix, recv_src_idx,
                                 is_token_in_rank, send_pos)
        with_facts(handle, HandleFacts.of(handle, self.serial, max_dispatch_rows=max_dispatch,
                                          max_combine_rows=max_combine))
        tensors = [x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, num_tokens_per_expert, recv_x,
                   recv_x_scales, recv_topk_idx, recv_topk_weights, *handle]
        return DispatchResult(recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, per_expert, handle, tensors)

    def check_handle_capacity(self, handle, hidden_bytes: int, num_scales: int, combine_hidden: int | None,
                              combine_topk: int) -> None:
        """A cached dispatch (combine_hidden None) or a combine whose rows would not fit the NVL buffer, refused on
        every rank alike: the maxima in the handle's facts are the same on all ranks. Without facts (a rebuilt
        handle, or num_worst_tokens) the kernels check, report on every rank concerned, and the Buffer stays usable."""
        facts = getattr(handle, "facts", None)
        if facts is None:
            return
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
                f"{nvl_layout.nvl_bytes_for(row_bytes, rows)} (nothing was launched; the Buffer stays usable)")

    def cached_dispatch(self, x, x_scales, handle, alloc_stream, comm_stream):
        rank_prefix_matrix, _, recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_pos = handle
        hidden = x.size(1)
        S = x_scales.size(1) if x_scales is not None else 0
        num_rows = recv_src_idx.size(0)
        nvl_layout.DispatchRows(hidden * x.element_size(), S, 0).fill(self.dispatch_kernel.params.region,
                                                                          self.nvl.num_nvl_bytes)
        with torch.cuda.stream(alloc_stream):
            recv_x = torch.empty(num_rows, hidden, dtype=x.dtype, device=x.device)
            recv_x_scales = torch.empty(num_rows, S, dtype=x_scales.dtype, device=x.device) if S else None
            scratch_src_idx = torch.empty(num_rows, dtype=torch.int32, device=x.device)
        self._launch_dispatch(x, x_scales, None, None, send_pos, rank_prefix_matrix, recv_channel_prefix_matrix,
                              recv_x, recv_x_scales, None, None, scratch_src_idx, recv_channel_prefix_matrix.size(1), 0,
                              num_rows, fill_unused=False, handshake=True, stream=comm_stream)
        tensors = [x, x_scales, recv_x, recv_x_scales, scratch_src_idx, *handle]
        return recv_x, recv_x_scales, tensors

    def _launch_dispatch(self, x, x_scales, topk_idx, topk_weights, send_pos, rank_prefix_matrix,
                         recv_channel_prefix_matrix, recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights,
                         recv_src_idx, num_channels, num_local_experts, num_rows, fill_unused, handshake, stream):
        ptr = lambda t: t.data_ptr() if t is not None else 0  # noqa: E731
        self.dispatch_kernel.set(
            x=ptr(x), x_scales=ptr(x_scales), topk_idx=ptr(topk_idx), topk_weights=ptr(topk_weights),
            send_pos=ptr(send_pos), rank_prefix_matrix=ptr(rank_prefix_matrix),
            recv_channel_prefix_matrix=ptr(recv_channel_prefix_matrix), recv_x=ptr(recv_x),
            recv_x_scales=ptr(recv_x_scales), recv_topk_idx=ptr(recv_topk_idx),
            recv_topk_weights=ptr(recv_topk_weights), recv_src_idx=ptr(recv_src_idx),
            scale_token_stride=x_scales.stride(0) if x_scales is not None else 0,
            scale_hidden_stride=x_scales.stride(1) if x_scales is not None else 0,
            num_tokens=x.size(0), num_channels=num_channels, hidden_bytes=x.size(1) * x.element_size(),
            num_scales=x_scales.size(1) if x_scales is not None else 0,
            num_topk=topk_idx.size(1) if topk_idx is not None else 0, num_local_experts=num_local_experts,
            num_out_rows=num_rows, fill_unused_rows=int(fill_unused), handshake=int(handshake),
            topk_idx_bits=validate.bits(topk_idx), recv_topk_idx_bits=validate.bits(recv_topk_idx))
        self._run("dispatch", self.dispatch_kernel, num_channels, stream)

    # ---- combine --------------------------------------------------------------------------------
    def combine(self, x, handle, topk_weights, bias0, bias1, alloc_stream, comm_stream):
        rank_prefix_matrix, _, recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_pos = handle
        N, hidden = is_token_in_rank.size(0), x.size(1)
        K = topk_weights.size(1) if topk_weights is not None else 0
        c = self.combine_kernel.params
        nvl_layout.CombineRows(hidden, K).fill(c.region, self.nvl.num_nvl_bytes)
        with torch.cuda.stream(alloc_stream):
            combined_x = torch.empty(N, hidden, dtype=torch.bfloat16, device=x.device)
            combined_w = torch.empty(N, K, dtype=torch.float32, device=x.device) if K else None
        ptr = lambda t: t.data_ptr() if t is not None else 0  # noqa: E731
        num_channels = recv_channel_prefix_matrix.size(1)
        self.combine_kernel.set(
            x=ptr(x), topk_weights=ptr(topk_weights), bias0=ptr(bias0), bias1=ptr(bias1), send_pos=ptr(send_pos),
            rank_prefix_matrix=ptr(rank_prefix_matrix), recv_channel_prefix_matrix=ptr(recv_channel_prefix_matrix),
            combined_x=ptr(combined_x), combined_topk_weights=ptr(combined_w), num_tokens=N,
            num_channels=num_channels, hidden=hidden, num_topk=K, num_in_rows=x.size(0))
        self._run("combine", self.combine_kernel, num_channels, comm_stream)
        tensors = [x, topk_weights, bias0, bias1, combined_x, combined_w, *handle]
        return combined_x, combined_w, tensors
