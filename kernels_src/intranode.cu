// ep_rt-build: variants=safe,aggressive,tma
//
// Intranode (NVLink) high-throughput dispatch and combine.
//
// Design: once every rank knows the full token-count matrix (notify), every token's final row on
// every receiver is known. Senders therefore write rows straight to their final index in the
// receiver's buffer (no ring, no flow control, no waiting while sending), rows for themselves go
// straight into the output tensors, and a receiver only copies each (source, channel) block out
// once that block's done-flag arrives. Flags carry the call's sequence number, so nothing is reset;
// the numbers live in device memory (sync.cuh), so every kernel here can be captured in a CUDA graph.
// Every wait is time-limited and reports into the error record instead of hanging.
#include <cuda_bf16.h>

#include "ep_rt/copy.cuh"
#include "ep_rt/params.h"
#include "ep_rt/ptx.cuh"
#include "ep_rt/sync.cuh"
#include "ep_rt/topk.cuh"
#if EP_RT_TMA
#include "ep_rt/tma.cuh"
#endif

using namespace ep_rt;

namespace {

constexpr int kWarpSize = 32;

__device__ __forceinline__ int64_t* flag_at(uint64_t buffer, int64_t region, int index) {
    return at<int64_t>(buffer, region) + index;
}

__device__ __forceinline__ int32_t* notify_slot(uint64_t buffer, const ControlLayout& ctrl, int src) {
    return at<int32_t>(buffer, ctrl.notify_slots + int64_t(src) * EP_RT_NOTIFY_SLOT_BYTES);
}

// Token range [begin, end) of a channel: contiguous slices of ceil(N / C) tokens. The same as ep_rt/grid.cuh's,
// which this file includes from its next functional change on (any edit renames the cu12 build's internal symbols,
// and the cu12 intranode cubins' hardware marks would go with them).
__device__ __forceinline__ void channel_range(int num_tokens, int num_channels, int channel, int& begin, int& end) {
    const int per_channel = (num_tokens + num_channels - 1) / num_channels;
    begin = min(channel * per_channel, num_tokens);
    end = min(begin + per_channel, num_tokens);
}

// rows(src -> dst) from the inclusive prefix matrix.
__device__ __forceinline__ int rows_from(const int32_t* rpm, int num_ranks, int src, int dst) {
    return rpm[src * num_ranks + dst] - (src > 0 ? rpm[(src - 1) * num_ranks + dst] : 0);
}

// First row of src's block on dst.
__device__ __forceinline__ int block_start(const int32_t* rpm, int num_ranks, int src, int dst) {
    return src > 0 ? rpm[(src - 1) * num_ranks + dst] : 0;
}

// Rows a source sends back to itself in combine, laid out by destination rank: start of dst's part.
__device__ __forceinline__ int combine_base(const int32_t* rpm, int num_ranks, int src, int dst) {
    int base = 0;
    for (int j = 0; j < dst; ++j) base += rows_from(rpm, num_ranks, src, j);
    return base;
}

__device__ __forceinline__ int combine_rows(const int32_t* rpm, int num_ranks, int src) {
    return combine_base(rpm, num_ranks, src, num_ranks);
}

// A call in rounds (params.h): what to add to a row of src's block on `me` in this round to get its row in the
// whole call (src's start in the call, plus what src sent me in earlier rounds, less its start in this round).
__device__ __forceinline__ int round_row_shift(uint64_t round_rpm, uint64_t full_rpm, int round, int num_ranks, int src,
                                               int me) {
    if (round_rpm == 0) return 0;
    const int32_t* rounds = reinterpret_cast<const int32_t*>(round_rpm);
    const int64_t stride = int64_t(num_ranks) * num_ranks;
    int shift = block_start(reinterpret_cast<const int32_t*>(full_rpm), num_ranks, src, me) -
                block_start(rounds + round * stride, num_ranks, src, me);
    for (int k = 0; k < round; ++k) shift += rows_from(rounds + k * stride, num_ranks, src, me);
    return shift;
}

// Announce `seq` in every peer's flag array at index `me`, after all of this block's earlier stores.
__device__ __forceinline__ void signal_peers(const uint64_t* peer_buffers, int64_t region, int index, int me,
                                             int num_ranks, int64_t seq) {
    __syncthreads();
    const int peer = threadIdx.x;
    if (peer < num_ranks && peer != me) {
        __threadfence_system();
        st_release_sys(flag_at(peer_buffers[peer], region, index), seq);
    }
}

// Every thread < num_ranks waits for its peer's flag at [peer * stride + channel]; returns false for the whole block if any failed.
__device__ __forceinline__ bool wait_peers(uint64_t local, int64_t region, int stride, int channel, int me,
                                           int num_ranks, int64_t seq, int64_t timeout_ns, const ErrorSink& sink,
                                           int phase) {
    bool ok = true;
    const int peer = threadIdx.x;
    if (peer < num_ranks && peer != me)
        ok = wait_flag(flag_at(local, region, peer * stride + channel), seq, timeout_ns, sink, phase, peer, channel);
    return !__syncthreads_or(!ok);
}

// Inclusive block-wide sum of one int per thread (blockDim.x <= 1024); `total` gets the block sum.
__device__ int block_inclusive_scan(int value, int& total) {
    __shared__ int warp_sums[32];
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    int x = value;
#pragma unroll
    for (int d = 1; d < kWarpSize; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    if (lane == kWarpSize - 1) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        const int num_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
        int w = lane < num_warps ? warp_sums[lane] : 0;
#pragma unroll
        for (int d = 1; d < kWarpSize; d <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += y;
        }
        warp_sums[lane] = w;
    }
    __syncthreads();
    const int result = x + (warp > 0 ? warp_sums[warp - 1] : 0);
    total = warp_sums[(blockDim.x + kWarpSize - 1) / kWarpSize - 1];
    __syncthreads();
    return result;
}

}  // namespace

// A numbered collective call: this kind's sequence number is read when each block starts and advanced by the
// last block to finish (sync.cuh), so the kernel can be captured in a CUDA graph.
template <typename Params, void (*kRun)(const Params&, int64_t)>
__device__ __forceinline__ void numbered_call(const Params& p, int kind) {
    const CallSeq call = call_seq(p.peer_buffers[p.rank], p.ctrl, kind);
    const int64_t seq = begin_call(call);
    kRun(p, seq);
    end_call(call, seq);
}

// ------------------------------------------------------------------------------------------------
// Barrier across the ranks of one node (one block).
extern "C" __global__ void __launch_bounds__(32) ep_rt_intranode_barrier(const BarrierParams p) {
    const uint64_t local = p.peer_buffers[p.rank];
    const CallSeq call = call_seq(local, p.ctrl, EP_RT_CALL_BARRIER);
    const int64_t seq = begin_call(call);
    const ErrorSink sink = make_sink(p.error, local, p.ctrl, p.rank);
    const int peer = threadIdx.x;
    if (peer < p.num_ranks && peer != p.rank)
        st_release_sys(flag_at(p.peer_buffers[peer], p.ctrl.barrier_flags, p.rank), seq);
    if (peer < p.num_ranks && peer != p.rank)
        wait_flag(flag_at(local, p.ctrl.barrier_flags, peer), seq, p.timeout_ns, sink, EP_RT_PHASE_BARRIER, peer, -1);
    end_call(call, seq);
}

// ------------------------------------------------------------------------------------------------
// Notify: block r scans column r of is_token_in_rank (send positions and per-channel counts) and
// publishes my counts for rank r into rank r's slot for me; block `rank` then gathers every
// source's slot and derives the prefix matrices and the host-visible receive counts.
__device__ void run_notify(const NotifyParams& p, int64_t seq) {
    __shared__ int channel_counts[EP_RT_MAX_CHANNELS];
    __shared__ int counts[EP_RT_MAX_NVL_RANKS][EP_RT_MAX_NVL_RANKS];
    const int dst = blockIdx.x, me = p.rank, R = p.num_ranks, C = p.num_channels;
    const uint64_t local = p.peer_buffers[me];
    const ErrorSink sink = make_sink(p.error, local, p.ctrl, me);

    for (int c = threadIdx.x; c < C; c += blockDim.x) channel_counts[c] = 0;
    __syncthreads();

    // Send positions for destination `dst`, in token order.
    const bool* in_rank = reinterpret_cast<const bool*>(p.is_token_in_rank);
    int32_t* send_pos = reinterpret_cast<int32_t*>(p.send_pos);
    const int per_channel = max((p.num_tokens + C - 1) / C, 1);
    int running = 0;
    for (int base = 0; base < p.num_tokens; base += blockDim.x) {
        const int t = base + threadIdx.x;
        const bool sent = t < p.num_tokens && in_rank[int64_t(t) * R + dst];
        int total;
        const int inclusive = block_inclusive_scan(sent ? 1 : 0, total);
        if (t < p.num_tokens) send_pos[int64_t(t) * R + dst] = sent ? running + inclusive - 1 : -1;
        if (sent) atomicAdd(&channel_counts[t / per_channel], 1);
        running += total;
    }
    __syncthreads();

    // My channel prefix for dst, and my slot in dst's buffer.
    int32_t* cpm = reinterpret_cast<int32_t*>(p.channel_prefix_matrix);
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int c = 0; c < C; ++c) cpm[dst * C + c] = (acc += channel_counts[c]);
    }
    int32_t* slot = notify_slot(p.peer_buffers[dst], p.ctrl, me);
    const int32_t* per_rank = reinterpret_cast<const int32_t*>(p.num_tokens_per_rank);
    const int32_t* per_expert = reinterpret_cast<const int32_t*>(p.num_tokens_per_expert);
    const int num_local_experts = p.num_experts / R;
    if (threadIdx.x == 0) {
        slot[EP_RT_NOTIFY_HIDDEN_BYTES] = p.hidden_bytes;
        slot[EP_RT_NOTIFY_NUM_TOPK] = p.num_topk;
        slot[EP_RT_NOTIFY_NUM_CHANNELS] = C;
        slot[EP_RT_NOTIFY_NUM_EXPERTS] = p.num_experts;
        slot[EP_RT_NOTIFY_NUM_TOKENS] = p.num_tokens;
    }
    for (int j = threadIdx.x; j < R; j += blockDim.x) slot[EP_RT_NOTIFY_RANK_COUNTS + j] = per_rank[j];
    for (int c = threadIdx.x; c < C; c += blockDim.x) slot[EP_RT_NOTIFY_CHANNEL_COUNTS + c] = channel_counts[c];
    for (int l = threadIdx.x; l < num_local_experts; l += blockDim.x)
        slot[EP_RT_NOTIFY_EXPERT_COUNTS + l] = per_expert[dst * num_local_experts + l];
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        st_release_sys(reinterpret_cast<int64_t*>(slot), seq);
    }
    if (dst != me) return;

    // Gather: wait for every source's slot in my buffer.
    bool ok = true;
    if (threadIdx.x < R)
        ok = wait_flag(reinterpret_cast<int64_t*>(notify_slot(local, p.ctrl, threadIdx.x)), seq, p.timeout_ns, sink,
                       EP_RT_PHASE_NOTIFY, threadIdx.x, -1);
    if (__syncthreads_or(!ok)) return;

    if (threadIdx.x < R) {
        const volatile int32_t* s = notify_slot(local, p.ctrl, threadIdx.x);
        if (s[EP_RT_NOTIFY_HIDDEN_BYTES] != p.hidden_bytes || s[EP_RT_NOTIFY_NUM_TOPK] != p.num_topk ||
            s[EP_RT_NOTIFY_NUM_CHANNELS] != C || s[EP_RT_NOTIFY_NUM_EXPERTS] != p.num_experts)
            report_error(sink, EP_RT_ERR_MISMATCH, EP_RT_PHASE_NOTIFY, threadIdx.x, -1, s[EP_RT_NOTIFY_HIDDEN_BYTES],
                         s[EP_RT_NOTIFY_NUM_TOPK]);
        for (int j = 0; j < R; ++j) counts[threadIdx.x][j] = s[EP_RT_NOTIFY_RANK_COUNTS + j];
    }
    if (__syncthreads_or(error_raised(sink))) return;

    int32_t* rpm = reinterpret_cast<int32_t*>(p.rank_prefix_matrix);
    if (threadIdx.x < R) {
        const int j = threadIdx.x;
        int acc = 0;
        for (int s = 0; s < R; ++s) rpm[s * R + j] = (acc += counts[s][j]);
    }
    int32_t* rcpm = reinterpret_cast<int32_t*>(p.recv_channel_prefix_matrix);
    if (threadIdx.x < R) {
        const volatile int32_t* s = notify_slot(local, p.ctrl, threadIdx.x);
        int acc = 0;
        for (int c = 0; c < C; ++c) {
            rcpm[threadIdx.x * C + c] = acc;
            acc += s[EP_RT_NOTIFY_CHANNEL_COUNTS + c];
        }
    }
    if (p.host_token == 0) return;  // num_worst_tokens: the host does not wait for the counts
    volatile int32_t* host = reinterpret_cast<volatile int32_t*>(p.host_counters);
    for (int l = threadIdx.x; l < num_local_experts; l += blockDim.x) {
        int sum = 0;
        for (int s = 0; s < R; ++s)
            sum += static_cast<const volatile int32_t*>(notify_slot(local, p.ctrl, s))[EP_RT_NOTIFY_EXPERT_COUNTS + l];
        const int a = p.expert_alignment;
        host[EP_RT_HOST_EXPERT_COUNTS + l] = (sum + a - 1) / a * a;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int max_dispatch = 0, max_combine = 0;
        for (int r = 0; r < R; ++r) {
            int into = 0, out = 0;
            for (int s = 0; s < R; ++s) into += counts[s][r], out += counts[r][s];
            max_dispatch = max(max_dispatch, into);
            max_combine = max(max_combine, out);
        }
        int num_recv = 0, max_tokens = 0;
        for (int s = 0; s < R; ++s) {
            num_recv += counts[s][me];
            max_tokens =
                max(max_tokens,
                    static_cast<const volatile int32_t*>(notify_slot(local, p.ctrl, s))[EP_RT_NOTIFY_NUM_TOKENS]);
        }
        host[EP_RT_HOST_MAX_TOKENS] = max_tokens;  // how many rounds a call too large for the buffer takes
        host[EP_RT_HOST_MAX_DISPATCH_ROWS] = max_dispatch;
        host[EP_RT_HOST_MAX_COMBINE_ROWS] = max_combine;
        host[EP_RT_HOST_NUM_RECV] = num_recv;
        __threadfence_system();
        host[EP_RT_HOST_TOKEN] = int32_t(p.host_token & 0x7fffffff);
        __threadfence_system();
    }
}

extern "C" __global__ void __launch_bounds__(1024) ep_rt_intranode_notify(const NotifyParams p) {
    numbered_call<NotifyParams, run_notify>(p, EP_RT_CALL_NOTIFY);
}

// ------------------------------------------------------------------------------------------------
// Dispatch: block c sends channel c's tokens to every destination, then receives channel c of every
// source. Sending never waits, so blocks cannot deadlock whatever the residency.
__device__ void run_dispatch(const DispatchParams& p, int64_t seq) {
    const int me = p.rank, R = p.num_ranks, C = p.num_channels, c = blockIdx.x;
    const uint64_t local = p.peer_buffers[me];
    const ErrorSink sink = make_sink(p.error, local, p.ctrl, me);
    const int32_t* rpm = reinterpret_cast<const int32_t*>(p.rank_prefix_matrix);
    const int32_t* rcpm = reinterpret_cast<const int32_t*>(p.recv_channel_prefix_matrix);
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int num_warps = blockDim.x / kWarpSize;
    const int64_t hidden_bytes = p.hidden_bytes;
    const int S = p.num_scales, K = p.num_topk, L = p.num_local_experts;

    if (p.handshake) {  // cached mode: peers may still be reading their buffers from the last call
        if (c == 0) signal_peers(p.peer_buffers, p.ctrl.dispatch_ready, me, me, R, seq);
        if (!wait_peers(local, p.ctrl.dispatch_ready, 1, 0, me, R, seq, p.timeout_ns, sink,
                        EP_RT_PHASE_DISPATCH_HANDSHAKE))
            return;
    }

    // Where my block of rows starts on each destination, whether it fits, and its base addresses
    // (my own rows go straight into the output tensors).
    __shared__ int row_base[EP_RT_MAX_NVL_RANKS];
    __shared__ int row_limit[EP_RT_MAX_NVL_RANKS];
    __shared__ uint64_t x_base[EP_RT_MAX_NVL_RANKS], scale_base[EP_RT_MAX_NVL_RANKS];
    __shared__ uint64_t idx_base[EP_RT_MAX_NVL_RANKS], w_base[EP_RT_MAX_NVL_RANKS], src_base[EP_RT_MAX_NVL_RANKS];
    __shared__ int row_shift[EP_RT_MAX_NVL_RANKS];  // per source: 0 unless the call runs in rounds
    if (threadIdx.x < R) {
        const int dst = threadIdx.x;
        row_shift[dst] = round_row_shift(p.round_rpm, p.full_rpm, p.round, R, dst, me);
        const int total = rpm[(R - 1) * R + dst];
        row_base[dst] = block_start(rpm, R, me, dst);
        const int64_t limit = dst == me ? p.num_out_rows : p.region.capacity;
        row_limit[dst] = int(min(int64_t(total), limit));
        if (c == 0 && total > limit)
            report_error(sink, dst == me ? EP_RT_ERR_WORST_TOKENS : EP_RT_ERR_CAPACITY, EP_RT_PHASE_DISPATCH_RECV, dst,
                         c, total, limit);
        if (dst == me) {  // (my own rows: their row in the whole call)
            const int64_t shift = row_shift[me];
            auto shifted = [shift](uint64_t ptr, int64_t row_bytes) { return ptr ? ptr + shift * row_bytes : ptr; };
            x_base[dst] = shifted(p.recv_x, hidden_bytes), scale_base[dst] = shifted(p.recv_x_scales, S * 4);
            idx_base[dst] = shifted(p.recv_topk_idx, K * topk_idx_bytes(p.recv_topk_idx_bits));
            w_base[dst] = shifted(p.recv_topk_weights, K * 4), src_base[dst] = shifted(p.recv_src_idx, 4);
        } else {
            const uint64_t data = p.peer_buffers[dst] + p.ctrl.data;
            x_base[dst] = data + p.region.x, scale_base[dst] = data + p.region.scales;
            idx_base[dst] = data + p.region.topk_idx, w_base[dst] = data + p.region.topk_weights;
            src_base[dst] = data + p.region.src_idx;
        }
    }
    __syncthreads();

    // ---- send ----
    int begin, end;
    channel_range(p.num_tokens, C, c, begin, end);
    const int4* x = reinterpret_cast<const int4*>(p.x);
    const int32_t* x_scales = reinterpret_cast<const int32_t*>(p.x_scales);
    const TopkIdx topk_idx(p.topk_idx, p.topk_idx_bits);
    const float* topk_weights = reinterpret_cast<const float*>(p.topk_weights);
    const int32_t* send_pos = reinterpret_cast<const int32_t*>(p.send_pos);
    const int hidden_int4 = int(hidden_bytes / 16);
    for (int t = begin + warp; t < end; t += num_warps) {
        // This token's row on each destination (-1: not sent there).
        int row[EP_RT_MAX_NVL_RANKS];
        const int my_pos = lane < R ? send_pos[int64_t(t) * R + lane] : -1;
#pragma unroll
        for (int j = 0; j < EP_RT_MAX_NVL_RANKS; ++j) {
            const int pos = __shfl_sync(0xffffffffu, my_pos, j);
            row[j] = (j < R && pos >= 0 && row_base[j] + pos < row_limit[j]) ? row_base[j] + pos : -1;
        }

        // Hidden row: load once, store to every destination.
        const int4* x_row = x + int64_t(t) * hidden_int4;
        constexpr int kUnroll = 4;
        for (int i = lane; i < hidden_int4; i += kWarpSize * kUnroll) {
            int4 v[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
                if (i + u * kWarpSize < hidden_int4) v[u] = ld_input_v4(x_row + i + u * kWarpSize);
#pragma unroll
            for (int j = 0; j < EP_RT_MAX_NVL_RANKS; ++j) {
                if (row[j] < 0) continue;
                int4* d = reinterpret_cast<int4*>(x_base[j] + row[j] * hidden_bytes);
#pragma unroll
                for (int u = 0; u < kUnroll; ++u)
                    if (i + u * kWarpSize < hidden_int4) st_na_v4(d + i + u * kWarpSize, v[u]);
            }
        }
        // Scales as opaque 32-bit words, honouring the input strides.
        if (x_scales != nullptr) {
            for (int i = lane; i < S; i += kWarpSize) {
                const int32_t v = x_scales[int64_t(t) * p.scale_token_stride + int64_t(i) * p.scale_hidden_stride];
#pragma unroll
                for (int j = 0; j < EP_RT_MAX_NVL_RANKS; ++j)
                    if (row[j] >= 0) reinterpret_cast<int32_t*>(scale_base[j])[int64_t(row[j]) * S + i] = v;
            }
        }
        // Top-k re-based to each destination's local experts.
        if (topk_idx.present()) {
            for (int k = lane; k < K; k += kWarpSize) {
                const int64_t e = topk_idx[int64_t(t) * K + k];
                const float w = topk_weights != nullptr ? topk_weights[int64_t(t) * K + k] : 0.0f;
#pragma unroll
                for (int j = 0; j < EP_RT_MAX_NVL_RANKS; ++j) {
                    if (row[j] < 0) continue;
                    const bool mine = e >= int64_t(j) * L && e < int64_t(j + 1) * L;
                    store_topk_idx(idx_base[j], p.recv_topk_idx_bits, int64_t(row[j]) * K + k,
                                   mine ? e - int64_t(j) * L : -1);
                    if (topk_weights != nullptr)
                        reinterpret_cast<float*>(w_base[j])[int64_t(row[j]) * K + k] = mine ? w : 0.0f;
                }
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < EP_RT_MAX_NVL_RANKS; ++j)
                if (row[j] >= 0) reinterpret_cast<int32_t*>(src_base[j])[row[j]] = t + p.token_offset;
        }
    }
    signal_peers(p.peer_buffers, p.ctrl.dispatch_done, me * EP_RT_MAX_CHANNELS + c, me, R, seq);

    // ---- receive: copy channel c of every remote source out of my buffer ----
    if (!wait_peers(local, p.ctrl.dispatch_done, EP_RT_MAX_CHANNELS, c, me, R, seq, p.timeout_ns, sink,
                    EP_RT_PHASE_DISPATCH_RECV))
        return;
    const uint64_t data = local + p.ctrl.data;
#if EP_RT_TMA  // the hidden rows through the copy engine (thread 0); the other arrays by warps 1.. meanwhile
    __shared__ __align__(128) uint8_t tma_stage[tma::kStages * tma::kStageBytes];
    __shared__ __align__(8) uint64_t tma_bar[tma::kStages];
    tma::Copier copier(tma_stage, tma_bar, 0);
    if (threadIdx.x == 0) tma::fence_global_to_async();
#define EP_RT_RECV_ROWS(d, s, n) tma::block_rows<Src::kPeerWritten>(copier, d, s, n)
#define EP_RT_RECV_SMALL(d, s, n) tma::side_copy<Src::kPeerWritten>(d, s, n)
#else
#define EP_RT_RECV_ROWS(d, s, n) block_copy<Src::kPeerWritten>(d, s, n)
#define EP_RT_RECV_SMALL(d, s, n) block_copy<Src::kPeerWritten>(d, s, n)
#endif
    for (int src = 0; src < R; ++src) {
        if (src == me) continue;
        const int rows_total = rows_from(rpm, R, src, me);
        const int first = rcpm[src * C + c];
        const int last = c + 1 < C ? rcpm[src * C + c + 1] : rows_total;
        const int row_begin = block_start(rpm, R, src, me) + first;
        const int row_end = min(block_start(rpm, R, src, me) + last, row_limit[me]);
        if (row_end <= row_begin) continue;
        const int64_t n = row_end - row_begin;
        const int64_t out = row_begin + row_shift[src];  // its row in the whole call's output
        EP_RT_RECV_ROWS(reinterpret_cast<uint8_t*>(p.recv_x) + out * hidden_bytes,
                        at<uint8_t>(data, p.region.x) + row_begin * hidden_bytes, n * hidden_bytes);
        if (p.recv_x_scales)
            EP_RT_RECV_SMALL(reinterpret_cast<int32_t*>(p.recv_x_scales) + out * S,
                             at<int32_t>(data, p.region.scales) + int64_t(row_begin) * S, n * S * 4);
        if (p.recv_topk_idx) {
            const int64_t w = topk_idx_bytes(p.recv_topk_idx_bits);
            EP_RT_RECV_SMALL(reinterpret_cast<uint8_t*>(p.recv_topk_idx) + out * K * w,
                             at<uint8_t>(data, p.region.topk_idx) + int64_t(row_begin) * K * w, n * K * w);
        }
        if (p.recv_topk_weights)
            EP_RT_RECV_SMALL(reinterpret_cast<float*>(p.recv_topk_weights) + out * K,
                             at<float>(data, p.region.topk_weights) + int64_t(row_begin) * K, n * K * 4);
        EP_RT_RECV_SMALL(reinterpret_cast<int32_t*>(p.recv_src_idx) + out,
                         at<int32_t>(data, p.region.src_idx) + row_begin, n * 4);
    }
#undef EP_RT_RECV_ROWS
#undef EP_RT_RECV_SMALL

    // num_worst_tokens: rows past the real count carry no expert.
    if (p.fill_unused_rows && p.recv_topk_idx) {
        const int num_recv = rpm[(R - 1) * R + me];
        for (int64_t i = int64_t(num_recv) * K + int64_t(c) * blockDim.x + threadIdx.x; i < int64_t(p.num_out_rows) * K;
             i += int64_t(C) * blockDim.x)
            store_topk_idx(p.recv_topk_idx, p.recv_topk_idx_bits, i, -1);
    }
}

extern "C" __global__ void __launch_bounds__(512) ep_rt_intranode_dispatch(const DispatchParams p) {
    numbered_call<DispatchParams, run_dispatch>(p, EP_RT_CALL_DISPATCH);
}

// ------------------------------------------------------------------------------------------------
// Combine: block c sends the rows it holds for channel c of every source back to that source,
// then reduces channel c of its own tokens: bias first, then ranks in ascending order, in f32.
#if EP_RT_TMA
// The reduction's row loads through the copy engine (tma variant; docs/experiments/applied/ht_tma_combine.patch,
// measured in docs/GPU_RESULTS.md): each warp's lane 0 loads a chunk of every source row of the warp's token into one
// of the warp's two shared stages with bulk loads completed on the warp's mbarrier, the lanes reduce the chunk from
// shared memory while the next chunk loads.
// A warp so keeps up to 2 x kCombineStageBytes of rows in flight where its lanes' own loads keep 2 KB (4 int4 a
// lane), which is what bounds the reduction when few SMs run it. Used only when the launch gives the dynamic shared
// memory (kCombineSmem; the runtime reads the size below), else the warps load as in the plain build.
constexpr int kCombineStages = 2;
constexpr int kCombineStageBytes = 6144;
constexpr int kCombineWarps = 16;  // the kernel's 512 threads
constexpr uint32_t kCombineSmem = uint32_t(kCombineWarps) * kCombineStages * kCombineStageBytes;

// The dynamic shared memory the combine asks its launches for (modules.requested_dynamic_smem).
extern "C" __constant__ uint32_t ep_rt_intranode_combine_dynamic_smem = kCombineSmem;

// One token's hidden row reduced from its sources' rows (row[r] >= 0) through the warp's stages; the sum's order is
// the plain path's (bias0, bias1, then the sources by rank), so the result is the same bit for bit. Called by the
// whole warp; `parity` (the same in every lane) tracks the phases of the warp's two mbarriers across tokens.
__device__ __forceinline__ void reduce_row_bulk(const int4* (&src_rows)[EP_RT_MAX_NVL_RANKS],
                                                const int (&row)[EP_RT_MAX_NVL_RANKS], int n_src, int hidden_int4,
                                                const int4* bias0, const int4* bias1, int4* out, uint8_t* stage,
                                                uint64_t* bar, uint32_t& parity, int lane) {
    // Chunk: a multiple of 32 int4 (each lane the same count), as much of every source row as fits in one stage.
    int chunk = (kCombineStageBytes / 16 / n_src) / kWarpSize * kWarpSize;
    if (chunk < kWarpSize) chunk = kWarpSize;
    const int chunks = (hidden_int4 + chunk - 1) / chunk;
    auto issue = [&](int k) {  // lane 0
        const int s = k % kCombineStages, first = k * chunk;
        const int n = min(chunk, hidden_int4 - first);
        tma::arrive_expect_tx(bar + s, uint32_t(n_src) * uint32_t(n) * 16u);
        int j = 0;
#pragma unroll
        for (int r = 0; r < EP_RT_MAX_NVL_RANKS; ++r) {
            if (row[r] < 0) continue;
            tma::load_1d(stage + s * kCombineStageBytes + j * chunk * 16, src_rows[r] + first, uint32_t(n) * 16u,
                         bar + s);
            ++j;
        }
    };
    __syncwarp();  // every lane is done with the stages (the previous token's chunks)
    if (lane == 0) {
        tma::fence_shared_to_async();
        issue(0);
    }
    for (int k = 0; k < chunks; ++k) {
        const int s = k % kCombineStages, first = k * chunk;
        const int n = min(chunk, hidden_int4 - first);
        if (k + 1 < chunks) {
            __syncwarp();  // every lane is done with chunk k - 1, the last use of stage (k + 1) % 2
            if (lane == 0) {
                tma::fence_shared_to_async();
                issue(k + 1);
            }
        }
        tma::wait_phase(bar + s, (parity >> s) & 1u);
        parity ^= 1u << s;
        const int4* staged = reinterpret_cast<const int4*>(stage + s * kCombineStageBytes);
        for (int i = lane; i < n; i += kWarpSize) {
            float acc[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
            auto accumulate = [&](const int4 v) {
                const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] += __bfloat162float(h[e]);
            };
            if (bias0) accumulate(ld_input_v4(bias0 + first + i));
            if (bias1) accumulate(ld_input_v4(bias1 + first + i));
            for (int j = 0; j < n_src; ++j) accumulate(staged[j * chunk + i]);
            int4 packed;
            __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
            for (int e = 0; e < 8; ++e) h[e] = __float2bfloat16_rn(acc[e]);
            st_na_v4(out + first + i, packed);
        }
    }
}
#endif

__device__ void run_combine(const CombineParams& p, int64_t seq) {
    const int me = p.rank, R = p.num_ranks, C = p.num_channels, c = blockIdx.x;
    const uint64_t local = p.peer_buffers[me];
    const ErrorSink sink = make_sink(p.error, local, p.ctrl, me);
    const int32_t* rpm = reinterpret_cast<const int32_t*>(p.rank_prefix_matrix);
    const int32_t* rcpm = reinterpret_cast<const int32_t*>(p.recv_channel_prefix_matrix);
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int num_warps = blockDim.x / kWarpSize;
    const int H = p.hidden, K = p.num_topk;
    const int64_t row_bytes = int64_t(H) * 2;

    // Peers may still be reading their buffers (previous call): wait until all have started this one.
    if (c == 0) signal_peers(p.peer_buffers, p.ctrl.combine_ready, me, me, R, seq);
    if (!wait_peers(local, p.ctrl.combine_ready, 1, 0, me, R, seq, p.timeout_ns, sink, EP_RT_PHASE_COMBINE_HANDSHAKE))
        return;

    // ---- send back: my rows of source `src`'s channel c go to src's buffer ----
    for (int src = 0; src < R; ++src) {
        if (src == me) continue;
        const int first = rcpm[src * C + c];
        const int last = c + 1 < C ? rcpm[src * C + c + 1] : rows_from(rpm, R, src, me);
        const int in_begin =
            block_start(rpm, R, src, me) + first + round_row_shift(p.round_rpm, p.full_rpm, p.round, R, src, me);
        const int n = min(last - first, p.num_in_rows - in_begin);
        const int dst_row = combine_base(rpm, R, src, me) + first;
        if (combine_rows(rpm, R, src) > p.region.capacity) {
            if (threadIdx.x == 0)
                report_error(sink, EP_RT_ERR_CAPACITY, EP_RT_PHASE_COMBINE_RECV, src, c, combine_rows(rpm, R, src),
                             p.region.capacity);
            continue;
        }
        if (n <= 0) continue;
        const uint64_t data = p.peer_buffers[src] + p.ctrl.data;
        block_copy<Src::kInput>(at<uint8_t>(data, p.region.x) + dst_row * row_bytes,
                                reinterpret_cast<const uint8_t*>(p.x) + in_begin * row_bytes, n * row_bytes);
        if (p.topk_weights)
            block_copy<Src::kInput>(at<float>(data, p.region.topk_weights) + int64_t(dst_row) * K,
                                    reinterpret_cast<const float*>(p.topk_weights) + int64_t(in_begin) * K,
                                    int64_t(n) * K * 4);
    }
    signal_peers(p.peer_buffers, p.ctrl.combine_done, me * EP_RT_MAX_CHANNELS + c, me, R, seq);

    // ---- reduce channel c of my tokens ----
    if (!wait_peers(local, p.ctrl.combine_done, EP_RT_MAX_CHANNELS, c, me, R, seq, p.timeout_ns, sink,
                    EP_RT_PHASE_COMBINE_RECV))
        return;
    if (combine_rows(rpm, R, me) > p.region.capacity) {  // the senders skipped my rows: say so here too
        if (c == 0 && threadIdx.x == 0)
            report_error(sink, EP_RT_ERR_CAPACITY, EP_RT_PHASE_COMBINE_RECV, me, c, combine_rows(rpm, R, me),
                         p.region.capacity);
        return;
    }
    __shared__ int src_base[EP_RT_MAX_NVL_RANKS];
    if (threadIdx.x < R) {
        const int r = threadIdx.x;
        src_base[r] = r == me
                          ? block_start(rpm, R, me, me) + round_row_shift(p.round_rpm, p.full_rpm, p.round, R, me, me)
                          : combine_base(rpm, R, me, r);
    }
    __syncthreads();
    int begin, end;
    channel_range(p.num_tokens, C, c, begin, end);
    const uint64_t data = local + p.ctrl.data;
    const int32_t* send_pos = reinterpret_cast<const int32_t*>(p.send_pos);
    const int hidden_int4 = H / 8;
#if EP_RT_TMA
    extern __shared__ __align__(128) uint8_t combine_stage[];  // kCombineSmem when the launch gives it
    __shared__ __align__(8) uint64_t combine_bar[kCombineWarps * kCombineStages];
    const bool bulk = tma::dynamic_smem_bytes() >= ep_rt_intranode_combine_dynamic_smem && num_warps <= kCombineWarps &&
                      ((reinterpret_cast<uintptr_t>(p.x) | (data + p.region.x)) & 15) == 0;  // block-uniform
    uint8_t* warp_stage = combine_stage + warp * kCombineStages * kCombineStageBytes;
    uint64_t* warp_bar = combine_bar + warp * kCombineStages;
    uint32_t bulk_parity = 0;  // the same in every lane of the warp
    if (bulk && lane == 0) {
        for (int s = 0; s < kCombineStages; ++s) tma::mbar_init(warp_bar + s, 1);
        tma::fence_mbar_init();
        tma::fence_global_to_async();  // the peers' rows, acquired above, before the bulk loads read them
    }
#endif
    for (int t = begin + warp; t < end; t += num_warps) {
        const int my_pos = lane < R ? send_pos[int64_t(t) * R + lane] : -1;
        int row[EP_RT_MAX_NVL_RANKS];
        const int4* src_rows[EP_RT_MAX_NVL_RANKS];
#pragma unroll
        for (int r = 0; r < EP_RT_MAX_NVL_RANKS; ++r) {
            const int pos = __shfl_sync(0xffffffffu, my_pos, r);
            row[r] = (r < R && pos >= 0) ? src_base[r] + pos : -1;
            if (row[r] < 0) continue;
            src_rows[r] = r == me ? reinterpret_cast<const int4*>(p.x) + int64_t(row[r]) * hidden_int4
                                  : at<const int4>(data, p.region.x) + int64_t(row[r]) * hidden_int4;
        }
        const int4* bias0 = p.bias0 ? reinterpret_cast<const int4*>(p.bias0) + int64_t(t) * hidden_int4 : nullptr;
        const int4* bias1 = p.bias1 ? reinterpret_cast<const int4*>(p.bias1) + int64_t(t) * hidden_int4 : nullptr;
        int4* out = reinterpret_cast<int4*>(p.combined_x) + int64_t(t) * hidden_int4;
        // kChunks int4 per lane in flight per rank: the reduction is bound by load latency otherwise.
        constexpr int kChunks = 4;
#if EP_RT_TMA
        int first_plain = lane;  // where the plain loop starts (past the row when the bulk path reduced it)
        int n_src = 0;
#pragma unroll
        for (int r = 0; r < EP_RT_MAX_NVL_RANKS; ++r) n_src += row[r] >= 0;
        if (bulk && n_src > 0) {
            reduce_row_bulk(src_rows, row, n_src, hidden_int4, bias0, bias1, out, warp_stage, warp_bar, bulk_parity,
                            lane);
            first_plain = hidden_int4;
        }
        for (int i0 = first_plain; i0 < hidden_int4; i0 += kWarpSize * kChunks) {
#else
        for (int i0 = lane; i0 < hidden_int4; i0 += kWarpSize * kChunks) {
#endif
            float acc[kChunks][8];
#pragma unroll
            for (int u = 0; u < kChunks; ++u)
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[u][e] = 0.0f;
            auto accumulate = [&](const int4(&v)[kChunks]) {
#pragma unroll
                for (int u = 0; u < kChunks; ++u) {
                    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v[u]);
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[u][e] += __bfloat162float(h[e]);
                }
            };
            auto in_range = [&](int u) { return i0 + u * kWarpSize < hidden_int4; };
            int4 v[kChunks];
            if (bias0) {
#pragma unroll
                for (int u = 0; u < kChunks; ++u) v[u] = in_range(u) ? ld_input_v4(bias0 + i0 + u * kWarpSize) : int4{};
                accumulate(v);
            }
            if (bias1) {
#pragma unroll
                for (int u = 0; u < kChunks; ++u) v[u] = in_range(u) ? ld_input_v4(bias1 + i0 + u * kWarpSize) : int4{};
                accumulate(v);
            }
#pragma unroll
            for (int r = 0; r < EP_RT_MAX_NVL_RANKS; ++r) {
                if (row[r] < 0) continue;
                const int4* src = src_rows[r] + i0;
#pragma unroll
                for (int u = 0; u < kChunks; ++u)
                    v[u] = !in_range(u) ? int4{}
                           : r == me    ? ld_input_v4(src + u * kWarpSize)
                                        : ld_peer_written_v4(src + u * kWarpSize);
                accumulate(v);
            }
#pragma unroll
            for (int u = 0; u < kChunks; ++u) {
                if (!in_range(u)) continue;
                int4 packed;
                __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
                for (int e = 0; e < 8; ++e) h[e] = __float2bfloat16_rn(acc[u][e]);
                st_na_v4(out + i0 + u * kWarpSize, packed);
            }
        }
        if (p.combined_topk_weights) {
            const float* local_w = reinterpret_cast<const float*>(p.topk_weights);
            const float* remote_w = at<const float>(data, p.region.topk_weights);
            float* out_w = reinterpret_cast<float*>(p.combined_topk_weights) + int64_t(t) * K;
            for (int k = lane; k < K; k += kWarpSize) {
                float acc = 0.0f;
#pragma unroll
                for (int r = 0; r < EP_RT_MAX_NVL_RANKS; ++r) {
                    if (row[r] < 0) continue;
                    acc += r == me ? local_w[int64_t(row[r]) * K + k]
                                   : __int_as_float(ld_peer_written_b32(
                                         reinterpret_cast<const int32_t*>(remote_w + int64_t(row[r]) * K + k)));
                }
                out_w[k] = acc;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(512) ep_rt_intranode_combine(const CombineParams p) {
    numbered_call<CombineParams, run_combine>(p, EP_RT_CALL_COMBINE);
}
