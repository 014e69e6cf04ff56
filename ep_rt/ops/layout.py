"""get_dispatch_layout on the GPU (kernels_src/layout.cu)."""

from __future__ import annotations


import torch

from .. import env
from ..events import allocating_on
from ..runtime import abi, driver, modules
from ..runtime.call_plans import copy_struct, plan_for
from ..runtime.launch import Launcher, driver_stream
from ..transport.error_record import INPUT_SLOT

_MAX_SMEM = 200 * 1024


# The id check before a dispatch: enough blocks to read the ids at full speed, few enough to start at once.
_CHECK_BLOCKS = 32


class LayoutOp:
    """get_dispatch_layout, and the check of a dispatch's expert ids (issue 23: no device sync in a hot call). Both
    kernels report an id outside [-1, num_experts) into the Buffer's "input" error record, which no communication
    kernel watches: the call goes on (the id is treated as -1) and the host raises the error at the end of a call
    (ep_rt.buffer)."""

    error_ptr = 0  # the "input" record's device address; 0: no check (an op built with object.__new__ too)

    def __init__(self, device_index: int, num_sms: int, errors=None, rank: int = 0):
        module = modules.load_family(device_index, "layout")
        self.kernel = Launcher(module, "ep_rt_get_dispatch_layout", abi.LayoutParams)
        self.checker = Launcher(module, "ep_rt_check_topk_idx", abi.LayoutParams)
        driver.set_max_dynamic_smem(self.kernel.function, _MAX_SMEM)
        self.num_sms = num_sms
        if errors is not None:  # the record's claim word: device memory (atomics), re-armed after each report
            self.claim = torch.zeros(1, dtype=torch.int32, device=torch.device("cuda", device_index))
            errors.on_rearm(INPUT_SLOT, self.claim.zero_)
            self.error_ptr = errors.device_ptr(INPUT_SLOT)
            for k, phase in ((self.kernel, abi.EP_RT_PHASE_LAYOUT_IDS), (self.checker, abi.EP_RT_PHASE_DISPATCH_IDS)):
                k.set(error_claim=self.claim.data_ptr(), rank=rank, error_phase=phase)
            self.checker.set(error=self.error_ptr)

    def check_ids(self, topk_idx: torch.Tensor, num_experts: int, stream) -> None:
        """Launch the id check of a dispatch's topk_idx on `stream` (before the dispatch's kernels); nothing when
        EP_RT_CHECK_VALUES=0 or there is nothing to check."""
        n = topk_idx.numel()
        if n == 0 or not self.error_ptr or not env.check_values():
            return
        self.checker.set(
            topk_idx=topk_idx.data_ptr(),
            num_tokens=topk_idx.size(0),
            num_topk=topk_idx.size(1),
            num_experts=num_experts,
            topk_idx_bits=topk_idx.element_size() * 8,
        )
        self.checker(min(-(-n // self.checker.block), _CHECK_BLOCKS), stream)

    # Made on first use (an op built with object.__new__, as the CPU tests do, has it too).
    call_plans = None  # (tokens, top-k, experts, ranks, ranks per node, top-k bits) -> (params, blocks, smem, nodes)

    def _plan(self, num_tokens: int, num_topk: int, num_experts: int, num_ranks: int, G: int, bits: int):
        """The kernel's parameter struct for this shape (everything but the pointers), its grid and shared memory:
        filled once per shape (issue 23, docs/HOST_PATH.md)."""
        return plan_for(self, (num_tokens, num_topk, num_experts, num_ranks, G, bits), self._build_plan)

    def _build_plan(self, num_tokens: int, num_topk: int, num_experts: int, num_ranks: int, G: int, bits: int):
        num_nodes = num_ranks // G if num_ranks > G else 0
        smem = (num_experts + num_ranks + num_nodes) * 4
        if smem > _MAX_SMEM:
            raise ValueError(f"{num_experts} experts need {smem} bytes of shared memory; at most {_MAX_SMEM}")
        four_per_thread = 4 * self.kernel.block  # tokens a block takes before the grid grows
        blocks = min(max((num_tokens + four_per_thread - 1) // four_per_thread, 1), self.num_sms)
        p = abi.LayoutParams.from_buffer_copy(self.kernel.params)
        p.num_tokens, p.num_topk, p.num_experts, p.num_ranks = num_tokens, num_topk, num_experts, num_ranks
        p.tokens_per_block, p.topk_idx_bits, p.num_ranks_per_node = (num_tokens + blocks - 1) // blocks, bits, G
        return p, blocks, smem, num_nodes

    def __call__(
        self,
        topk_idx: torch.Tensor,
        num_experts: int,
        num_ranks: int,
        alloc_stream,
        comm_stream,
        num_ranks_per_node: int = 8,
    ):
        """num_tokens_per_rdma_rank (per node) is returned when the ranks span several nodes of
        num_ranks_per_node ranks (DeepEP: more than 8 ranks), else None. alloc_stream None: the current stream."""
        num_tokens, num_topk = topk_idx.shape
        params, blocks, smem, num_nodes = self._plan(
            num_tokens, num_topk, num_experts, num_ranks, num_ranks_per_node, topk_idx.element_size() * 8
        )
        with allocating_on(alloc_stream):
            counts = torch.empty(num_ranks + num_nodes + num_experts, dtype=torch.int32, device=topk_idx.device)
            is_token_in_rank = torch.empty(num_tokens, num_ranks, dtype=torch.bool, device=topk_idx.device)
        per_rank = counts[:num_ranks]
        per_node = counts[num_ranks : num_ranks + num_nodes] if num_nodes else None
        per_expert = counts[num_ranks + num_nodes :]
        # The kernel adds into the counts on the comm stream: zeroed there, in its order. A driver memset: torch's
        # zero_ needed a stream context (two stream switches) and a fill kernel, ~8 us of host on an H100 (cProfile).
        driver.memset_d32_async(counts.data_ptr(), 0, counts.numel(), driver_stream(comm_stream))
        if num_tokens > 0:
            p = self.kernel.params
            copy_struct(p, params)
            p.topk_idx, p.num_tokens_per_rank = topk_idx.data_ptr(), per_rank.data_ptr()
            p.num_tokens_per_rdma_rank = per_node.data_ptr() if per_node is not None else 0
            p.num_tokens_per_expert, p.is_token_in_rank = per_expert.data_ptr(), is_token_in_rank.data_ptr()
            p.error = self.error_ptr if env.check_values() else 0
            self.kernel(blocks, comm_stream, smem=smem)
        return per_rank, per_node, per_expert, is_token_in_rank, counts
