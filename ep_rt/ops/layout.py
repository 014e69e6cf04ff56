"""get_dispatch_layout on the GPU (kernels_src/layout.cu)."""
from __future__ import annotations

import torch

from ..runtime import abi, driver, modules
from ..runtime.launch import Launcher

_MAX_SMEM = 200 * 1024


class LayoutOp:
    def __init__(self, device_index: int, num_sms: int):
        module = modules.load_family(device_index, "layout")
        self.kernel = Launcher(module, "ep_rt_get_dispatch_layout", abi.LayoutParams)
        driver.set_max_dynamic_smem(self.kernel.function, _MAX_SMEM)
        self.num_sms = num_sms

    def __call__(self, topk_idx: torch.Tensor, num_experts: int, num_ranks: int, alloc_stream, comm_stream,
                 num_ranks_per_node: int = 8):
        """num_tokens_per_rdma_rank (per node) is returned when the ranks span several nodes of
        num_ranks_per_node ranks (DeepEP: more than 8 ranks), else None."""
        num_tokens, num_topk = topk_idx.shape
        G = num_ranks_per_node
        num_nodes = num_ranks // G if num_ranks > G else 0
        smem = (num_experts + num_ranks + num_nodes) * 4
        if smem > _MAX_SMEM:
            raise ValueError(f"{num_experts} experts need {smem} bytes of shared memory; at most {_MAX_SMEM}")
        with torch.cuda.stream(alloc_stream):
            counts = torch.empty(num_ranks + num_nodes + num_experts, dtype=torch.int32, device=topk_idx.device)
            is_token_in_rank = torch.empty(num_tokens, num_ranks, dtype=torch.bool, device=topk_idx.device)
        per_rank = counts[:num_ranks]
        per_node = counts[num_ranks:num_ranks + num_nodes] if num_nodes else None
        per_expert = counts[num_ranks + num_nodes:]
        with torch.cuda.stream(comm_stream):
            counts.zero_()
        if num_tokens > 0:
            four_per_thread = 4 * self.kernel.block  # tokens a block takes before the grid grows
            blocks = min(max((num_tokens + four_per_thread - 1) // four_per_thread, 1), self.num_sms)
            per_block = (num_tokens + blocks - 1) // blocks
            self.kernel.set(topk_idx=topk_idx.data_ptr(), num_tokens_per_rank=per_rank.data_ptr(),
                            num_tokens_per_rdma_rank=per_node.data_ptr() if per_node is not None else 0,
                            num_tokens_per_expert=per_expert.data_ptr(),
                            is_token_in_rank=is_token_in_rank.data_ptr(), num_tokens=num_tokens, num_topk=num_topk,
                            num_experts=num_experts, num_ranks=num_ranks, tokens_per_block=per_block,
                            topk_idx_bits=topk_idx.element_size() * 8, num_ranks_per_node=G)
            self.kernel(blocks, comm_stream, smem=smem)
        return per_rank, per_node, per_expert, is_token_in_rank, counts
