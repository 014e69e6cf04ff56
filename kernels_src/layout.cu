// get_dispatch_layout: per-rank, per-node and per-expert token counts and the token-to-rank table.
// Each block histograms its slice of tokens in shared memory, then adds into the (zeroed) outputs.
#include "ep_rt/params.h"
#include "ep_rt/sync.cuh"
#include "ep_rt/topk.cuh"

using ep_rt::TopkIdx;

namespace {

__device__ __forceinline__ bool seen_before(const TopkIdx& topk, int64_t row, int k, int64_t group, int64_t group_size,
                                            int64_t num_experts) {
    for (int j = 0; j < k; ++j) {
        int64_t e = topk[row + j];
        if (e >= 0 && e < num_experts && e / group_size == group) return true;
    }
    return false;
}

// An expert id outside [-1, num_experts): recorded for the host (first one wins), then treated as -1. The record is
// the Buffer's "input" one, which no communication kernel watches, so a call with a bad id still completes on every
// rank; the host raises it at the end of a call (issue 23: no device sync to check the ids).
__device__ __forceinline__ void check_id(const LayoutParams& p, int64_t e) {
    if (p.error != 0 && (e < -1 || e >= p.num_experts)) {
        const ep_rt::ErrorSink sink{p.error, reinterpret_cast<int32_t*>(p.error_claim), p.rank};
        ep_rt::report_error(sink, EP_RT_ERR_BAD_EXPERT, p.error_phase, -1, -1, e, p.num_experts);
    }
}

}  // namespace

// The check alone, before a dispatch's notify: a grid-stride pass over the ids.
extern "C" __global__ void __launch_bounds__(256) ep_rt_check_topk_idx(const LayoutParams p) {
    const TopkIdx topk(p.topk_idx, p.topk_idx_bits);
    const int64_t n = int64_t(p.num_tokens) * p.num_topk;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        check_id(p, topk[i]);
}

extern "C" __global__ void __launch_bounds__(256) ep_rt_get_dispatch_layout(const LayoutParams p) {
    extern __shared__ int counters[];  // [num_experts] | [num_ranks] | [num_ranks / G]
    const int G = p.num_ranks_per_node > 0 ? p.num_ranks_per_node : 8;
    const int num_nodes = p.num_tokens_per_rdma_rank ? p.num_ranks / G : 0;
    const int num_counters = p.num_experts + p.num_ranks + num_nodes;
    int* expert_count = counters;
    int* rank_count = counters + p.num_experts;
    int* node_count = rank_count + p.num_ranks;
    for (int i = threadIdx.x; i < num_counters; i += blockDim.x) counters[i] = 0;
    __syncthreads();

    const TopkIdx topk(p.topk_idx, p.topk_idx_bits);
    bool* in_rank = reinterpret_cast<bool*>(p.is_token_in_rank);
    const int64_t experts_per_rank = p.num_experts / p.num_ranks;
    const int64_t experts_per_node = experts_per_rank * G;
    const int begin = blockIdx.x * p.tokens_per_block;
    const int end = min(begin + p.tokens_per_block, p.num_tokens);
    for (int t = begin + threadIdx.x; t < end; t += blockDim.x) {
        const int64_t row = int64_t(t) * p.num_topk;
        bool* flags = in_rank + int64_t(t) * p.num_ranks;
        for (int r = 0; r < p.num_ranks; ++r) flags[r] = false;
        for (int k = 0; k < p.num_topk; ++k) {
            const int64_t e = topk[row + k];
            check_id(p, e);
            if (e < 0 || e >= p.num_experts) continue;  // -1 = no expert; out of range: reported, then skipped
            atomicAdd(&expert_count[e], 1);
            const int64_t r = e / experts_per_rank;
            if (!seen_before(topk, row, k, r, experts_per_rank, p.num_experts)) {
                flags[r] = true;
                atomicAdd(&rank_count[r], 1);
            }
            if (num_nodes > 0) {
                const int64_t n = e / experts_per_node;
                if (!seen_before(topk, row, k, n, experts_per_node, p.num_experts)) atomicAdd(&node_count[n], 1);
            }
        }
    }
    __syncthreads();

    int* out_expert = reinterpret_cast<int*>(p.num_tokens_per_expert);
    int* out_rank = reinterpret_cast<int*>(p.num_tokens_per_rank);
    int* out_node = reinterpret_cast<int*>(p.num_tokens_per_rdma_rank);
    for (int i = threadIdx.x; i < p.num_experts; i += blockDim.x)
        if (expert_count[i]) atomicAdd(&out_expert[i], expert_count[i]);
    for (int i = threadIdx.x; i < p.num_ranks; i += blockDim.x)
        if (rank_count[i]) atomicAdd(&out_rank[i], rank_count[i]);
    for (int i = threadIdx.x; i < num_nodes; i += blockDim.x)
        if (node_count[i]) atomicAdd(&out_node[i], node_count[i]);
}
