// ep_rt-build: nvshmem min_arch=sm_90 variants=safe,aggressive,chaos
//
// Internode high-throughput dispatch and combine (several nodes: NVSHMEM between nodes, NVLink inside one).
//
// Design (docs/INTERNODE_DESIGN.md): once counts are exchanged every token's place is known, so nothing is a ring.
// A token of rank src travels once to each node n it reaches (hop 1: a put from src's staging area to the
// receive area [src's node][stream position] of its rail peer f = n * G + src % G), and each rank of node n pulls
// the tokens meant for it from f's receive area over NVLink (hop 2) straight into its outputs. Combine mirrors
// it: every rank copies its rows into its NVL buffer, the forwarder sums a token's rows of its node (f32 -> bf16)
// and puts the partial back to the source, which sums bias and nodes in f32.
//
// Each call is a few kernels on one stream. A kernel waits only for other ranks' kernels (or earlier kernels of its
// own rank), never for a later kernel of its own rank, so no residency is assumed. Reuse: every dispatch starts
// with an all-to-all (the notify, or the cached handshake) and every combine with a handshake, which each rank
// enters only after its previous call's kernels ended; so no area is written while a reader of the previous call
// may still read it. Network signals: only put-with-signal (SIGNAL_ADD), signal_op ADD and quiet (net.cuh); one
// word per (sender, chunk) and call, waited for its exact count; no NVSHMEM barrier or collective in a kernel.
// Call numbers live in device memory (workspace), so every kernel here can be captured in a CUDA graph.
#include <cuda_bf16.h>

#include "ep_rt/copy.cuh"
#include "ep_rt/net.cuh"
#include "ep_rt/params.h"
#include "ep_rt/ptx.cuh"
#include "ep_rt/sync.cuh"
#include "ep_rt/topk.cuh"

using namespace ep_rt;

namespace {

constexpr int kWarp = 32;

struct In {
    const InternodeParams& p;
    int me, R, G, N, C, m, j;
    int64_t* ws;

    __device__ In(const InternodeParams& params) : p(params) {
        me = p.rank, R = p.num_ranks, G = p.ranks_per_node, N = p.num_nodes, C = p.num_channels;
        m = me / G, j = me % G;
        ws = reinterpret_cast<int64_t*>(p.workspace);
    }
    __device__ ErrorSink sink() const { return ErrorSink{p.error, reinterpret_cast<int32_t*>(ws + EP_RT_IN_WS_CLAIM), me}; }
    __device__ int64_t seq(int kind) const { return *reinterpret_cast<volatile int64_t*>(ws + kind) + 1; }
    __device__ uint8_t* local(int64_t off) const { return reinterpret_cast<uint8_t*>(p.sym_base + off); }
    // A symmetric offset on rank r of my node, through its NVLink mapping.
    __device__ uint8_t* on_peer(int r, int64_t off) const {
        return reinterpret_cast<uint8_t*>(reinterpret_cast<const uint64_t*>(p.sym_peers)[r] + off);
    }
    __device__ uint64_t* word(int64_t region, int index) const {
        return reinterpret_cast<uint64_t*>(local(region)) + index;
    }
    __device__ uint8_t* record(int64_t area, int node, int64_t pos) const {
        return local(area) + (int64_t(node) * p.lay.cap + pos) * p.lay.record_bytes;
    }
    __device__ int rail(int node) const { return node * G + j; }
};

__device__ __forceinline__ void channel_range(int num_tokens, int num_channels, int channel, int& begin, int& end) {
    const int per_channel = (num_tokens + num_channels - 1) / num_channels;
    begin = min(channel * per_channel, num_tokens);
    end = min(begin + per_channel, num_tokens);
}

__device__ __forceinline__ int64_t align16(int64_t v) { return (v + 15) / 16 * 16; }

// Dispatch record: row | scales (S words) | top-k ids (K int32, global, -1 none) | weights (K f32) | token | mask.
struct Rec {
    int64_t scales, idx, weights, meta;
    __device__ Rec(int hidden_bytes, int S, int K) {
        scales = hidden_bytes;
        idx = scales + 4 * int64_t(S);
        weights = idx + 4 * int64_t(K);
        meta = weights + 4 * int64_t(K);
    }
};

// Wait until the u64 signal word holds at least `seq` (one ADD per call: the exact count of this call).
__device__ __forceinline__ bool wait_word(const uint64_t* w, int64_t seq, int64_t timeout_ns, const ErrorSink& sink,
                                          int phase, int peer, int channel) {
    return wait_flag(reinterpret_cast<const int64_t*>(w), seq, timeout_ns, sink, phase, peer, channel);
}

// Wait for the next signal on a per-(sender, channel) word: one more than this rank has consumed from it (a word
// gets one signal per call that uses its channel, and calls may use different channel counts). One thread per word.
__device__ __forceinline__ bool wait_next(const uint64_t* w, int64_t* consumed, int64_t timeout_ns,
                                          const ErrorSink& sink, int phase, int peer, int channel) {
    const int64_t want = *consumed + 1;
    if (!wait_word(w, want, timeout_ns, sink, phase, peer, channel)) return false;
    *consumed = want;
    return true;
}

// The last block of the grid to arrive here (tickets in the workspace); true in exactly one block.
__device__ __forceinline__ bool last_block(int64_t* ticket) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(reinterpret_cast<unsigned long long*>(ticket), 1ull) == gridDim.x - 1;
        if (last) *reinterpret_cast<volatile int64_t*>(ticket) = 0;
        __threadfence();
    }
    __syncthreads();
    return last;
}

// Advance a call number; the last kernel of an op calls it in its last block, after all its own waits.
__device__ __forceinline__ void advance(const In& in, int kind, int64_t seq) {
    if (threadIdx.x == 0) *reinterpret_cast<volatile int64_t*>(in.ws + kind) = seq;
}

// A caller's error found mid-call (a dispatch that does not fit its buffers or num_worst_tokens, a handle without
// facts too large for them) is reported by the call's last kernel, after every wait and signal of the call. The
// kernels stop at the first recorded error, so an error recorded earlier would leave signal words ahead of their
// consumed counts; after the Buffer is rearmed every later wait on them would pass one call early.
constexpr int kWsDeferred = 18;  // int64 words 18..20: code | phase << 8 | (peer + 1) << 16 | (channel + 1) << 40,
                                 // detail0, detail1 (0 when none; the reporter clears it)
static_assert(kWsDeferred + 3 <= EP_RT_IN_WS_WORDS, "the workspace holds the deferred error");

__device__ __forceinline__ void defer_error(const In& in, int code, int phase, int peer, int channel, int64_t detail0,
                                            int64_t detail1) {
    const unsigned long long word = (unsigned long long)code | ((unsigned long long)phase << 8) |
                                    ((unsigned long long)(peer + 1) << 16) | ((unsigned long long)(channel + 1) << 40);
    if (atomicCAS(reinterpret_cast<unsigned long long*>(in.ws + kWsDeferred), 0ull, word) == 0ull) {
        reinterpret_cast<volatile int64_t*>(in.ws)[kWsDeferred + 1] = detail0;
        reinterpret_cast<volatile int64_t*>(in.ws)[kWsDeferred + 2] = detail1;
    }
}

// In the last block of a call's last kernel, after its waits: report the deferred error, if any.
__device__ __forceinline__ void report_deferred(const In& in) {
    volatile int64_t* w = reinterpret_cast<volatile int64_t*>(in.ws) + kWsDeferred;
    if (threadIdx.x != 0 || w[0] == 0) return;
    const uint64_t word = uint64_t(w[0]);
    report_error(in.sink(), int(word & 0xff), int((word >> 8) & 0xff), int((word >> 16) & 0xffffff) - 1,
                 int((word >> 40) & 0xffff) - 1, w[1], w[2]);
    w[0] = 0;
}

// Every rank signals word [me] of `region` on every rank, then the block waits for all R words (network deadline).
// Called by block 0 only for the signals; every block may wait.
__device__ bool all_to_all_handshake(const In& in, int64_t region, int64_t seq, bool send, int phase) {
    if (send) {
        for (int r = threadIdx.x; r < in.R; r += blockDim.x) net_signal_add(in.word(region, in.me), 1, r);
        __syncthreads();
        if (threadIdx.x == 0) net_quiet();  // delivered before we wait for the replies (net.cuh's contract)
    }
    bool ok = true;
    for (int r = threadIdx.x; r < in.R; r += blockDim.x)
        ok = ok && wait_word(in.word(region, r), seq, in.p.net_timeout_ns, in.sink(), phase, r, -1);
    return !__syncthreads_or(!ok);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Count + notify (grid C). Every block counts its channel's tokens per destination rank and per destination node,
// and writes send_rdma_head (position in the channel's stream to each node). The last block derives the sender
// prefix matrices, puts to every rank its slot (counts for it, and the totals everyone needs to make the same
// capacity decisions), waits for every rank's slot, then derives the receive-side handle fields and the counts
// the host needs.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_notify(const InternodeParams p) {
    const In in(p);
    const int R = in.R, N = in.N, C = in.C, G = in.G, c = blockIdx.x;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, num_warps = blockDim.x / kWarp;
    const int64_t seq = in.seq(EP_RT_IN_WS_NOTIFY);
    const ErrorSink sink = in.sink();
    const bool* in_rank = reinterpret_cast<const bool*>(p.is_token_in_rank);
    int32_t* scratch = reinterpret_cast<int32_t*>(p.scratch);  // [C][R + N]
    int32_t* rdma_head = reinterpret_cast<int32_t*>(p.send_rdma_head);

    int begin, end;
    channel_range(p.num_tokens, C, c, begin, end);
    // Column x < R: tokens to rank x; x >= R: tokens that reach node x - R (and their stream positions).
    for (int x = warp; x < R + N; x += num_warps) {
        int run = 0;
        for (int t0 = begin; t0 < end; t0 += kWarp) {
            const int t = t0 + lane;
            bool hit = false;
            if (t < end) {
                const bool* row = in_rank + int64_t(t) * R;
                if (x < R) {
                    hit = row[x];
                } else {
                    for (int l = 0; l < G; ++l) hit = hit || row[(x - R) * G + l];
                }
            }
            const unsigned ballot = __ballot_sync(0xffffffffu, hit);
            if (x >= R && t < end)
                rdma_head[int64_t(t) * N + (x - R)] = hit ? run + __popc(ballot & ((1u << lane) - 1u)) : -1;
            run += __popc(ballot);
        }
        if (lane == 0) scratch[c * (R + N) + x] = run;
    }
    if (!last_block(in.ws + EP_RT_IN_WS_TICKET + 0)) return;

    // ---- the last block: sender prefix matrices ([1], [2]) ----
    int32_t* rdma_cpm = reinterpret_cast<int32_t*>(p.rdma_cpm);
    int32_t* gbl_cpm = reinterpret_cast<int32_t*>(p.gbl_cpm);
    for (int x = threadIdx.x; x < R + N; x += blockDim.x) {
        int acc = 0;
        for (int cc = 0; cc < C; ++cc) {
            acc += static_cast<volatile int32_t*>(scratch)[cc * (R + N) + x];
            if (x < R) gbl_cpm[x * C + cc] = acc;
            else rdma_cpm[(x - R) * C + cc] = acc;
        }
    }
    __syncthreads();

    // ---- slots: build mine for every destination d in my staging, put it into d's slot [me] ----
    const int L = p.num_experts / R;
    const int o_rank = EP_RT_IN_SLOT_HEADER, o_node = o_rank + R, o_ch = o_node + N, o_stream = o_ch + C,
              o_expert = o_stream + C, slot_words = o_expert + L;
    const int32_t* per_expert = reinterpret_cast<const int32_t*>(p.num_tokens_per_expert);
    for (int d = warp; d < R; d += num_warps) {
        int32_t* slot = reinterpret_cast<int32_t*>(in.local(p.lay.notify_send + int64_t(d) * EP_RT_IN_NOTIFY_SLOT_BYTES));
        if (lane == 0) {
            slot[EP_RT_IN_SLOT_HIDDEN_BYTES] = p.hidden_bytes;
            slot[EP_RT_IN_SLOT_NUM_TOPK] = p.num_topk;
            slot[EP_RT_IN_SLOT_NUM_CHANNELS] = C;
            slot[EP_RT_IN_SLOT_NUM_EXPERTS] = p.num_experts;
            slot[EP_RT_IN_SLOT_NUM_SCALES] = p.num_scales;
        }
        for (int r = lane; r < R; r += kWarp) slot[o_rank + r] = gbl_cpm[r * C + C - 1];
        for (int n = lane; n < N; n += kWarp) slot[o_node + n] = rdma_cpm[n * C + C - 1];
        for (int cc = lane; cc < C; cc += kWarp) {
            slot[o_ch + cc] = gbl_cpm[d * C + cc] - (cc > 0 ? gbl_cpm[d * C + cc - 1] : 0);
            const int n = d / G;
            slot[o_stream + cc] = rdma_cpm[n * C + cc] - (cc > 0 ? rdma_cpm[n * C + cc - 1] : 0);
        }
        for (int l = lane; l < L; l += kWarp) slot[o_expert + l] = per_expert != nullptr ? per_expert[d * L + l] : 0;
        __threadfence();
        __syncwarp();
        net_put_signal_warp(in.local(p.lay.notify_recv + int64_t(in.me) * EP_RT_IN_NOTIFY_SLOT_BYTES), slot,
                            size_t(slot_words) * 4, in.word(p.lay.notify_words, in.me), 1, d);
    }

    __syncthreads();
    if (threadIdx.x == 0) net_quiet();  // my slots are delivered (and my staging reusable) before I wait

    // ---- wait for every source's slot ----
    bool ok = true;
    for (int s = threadIdx.x; s < R; s += blockDim.x)
        ok = ok && wait_word(in.word(p.lay.notify_words, s), seq, p.net_timeout_ns, sink, EP_RT_PHASE_IN_NOTIFY, s, -1);
    const bool failed = __syncthreads_or(!ok);
    auto slot_of = [&](int s) {
        return reinterpret_cast<const volatile int32_t*>(in.local(p.lay.notify_recv + int64_t(s) * EP_RT_IN_NOTIFY_SLOT_BYTES));
    };
    if (!failed) {
        for (int s = threadIdx.x; s < R; s += blockDim.x) {
            const volatile int32_t* sl = slot_of(s);
            if (sl[EP_RT_IN_SLOT_HIDDEN_BYTES] != p.hidden_bytes || sl[EP_RT_IN_SLOT_NUM_TOPK] != p.num_topk ||
                sl[EP_RT_IN_SLOT_NUM_CHANNELS] != C || sl[EP_RT_IN_SLOT_NUM_EXPERTS] != p.num_experts ||
                sl[EP_RT_IN_SLOT_NUM_SCALES] != p.num_scales)
                report_error(sink, EP_RT_ERR_MISMATCH, EP_RT_PHASE_IN_NOTIFY, s, -1, sl[EP_RT_IN_SLOT_HIDDEN_BYTES],
                             sl[EP_RT_IN_SLOT_NUM_TOPK]);
        }
    }
    if (__syncthreads_or(failed || error_raised(sink))) return;

    // ---- receive side: [6], [5] (from the counts to me), [3], [4] (from my rail sources' stream counts) ----
    __shared__ int gbl_prefix[EP_RT_IN_MAX_RANKS];
    __shared__ int rdma_prefix[EP_RT_IN_MAX_NODES];
    __shared__ int max_stream_s, max_recv_s, max_fwd_s;
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int s = 0; s < R; ++s) gbl_prefix[s] = (acc += slot_of(s)[o_rank + in.me]);
        acc = 0;
        for (int s = 0; s < N; ++s) rdma_prefix[s] = (acc += slot_of(in.rail(s))[o_node + in.m]);
        max_stream_s = max_recv_s = max_fwd_s = 0;
    }
    __syncthreads();
    int32_t* recv_gbl_prefix = reinterpret_cast<int32_t*>(p.recv_gbl_prefix);
    int32_t* recv_gbl_cpm = reinterpret_cast<int32_t*>(p.recv_gbl_cpm);
    int32_t* recv_rdma_prefix = reinterpret_cast<int32_t*>(p.recv_rdma_prefix);
    int32_t* recv_rdma_cpm = reinterpret_cast<int32_t*>(p.recv_rdma_cpm);
    for (int s = threadIdx.x; s < R; s += blockDim.x) {
        recv_gbl_prefix[s] = gbl_prefix[s];
        int acc = s > 0 ? gbl_prefix[s - 1] : 0;
        const volatile int32_t* sl = slot_of(s);
        for (int cc = 0; cc < C; ++cc) {
            recv_gbl_cpm[s * C + cc] = acc;
            acc += sl[o_ch + cc];
        }
    }
    for (int s = threadIdx.x; s < N; s += blockDim.x) {
        recv_rdma_prefix[s] = rdma_prefix[s];
        const volatile int32_t* sl = slot_of(in.rail(s));
        int acc = 0;
        for (int cc = 0; cc < C; ++cc) recv_rdma_cpm[s * C + cc] = (acc += sl[o_stream + cc]);
    }
    // Global maxima, the same on every rank: the longest (rank -> node) stream, the most rows a rank receives and
    // the most a rank forwards.
    for (int d = threadIdx.x; d < R; d += blockDim.x) {
        int into = 0, fwd = 0, stream = 0;
        for (int s = 0; s < R; ++s) into += slot_of(s)[o_rank + d];
        for (int n = 0; n < N; ++n) fwd += slot_of(n * G + d % G)[o_node + d / G];
        for (int n = 0; n < N; ++n) stream = max(stream, int(slot_of(d)[o_node + n]));
        atomicMax(&max_recv_s, into);
        atomicMax(&max_fwd_s, fwd);
        atomicMax(&max_stream_s, stream);
    }
    __syncthreads();
    const int num_recv = gbl_prefix[R - 1], num_rdma_recv = rdma_prefix[N - 1];
    if (threadIdx.x == 0) {
        // Capacity decisions every rank makes alike: a dispatch that does not fit moves no data (the host raises
        // before launching it, or with num_worst_tokens the error is reported here and the Buffer stays usable).
        // (With the host waiting for the counts, the host raises and nothing more is launched.)
        int skip = 0;
        if (max_stream_s > p.lay.cap) {
            skip = 1;
            if (p.host_token == 0)
                defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_NOTIFY, -1, -1, max_stream_s, p.lay.cap);
        } else if (p.host_token == 0 && (max_recv_s > p.num_out_rows || max_fwd_s > p.num_out_rows)) {
            skip = 1;
            defer_error(in, EP_RT_ERR_WORST_TOKENS, EP_RT_PHASE_IN_NOTIFY, -1, -1, max(max_recv_s, max_fwd_s),
                        p.num_out_rows);
        }
        in.ws[EP_RT_IN_WS_SKIP] = skip;
    }
    if (p.host_token != 0) {
        volatile int32_t* host = reinterpret_cast<volatile int32_t*>(p.host_counters);
        const int a = p.expert_alignment;
        for (int l = threadIdx.x; l < L; l += blockDim.x) {
            int sum = 0;
            for (int s = 0; s < R; ++s) sum += slot_of(s)[o_expert + l];
            host[EP_RT_IN_HOST_EXPERT_COUNTS + l] = (sum + a - 1) / a * a;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            host[EP_RT_IN_HOST_NUM_RECV] = num_recv;
            host[EP_RT_IN_HOST_NUM_RDMA_RECV] = num_rdma_recv;
            host[EP_RT_IN_HOST_MAX_STREAM] = max_stream_s;
            host[EP_RT_IN_HOST_MAX_RECV] = max_recv_s;
            host[EP_RT_IN_HOST_MAX_FWD] = max_fwd_s;
            __threadfence_system();
            host[EP_RT_IN_HOST_TOKEN] = int32_t(p.host_token & 0x7fffffff);
            __threadfence_system();
        }
    }
    __syncthreads();
    advance(in, EP_RT_IN_WS_NOTIFY, seq);
}

// ------------------------------------------------------------------------------------------------
// Send (grid C): block c writes a record of each of its channel's tokens for each node the token reaches, at the
// token's stream position, then puts each node's contiguous range to my rail peer there (one put-with-signal per
// (channel, node), a bare signal for an empty range). Records for my own node go straight into my receive area.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_send(const InternodeParams p) {
    const In in(p);
    const int R = in.R, N = in.N, C = in.C, G = in.G, c = blockIdx.x;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, num_warps = blockDim.x / kWarp;
    if (p.cached &&
        !all_to_all_handshake(in, p.lay.cached_words, in.seq(EP_RT_IN_WS_CACHED), c == 0, EP_RT_PHASE_IN_HANDSHAKE))
        return;
    const bool skip = !p.cached && *reinterpret_cast<volatile int64_t*>(in.ws + EP_RT_IN_WS_SKIP) != 0;
    const int32_t* rdma_cpm = reinterpret_cast<const int32_t*>(p.rdma_cpm);
    const int32_t* rdma_head = reinterpret_cast<const int32_t*>(p.send_rdma_head);
    const bool* in_rank = reinterpret_cast<const bool*>(p.is_token_in_rank);
    const Rec rec(p.hidden_bytes, p.num_scales, p.num_topk);
    const int S = p.num_scales, K = p.num_topk;
    const TopkIdx topk_idx(p.topk_idx, p.topk_idx_bits);
    const float* topk_weights = reinterpret_cast<const float*>(p.topk_weights);
    const int32_t* x_scales = reinterpret_cast<const int32_t*>(p.x_scales);

    int begin, end;
    channel_range(p.num_tokens, C, c, begin, end);
    if (!skip) {
        for (int t = begin + warp; t < end; t += num_warps) {
            const int32_t* head = rdma_head + int64_t(t) * N;
            const bool* row = in_rank + int64_t(t) * R;
            for (int n = 0; n < N; ++n) {
                const int pos = head[n];
                if (pos < 0) continue;
                const int64_t stream_pos = pos + (c > 0 ? rdma_cpm[n * C + c - 1] : 0);
                if (stream_pos >= p.lay.cap) {  // only a cached dispatch from a handle without facts gets here
                    if (lane == 0)
                        defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_NOTIFY, -1, c, stream_pos + 1,
                                    p.lay.cap);
                    continue;
                }
                uint8_t* r = in.record(n == in.m ? p.lay.recv : p.lay.stage, n, stream_pos);
                warp_copy<Src::kInput>(r, reinterpret_cast<const uint8_t*>(p.x) + int64_t(t) * p.hidden_bytes,
                                       p.hidden_bytes, lane);
                for (int i = lane; i < S; i += kWarp)
                    reinterpret_cast<int32_t*>(r + rec.scales)[i] =
                        x_scales[int64_t(t) * p.scale_token_stride + int64_t(i) * p.scale_hidden_stride];
                for (int k = lane; k < K; k += kWarp) {
                    const int64_t e = topk_idx[int64_t(t) * K + k];
                    reinterpret_cast<int32_t*>(r + rec.idx)[k] = e >= 0 ? int32_t(e) : -1;
                    reinterpret_cast<float*>(r + rec.weights)[k] =
                        topk_weights != nullptr ? topk_weights[int64_t(t) * K + k] : 0.0f;
                }
                if (lane == 0) {
                    int mask = 0;
                    for (int l = 0; l < G; ++l) mask |= row[n * G + l] ? (1 << l) : 0;
                    reinterpret_cast<int32_t*>(r + rec.meta)[0] = t;
                    reinterpret_cast<int32_t*>(r + rec.meta)[1] = mask;
                }
            }
        }
    }
    __threadfence();
    __syncthreads();
    // One put (or bare signal) per other node, starting from a different node per (rank, channel) against incast.
    for (int k = 0; k < N; ++k) {
        const int n = (in.m + 1 + k + c) % N;
        if (n == in.m) continue;
        const int first = c > 0 ? rdma_cpm[n * C + c - 1] : 0;
        const int count = skip ? 0 : max(0, min(rdma_cpm[n * C + c], int(p.lay.cap)) - first);
        uint64_t* sig = in.word(p.lay.dispatch_words, in.m * EP_RT_MAX_CHANNELS + c);
        if (count > 0) {
            net_put_signal_block(in.record(p.lay.recv, in.m, first), in.record(p.lay.stage, n, first),
                                 size_t(count) * p.lay.record_bytes, sig, 1, in.rail(n));
        } else if (threadIdx.x == 0) {
            net_signal_add(sig, 1, in.rail(n));
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) net_quiet();  // my staging is reusable, and every put of this call is delivered
}

// ------------------------------------------------------------------------------------------------
// Forward (grid N, one block per source node s): as the rail peer of node s's rank with my local index, wait for
// each channel's word, record where that block's tokens go inside my node (send_nvl_head), publish my
// recv_rdma_channel_prefix_matrix, and relay "block (s, c) is here" to my node with an NVLink-visible flag.
extern "C" __global__ void __launch_bounds__(128) ep_rt_internode_forward(const InternodeParams p) {
    const In in(p);
    const int C = in.C, G = in.G, s = blockIdx.x;
    const int lane = threadIdx.x % kWarp;
    const int64_t seq = in.seq(EP_RT_IN_WS_DISPATCH);
    const ErrorSink sink = in.sink();
    const int32_t* recv_rdma_cpm = reinterpret_cast<const int32_t*>(p.recv_rdma_cpm);
    const int32_t* recv_rdma_prefix = reinterpret_cast<const int32_t*>(p.recv_rdma_prefix);
    int32_t* nvl_head = reinterpret_cast<int32_t*>(p.send_nvl_head);
    int32_t* published = reinterpret_cast<int32_t*>(in.local(p.lay.relay_prefix));
    const bool skip = !p.cached && *reinterpret_cast<volatile int64_t*>(in.ws + EP_RT_IN_WS_SKIP) != 0;
    const Rec rec(p.hidden_bytes, p.num_scales, p.num_topk);
    const int row_base = s > 0 ? recv_rdma_prefix[s - 1] : 0;

    for (int cc = threadIdx.x; cc < C; cc += blockDim.x)
        published[s * EP_RT_MAX_CHANNELS + cc] = recv_rdma_cpm[s * C + cc];
    int running = 0;  // per local rank l = lane < G: tokens of this source already sent to rank (my node, l)
    for (int cc = 0; cc < C; ++cc) {
        if (s != in.m && threadIdx.x == 0)
            wait_next(in.word(p.lay.dispatch_words, s * EP_RT_MAX_CHANNELS + cc),
                      reinterpret_cast<int64_t*>(p.consumed) + s * EP_RT_MAX_CHANNELS + cc, p.net_timeout_ns, sink,
                      EP_RT_PHASE_IN_FORWARD, in.rail(s), cc);
        if (__syncthreads_or(error_raised(sink))) return;
        const int first = cc > 0 ? recv_rdma_cpm[s * C + cc - 1] : 0;
        const int last = min(recv_rdma_cpm[s * C + cc], int(p.lay.cap));  // (capacity: reported by the sender)
        if (!p.cached && !skip && threadIdx.x < kWarp) {  // one warp walks the block in order
            for (int i0 = first; i0 < last; i0 += kWarp) {
                const int i = i0 + lane;
                const int mask = i < last ? reinterpret_cast<const volatile int32_t*>(in.record(p.lay.recv, s, i) + rec.meta)[1] : 0;
                for (int l = 0; l < G; ++l) {
                    const bool bit = (mask >> l) & 1;
                    const unsigned ballot = __ballot_sync(0xffffffffu, bit);
                    const int before = __popc(ballot & ((1u << lane) - 1u));
                    const int base = __shfl_sync(0xffffffffu, running, l);
                    if (i < last && row_base + i < p.num_fwd_rows)
                        nvl_head[int64_t(row_base + i) * G + l] = bit ? base + before : -1;
                    if (lane == l) running += __popc(ballot);
                }
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system();
            st_release_sys(reinterpret_cast<int64_t*>(in.local(p.lay.relay)) + s * EP_RT_MAX_CHANNELS + cc, seq);
        }
    }
    // num_worst_tokens: rows of send_nvl_head past the real ones carry no destination.
    if (p.fill_unused && s == 0) {
        const int num_rdma_recv = recv_rdma_prefix[in.N - 1];
        for (int64_t i = int64_t(num_rdma_recv) * G + threadIdx.x; i < int64_t(p.num_fwd_rows) * G; i += blockDim.x)
            nvl_head[i] = -1;
    }
}

// ------------------------------------------------------------------------------------------------
// Receive (grid C): block c copies, for every source rank src, the tokens of src's channel c that are for me, from
// the receive area of src's forwarder on my node (over NVLink), into my outputs at their final rows.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_recv(const InternodeParams p) {
    const In in(p);
    const int R = in.R, C = in.C, G = in.G, c = blockIdx.x;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, num_warps = blockDim.x / kWarp;
    const int64_t seq = in.seq(EP_RT_IN_WS_DISPATCH);
    const ErrorSink sink = in.sink();
    const int32_t* recv_gbl_cpm = reinterpret_cast<const int32_t*>(p.recv_gbl_cpm);
    const bool skip = !p.cached && *reinterpret_cast<volatile int64_t*>(in.ws + EP_RT_IN_WS_SKIP) != 0;
    const Rec rec(p.hidden_bytes, p.num_scales, p.num_topk);
    const int S = p.num_scales, K = p.num_topk, L = p.num_experts / R;
    __shared__ int warp_counts[32];

    for (int src = 0; src < R; ++src) {
        const int s = src / G, f = in.m * G + src % G;
        if (threadIdx.x == 0)
            wait_flag(reinterpret_cast<const int64_t*>(in.on_peer(f, p.lay.relay)) + s * EP_RT_MAX_CHANNELS + c, seq,
                      p.net_timeout_ns, sink, EP_RT_PHASE_IN_RECV, f, c);
        if (__syncthreads_or(error_raised(sink))) return;
        if (skip) continue;
        const volatile int32_t* fprefix = reinterpret_cast<const volatile int32_t*>(in.on_peer(f, p.lay.relay_prefix));
        const int first = c > 0 ? fprefix[s * EP_RT_MAX_CHANNELS + c - 1] : 0;
        const int last = min(int(fprefix[s * EP_RT_MAX_CHANNELS + c]), int(p.lay.cap));
        const uint8_t* area = in.on_peer(f, p.lay.recv) + int64_t(s) * p.lay.cap * p.lay.record_bytes;
        int row = recv_gbl_cpm[src * C + c];  // my first row of block (src, c)
        // Tiles of blockDim records: each warp ballots its 32, a block scan gives each warp its first row.
        for (int i0 = first; i0 < last; i0 += blockDim.x) {
            const int i = i0 + threadIdx.x;
            const uint8_t* r = area + int64_t(i) * p.lay.record_bytes;
            const int mask = i < last ? ld_peer_written_b32(reinterpret_cast<const int32_t*>(r + rec.meta) + 1) : 0;
            const bool mine = (mask >> in.j) & 1;
            const unsigned ballot = __ballot_sync(0xffffffffu, mine);
            if (lane == 0) warp_counts[warp] = __popc(ballot);
            __syncthreads();
            int before = 0, total = 0;
            for (int w = 0; w < num_warps; ++w) {
                before += w < warp ? warp_counts[w] : 0;
                total += warp_counts[w];
            }
            // Each warp copies its selected records one after another.
            unsigned todo = ballot;
            int out = row + before;
            while (todo) {
                const int src_lane = __ffs(todo) - 1;
                todo &= todo - 1;
                const uint8_t* rr = area + int64_t(i0 + warp * kWarp + src_lane) * p.lay.record_bytes;
                if (out < p.num_out_rows) {
                    warp_copy<Src::kPeerWritten>(reinterpret_cast<uint8_t*>(p.recv_x) + int64_t(out) * p.hidden_bytes,
                                                 rr, p.hidden_bytes, lane);
                    for (int q = lane; q < S; q += kWarp)
                        reinterpret_cast<int32_t*>(p.recv_x_scales)[int64_t(out) * S + q] =
                            ld_peer_written_b32(reinterpret_cast<const int32_t*>(rr + rec.scales) + q);
                    if (p.recv_topk_idx) {
                        for (int k = lane; k < K; k += kWarp) {
                            const int e = ld_peer_written_b32(reinterpret_cast<const int32_t*>(rr + rec.idx) + k);
                            const bool local = e >= in.me * L && e < (in.me + 1) * L;
                            store_topk_idx(p.recv_topk_idx, p.recv_topk_idx_bits, int64_t(out) * K + k,
                                           local ? e - in.me * L : -1);
                            const float w = __int_as_float(
                                ld_peer_written_b32(reinterpret_cast<const int32_t*>(rr + rec.weights) + k));
                            if (p.recv_topk_weights)
                                reinterpret_cast<float*>(p.recv_topk_weights)[int64_t(out) * K + k] = local ? w : 0.0f;
                        }
                    }
                    if (p.recv_src_meta && lane == 0) {
                        int32_t* meta = reinterpret_cast<int32_t*>(p.recv_src_meta + int64_t(out) * 8);
                        meta[0] = s;
                        meta[1] = ld_peer_written_b32(reinterpret_cast<const int32_t*>(rr + rec.meta) + 1);
                    }
                }
                ++out;
            }
            row += total;
            __syncthreads();  // warp_counts is reused
        }
    }
    // num_worst_tokens: rows past the real count carry no expert.
    if (p.fill_unused && p.recv_topk_idx) {
        const int num_recv = reinterpret_cast<const int32_t*>(p.recv_gbl_prefix)[R - 1];
        for (int64_t i = int64_t(num_recv) * K + int64_t(c) * blockDim.x + threadIdx.x;
             i < int64_t(p.num_out_rows) * K; i += int64_t(C) * blockDim.x)
            store_topk_idx(p.recv_topk_idx, p.recv_topk_idx_bits, i, -1);
    }
    if (!last_block(in.ws + EP_RT_IN_WS_TICKET + 1)) return;
    if (p.cached) advance(in, EP_RT_IN_WS_CACHED, in.seq(EP_RT_IN_WS_CACHED));
    advance(in, EP_RT_IN_WS_DISPATCH, seq);
    report_deferred(in);
}

// ------------------------------------------------------------------------------------------------
// Combine publish (grid C): after a handshake with every rank (the previous call's readers are done), copy my rows
// (and weights) into my NVL buffer, then publish my recv_gbl_rank_prefix_sum and a ready flag for my node.
// NVL row layout: bf16 row (2H bytes) then K f32 weights, per row, 16-aligned.
__device__ __forceinline__ int64_t combine_row_bytes(const InternodeParams& p) {
    return align16(int64_t(p.hidden_bytes) + 4 * int64_t(p.num_topk));
}

extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_combine_publish(const InternodeParams p) {
    const In in(p);
    const int R = in.R, c = blockIdx.x;
    const int64_t seq = in.seq(EP_RT_IN_WS_COMBINE);
    if (!all_to_all_handshake(in, p.lay.combine_hs, seq, c == 0, EP_RT_PHASE_IN_COMBINE_HANDSHAKE)) return;
    const int num_recv = reinterpret_cast<const int32_t*>(p.recv_gbl_prefix)[R - 1];
    const int64_t row_bytes = combine_row_bytes(p);
    const int K = p.num_topk;
    uint8_t* nvl = reinterpret_cast<uint8_t*>(p.nvl_peers[in.j]);
    if (num_recv <= p.nvl_capacity_rows) {
        const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, num_warps = blockDim.x / kWarp;
        for (int i = c * num_warps + warp; i < num_recv; i += gridDim.x * num_warps) {
            uint8_t* dst = nvl + int64_t(i) * row_bytes;
            warp_copy<Src::kInput>(dst, reinterpret_cast<const uint8_t*>(p.x) + int64_t(i) * p.hidden_bytes,
                                   p.hidden_bytes, lane);
            if (p.topk_weights)
                for (int k = lane; k < K; k += kWarp)
                    reinterpret_cast<float*>(dst + p.hidden_bytes)[k] =
                        reinterpret_cast<const float*>(p.topk_weights)[int64_t(i) * K + k];
        }
    } else if (c == 0 && threadIdx.x == 0) {  // the host checks this first; here for handles without facts
        defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_COMBINE_HANDSHAKE, in.me, -1, num_recv,
                    p.nvl_capacity_rows);
    }
    if (!last_block(in.ws + EP_RT_IN_WS_TICKET + 2)) return;
    int32_t* pub = reinterpret_cast<int32_t*>(in.local(p.lay.ready_prefix));
    for (int s = threadIdx.x; s < R; s += blockDim.x) pub[s] = reinterpret_cast<const int32_t*>(p.recv_gbl_prefix)[s];
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        st_release_sys(reinterpret_cast<int64_t*>(in.local(p.lay.ready)), seq);
    }
}

// ------------------------------------------------------------------------------------------------
// Combine forward (grid C): for each source node s and channel c, every token I forwarded in dispatch: sum its rows
// on my node's ranks (local rank ascending, f32) -> bf16 (the first rounding), weights in f32, at its stream
// position; put each (s, c) range back to the source (my rail peer on node s), or write it in place for my node.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_combine_forward(const InternodeParams p) {
    const In in(p);
    const int N = in.N, C = in.C, G = in.G, c = blockIdx.x;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, num_warps = blockDim.x / kWarp;
    const int64_t seq = in.seq(EP_RT_IN_WS_COMBINE);
    const ErrorSink sink = in.sink();
    const int32_t* recv_rdma_cpm = reinterpret_cast<const int32_t*>(p.recv_rdma_cpm);
    const int32_t* recv_rdma_prefix = reinterpret_cast<const int32_t*>(p.recv_rdma_prefix);
    const int32_t* nvl_head = reinterpret_cast<const int32_t*>(p.send_nvl_head);
    const int64_t row_bytes = combine_row_bytes(p);
    const int H = p.hidden_bytes / 2, K = p.num_topk, hidden_int4 = H / 8;

    // The rows of every rank of my node are in its NVL buffer, with its receive prefix published.
    __shared__ int prefix[EP_RT_MAX_NVL_RANKS][EP_RT_IN_MAX_NODES];  // [l][s]: rows rank (m, l) got from ranks < s*G+j
    bool ok = true;
    if (threadIdx.x < G)
        ok = wait_flag(reinterpret_cast<const int64_t*>(in.on_peer(in.m * G + threadIdx.x, p.lay.ready)), seq,
                       p.net_timeout_ns, sink, EP_RT_PHASE_IN_COMBINE_FORWARD, in.m * G + threadIdx.x, c);
    if (__syncthreads_or(!ok)) return;
    for (int q = threadIdx.x; q < G * N; q += blockDim.x) {
        const int l = q / N, s = q % N, src = s * G + in.j;
        const volatile int32_t* pub = reinterpret_cast<const volatile int32_t*>(in.on_peer(in.m * G + l, p.lay.ready_prefix));
        prefix[l][s] = src > 0 ? pub[src - 1] : 0;
    }
    __syncthreads();

    for (int k = 0; k < N; ++k) {
        const int s = (in.m + 1 + k + c) % N;
        const int cap = int(p.lay.cap);
        const int first = min(c > 0 ? recv_rdma_cpm[s * C + c - 1] : 0, cap);
        const int last = min(recv_rdma_cpm[s * C + c], cap);
        if (recv_rdma_cpm[s * C + c] > cap && threadIdx.x == 0)  // only a handle without facts gets here
            defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_COMBINE_FORWARD, -1, c, recv_rdma_cpm[s * C + c], cap);
        const int row_base = s > 0 ? recv_rdma_prefix[s - 1] : 0;
        const int64_t area = s == in.m ? p.lay.recv : p.lay.stage;
        for (int i = first + warp; i < last; i += num_warps) {
            const int32_t* head = nvl_head + int64_t(row_base + i) * G;
            uint8_t* out = in.record(area, s, i);
            const uint8_t* rows[EP_RT_MAX_NVL_RANKS];
#pragma unroll
            for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l) {
                const int q = l < G ? head[l] : -1;
                // (rows past the NVL capacity were never published: only a handle without facts gets there,
                // and its publish kernel defers the error)
                rows[l] = q >= 0 && prefix[l][s] + q < p.nvl_capacity_rows
                              ? reinterpret_cast<const uint8_t*>(p.nvl_peers[l]) + int64_t(prefix[l][s] + q) * row_bytes
                              : nullptr;
            }
            for (int v = lane; v < hidden_int4; v += kWarp) {
                float acc[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
#pragma unroll
                for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l) {
                    if (rows[l] == nullptr) continue;
                    const int4 w = ld_peer_written_v4(reinterpret_cast<const int4*>(rows[l]) + v);
                    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&w);
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[e] += __bfloat162float(h[e]);
                }
                int4 packed;
                __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
                for (int e = 0; e < 8; ++e) h[e] = __float2bfloat16_rn(acc[e]);
                reinterpret_cast<int4*>(out)[v] = packed;
            }
            for (int kk = lane; kk < K; kk += kWarp) {
                float acc = 0.0f;
#pragma unroll
                for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l)
                    if (rows[l] != nullptr)
                        acc += __int_as_float(ld_peer_written_b32(reinterpret_cast<const int32_t*>(rows[l] + p.hidden_bytes) + kk));
                reinterpret_cast<float*>(out + p.hidden_bytes)[kk] = acc;
            }
        }
        __threadfence();
        __syncthreads();
        if (s == in.m) continue;  // my own node's partials stay here for my reduce kernel
        uint64_t* sig = in.word(p.lay.combine_words, in.m * EP_RT_MAX_CHANNELS + c);
        if (last > first)
            net_put_signal_block(in.record(p.lay.recv, in.m, first), in.record(p.lay.stage, s, first),
                                 size_t(last - first) * p.lay.record_bytes, sig, 1, in.rail(s));
        else if (threadIdx.x == 0)
            net_signal_add(sig, 1, in.rail(s));
    }
    __syncthreads();
    if (threadIdx.x == 0) net_quiet();
}

// ------------------------------------------------------------------------------------------------
// Combine reduce (grid C): my tokens of channel c, once every node's partials for this channel are here: bias
// first, then nodes ascending, in f32 -> bf16; weights the same in f32.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_combine_reduce(const InternodeParams p) {
    const In in(p);
    const int N = in.N, C = in.C, c = blockIdx.x;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, num_warps = blockDim.x / kWarp;
    const int64_t seq = in.seq(EP_RT_IN_WS_COMBINE);
    const ErrorSink sink = in.sink();
    const int32_t* rdma_cpm = reinterpret_cast<const int32_t*>(p.rdma_cpm);
    const int32_t* rdma_head = reinterpret_cast<const int32_t*>(p.send_rdma_head);
    const int H = p.hidden_bytes / 2, K = p.num_topk, hidden_int4 = H / 8;

    bool ok = true;
    for (int n = threadIdx.x; n < N; n += blockDim.x)
        if (n != in.m)
            ok = ok && wait_next(in.word(p.lay.combine_words, n * EP_RT_MAX_CHANNELS + c),
                                 reinterpret_cast<int64_t*>(p.consumed) + (EP_RT_IN_MAX_NODES + n) * EP_RT_MAX_CHANNELS + c,
                                 p.net_timeout_ns, sink, EP_RT_PHASE_IN_COMBINE_REDUCE, in.rail(n), c);
    if (__syncthreads_or(!ok || error_raised(sink))) return;

    int begin, end;
    channel_range(p.num_tokens, C, c, begin, end);
    for (int t = begin + warp; t < end; t += num_warps) {
        const int32_t* head = rdma_head + int64_t(t) * N;
        const int4* b0 = p.bias0 ? reinterpret_cast<const int4*>(p.bias0) + int64_t(t) * hidden_int4 : nullptr;
        const int4* b1 = p.bias1 ? reinterpret_cast<const int4*>(p.bias1) + int64_t(t) * hidden_int4 : nullptr;
        for (int v = lane; v < hidden_int4; v += kWarp) {
            float acc[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
            auto add = [&](const int4& w) {
                const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&w);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] += __bfloat162float(h[e]);
            };
            if (b0) add(ld_input_v4(b0 + v));
            if (b1) add(ld_input_v4(b1 + v));
            for (int n = 0; n < N; ++n) {
                const int pos = head[n];
                const int64_t at = pos + (c > 0 ? rdma_cpm[n * C + c - 1] : 0);
                if (pos < 0 || at >= p.lay.cap) continue;  // (past cap: dropped by the forwarder, which reports it)
                add(ld_peer_written_v4(reinterpret_cast<const int4*>(in.record(p.lay.recv, n, at)) + v));
            }
            int4 packed;
            __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
            for (int e = 0; e < 8; ++e) h[e] = __float2bfloat16_rn(acc[e]);
            st_na_v4(reinterpret_cast<int4*>(p.combined_x) + int64_t(t) * hidden_int4 + v, packed);
        }
        if (p.combined_topk_weights) {
            for (int k = lane; k < K; k += kWarp) {
                float w = 0.0f;
                for (int n = 0; n < N; ++n) {
                    const int pos = head[n];
                    const int64_t at = pos + (c > 0 ? rdma_cpm[n * C + c - 1] : 0);
                    if (pos < 0 || at >= p.lay.cap) continue;
                    const uint8_t* r = in.record(p.lay.recv, n, at);
                    w += __int_as_float(ld_peer_written_b32(reinterpret_cast<const int32_t*>(r + p.hidden_bytes) + k));
                }
                reinterpret_cast<float*>(p.combined_topk_weights)[int64_t(t) * K + k] = w;
            }
        }
    }
    if (!last_block(in.ws + EP_RT_IN_WS_TICKET + 3)) return;
    advance(in, EP_RT_IN_WS_COMBINE, seq);
    report_deferred(in);
}

// ------------------------------------------------------------------------------------------------
// Barrier of all ranks (one block), with the network deadline: before the collective NVSHMEM teardown, so that it
// is entered only once every peer is known to be there.
extern "C" __global__ void __launch_bounds__(256) ep_rt_internode_barrier(const InternodeParams p) {
    const In in(p);
    const int64_t seq = in.seq(EP_RT_IN_WS_BARRIER);
    if (!all_to_all_handshake(in, p.lay.barrier_words, seq, true, EP_RT_PHASE_BARRIER)) return;
    advance(in, EP_RT_IN_WS_BARRIER, seq);
}
