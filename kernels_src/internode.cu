// ep_rt-build: nvshmem min_arch=sm_90 variants=safe,aggressive,chaos
//
// Internode high-throughput dispatch and combine (several nodes: NVSHMEM between nodes, NVLink inside one).
//
// Design (docs/INTERNODE_DESIGN.md): once counts are exchanged every token's place is known, so nothing is a ring.
// A token of rank src travels once to each node n it reaches (hop 1: a put from src's staging area to the
// receive area [src's node][stream position] of its rail peer f = n * G + src % G); f reads its own receive area
// and pushes each record over NVLink into the NVL buffer of every rank of node n it is for, at its final row
// (hop 2), and each rank copies its rows from its own NVL buffer into its outputs. Combine mirrors it: every rank
// copies its rows into its NVL buffer, the forwarder sums a token's rows of its node (f32 -> bf16) and puts the
// partial back to the source, which sums bias and nodes in f32.
//
// The network rules (include/ep_rt/net.cuh): the network carries only rail traffic (each rank talks to its rail
// peers, PE pe_base + node * pe_stride, never to itself or a node peer, which it reaches through the NVL buffers);
// a NIC-written byte is read only by the GPU that owns it (no kernel gets a mapping of another rank's symmetric
// buffer); data-before-flag only from put-with-signal; no quiet, no fence. Sources are reused on evidence of
// receipt: every call starts with an all-to-all (the notify, or a handshake) that each rank enters only after its
// previous call's kernels ended, and every rank's previous call waited, through the forwarders, for everything
// every other rank sent it; so when a rank rewrites a staging area, its last contents have arrived.
//
// Each call is a few kernels on one stream. A kernel waits only for other ranks' kernels (or earlier kernels of its
// own rank), never for a later kernel of its own rank, so no residency is assumed. Network signals: put-with-signal
// (SIGNAL_ADD) and signal ops (ADD); one word per (sender, chunk) and call, waited for its exact count; no NVSHMEM
// barrier or collective in a kernel. Call numbers live in device memory (workspace), so every kernel here can be
// captured in a CUDA graph.
#include <cuda_bf16.h>

#include "ep_rt/copy.cuh"
#include "ep_rt/grid.cuh"
#include "ep_rt/net.cuh"
#include "ep_rt/params.h"
#include "ep_rt/ptx.cuh"
#include "ep_rt/sync.cuh"
#include "ep_rt/topk.cuh"

using namespace ep_rt;

namespace {

struct In {
    const InternodeParams& p;
    int me, R, G, N, C, m, j;
    int64_t* ws;

    __device__ In(const InternodeParams& params) : p(params) {
        me = p.rank, R = p.num_ranks, G = p.ranks_per_node, N = p.num_nodes, C = p.num_channels;
        m = me / G, j = me % G;
        ws = reinterpret_cast<int64_t*>(p.workspace);
    }
    __device__ ErrorSink sink() const {
        return ErrorSink{p.error, reinterpret_cast<int32_t*>(ws + EP_RT_IN_WS_CLAIM), me};
    }
    // A word of my node (or of my own earlier kernel) is set after its writer's own waits on the network, so its
    // deadline is twice the network's: when a node dies, the wait for the rails fails first and names it, not a
    // live rank of my node that waited for the same node.
    __device__ int64_t node_timeout_ns() const { return 2 * p.net_timeout_ns; }
    __device__ int64_t seq(int kind) const { return *reinterpret_cast<volatile int64_t*>(ws + kind) + 1; }
    // My symmetric buffer (the network writes into it; only I read it).
    __device__ uint8_t* local(int64_t off) const { return reinterpret_cast<uint8_t*>(p.sym_base + off); }
    __device__ uint64_t* word(int64_t region, int index) const {
        return reinterpret_cast<uint64_t*>(local(region)) + index;
    }
    __device__ uint8_t* record(int64_t area, int node, int64_t pos) const {
        return local(area) + (int64_t(node) * p.lay.cap + pos) * p.lay.record_bytes;
    }
    // The internode NVL area of local rank l of my node (l == j: mine), through its NVLink (IPC) mapping.
    __device__ uint8_t* nvl(int l, int64_t off) const { return reinterpret_cast<uint8_t*>(p.nvl_peers[l] + off); }
    __device__ int64_t* nvl_word(int l, int64_t off, int index) const {
        return reinterpret_cast<int64_t*>(nvl(l, off)) + index;
    }
    // My rail peer on node n: its rank, and its NVSHMEM PE.
    __device__ int rail(int node) const { return node * G + j; }
    __device__ int pe(int node) const { return p.pe_base + node * p.pe_stride; }
};

__device__ __forceinline__ int64_t align16(int64_t v) { return (v + 15) / 16 * 16; }

// A stream of `count` entries goes in stream_chunks(count) put-with-signals (params.h EP_RT_IN_STREAM_CHUNKS);
// chunk k covers [chunk_begin(count, n, k), chunk_begin(count, n, k + 1)).
__device__ __forceinline__ int stream_chunks(int count) { return count <= 0 ? 1 : min(count, EP_RT_IN_STREAM_CHUNKS); }
__device__ __forceinline__ int chunk_begin(int count, int chunks, int k) {
    return int(int64_t(max(count, 0)) * k / chunks);
}
// The signal word (and consumed count) of chunk k of stream (node, channel): one per chunk (params.h).
__device__ __forceinline__ int chunk_word(int node, int channel, int k) {
    return (node * EP_RT_MAX_CHANNELS + channel) * EP_RT_IN_STREAM_CHUNKS + k;
}
constexpr int kCombineConsumed = EP_RT_IN_MAX_NODES * EP_RT_MAX_CHANNELS * EP_RT_IN_STREAM_CHUNKS;

// My own node's entries of channel c are written (call number seq): a local flag from the kernel that wrote them
// to the next one, which may already run (programmatic dependent launch). kind 0: dispatch records, 1: combine
// partial sums.
__device__ __forceinline__ int64_t* own_ready(const InternodeParams& p, int kind, int c) {
    return reinterpret_cast<int64_t*>(p.sym_base + p.lay.own_ready) + kind * EP_RT_MAX_CHANNELS + c;
}

// The kernel after this one on the stream may start now (it waits for what it needs through flags); a no-op for an
// ordinary launch.
__device__ __forceinline__ void allow_next_kernel_to_start() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

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

// Notify slots (int32 words, params.h): the header, rank totals [R], node totals [N], stream counts [C], then per
// local rank of the destination node (network slot: G of them; relayed slot: one) channel counts [C] and expert
// counts [L].
struct Slot {
    int tot, node, stream, per, per_words, relayed_words, net_words;
    __device__ Slot(int R, int N, int C, int G, int L) {
        tot = EP_RT_IN_SLOT_HEADER, node = tot + R, stream = node + N, per = stream + C, per_words = C + L;
        relayed_words = per + per_words;
        net_words = per + G * per_words;
    }
};

// A signal word the network writes, waited for at least `seq` (one ADD per call: the exact count of this call).
__device__ __noinline__ bool wait_word(const uint64_t* w, int64_t seq, int64_t timeout_ns, const ErrorSink& sink,
                                       int phase, int peer, int channel) {
    const uint64_t start = globaltimer_ns();
    int spins = 0;
    while (true) {
        const int64_t v = int64_t(net_signal_load(w));
        if (v - seq >= 0) return true;
        if (++spins == 64) {
            spins = 0;
            if (int64_t(globaltimer_ns() - start) > timeout_ns) {
                report_error(sink, EP_RT_ERR_TIMEOUT, phase, peer, channel, seq, v);
                return false;
            }
            if (error_raised(sink)) return false;
        }
    }
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

// One thread: publish `seq` in an NVL word of my node (after this block's stores, which it announces).
__device__ __forceinline__ void release_nvl(int64_t* flag, int64_t seq) {
    __threadfence_system();
    st_release_sys(flag, seq);
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
// Words EP_RT_IN_WS_DEFERRED..+2: code | phase << 8 | (peer + 1) << 16 | (channel + 1) << 40, detail0, detail1.
static_assert(EP_RT_IN_WS_DEFERRED + 3 <= EP_RT_IN_WS_WORDS, "the workspace holds the deferred error");

__device__ __forceinline__ void defer_error(const In& in, int code, int phase, int peer, int channel, int64_t detail0,
                                            int64_t detail1) {
    const unsigned long long word = (unsigned long long)code | ((unsigned long long)phase << 8) |
                                    ((unsigned long long)(peer + 1) << 16) | ((unsigned long long)(channel + 1) << 40);
    if (atomicCAS(reinterpret_cast<unsigned long long*>(in.ws + EP_RT_IN_WS_DEFERRED), 0ull, word) == 0ull) {
        reinterpret_cast<volatile int64_t*>(in.ws)[EP_RT_IN_WS_DEFERRED + 1] = detail0;
        reinterpret_cast<volatile int64_t*>(in.ws)[EP_RT_IN_WS_DEFERRED + 2] = detail1;
    }
}

// In the last block of a call's last kernel, after its waits: report the deferred error, if any.
__device__ __forceinline__ void report_deferred(const In& in) {
    volatile int64_t* w = reinterpret_cast<volatile int64_t*>(in.ws) + EP_RT_IN_WS_DEFERRED;
    if (threadIdx.x != 0 || w[0] == 0) return;
    const uint64_t word = uint64_t(w[0]);
    report_error(in.sink(), int(word & 0xff), int((word >> 8) & 0xff), int((word >> 16) & 0xffffff) - 1,
                 int((word >> 40) & 0xffff) - 1, w[1], w[2]);
    w[0] = 0;
}

// Every rank has entered this call of `kind` (numbered seq): first the rails (block 0 signals my rail peer on every
// other node and waits for theirs over the network), then the node (block 0 tells every rank of my node, itself
// included, through its NVL word; every block waits for the G words of my node). A node peer's word comes after
// its own rail wait, so after the G words every rank of every node is known to have entered. Every block calls it.
__device__ bool handshake(const In& in, int kind, int64_t seq, int phase) {
    const int64_t hs_net = in.p.lay.hs_words + int64_t(kind) * in.N * 8;
    const int64_t hs_nvl = in.p.nvl.hs + int64_t(kind) * EP_RT_MAX_NVL_RANKS * 8;
    bool ok = true;
    if (blockIdx.x == 0) {
        for (int n = threadIdx.x; n < in.N; n += blockDim.x)
            if (n != in.m) net_signal_add(in.word(hs_net, in.m), 1, in.pe(n));
        __syncthreads();
        if (threadIdx.x == 0) net_flush();  // delivered before we wait for the replies (net.cuh's rule)
        for (int n = threadIdx.x; n < in.N; n += blockDim.x)
            if (n != in.m)
                ok = ok && wait_word(in.word(hs_net, n), seq, in.p.net_timeout_ns, in.sink(), phase, in.rail(n), -1);
        if (__syncthreads_or(!ok)) return false;
        if (threadIdx.x < in.G) release_nvl(in.nvl_word(threadIdx.x, hs_nvl, in.j), seq);
    }
    if (threadIdx.x < in.G)
        ok = wait_flag(in.nvl_word(in.j, hs_nvl, threadIdx.x), seq, in.node_timeout_ns(), in.sink(), phase,
                       in.m * in.G + threadIdx.x, -1);
    return !__syncthreads_or(!ok);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Count + notify (grid C). Every block counts its channel's tokens per destination rank and per destination node,
// and writes send_rdma_head (position in the channel's stream to each node). The last block derives the sender
// prefix matrices, puts one slot to my rail peer on every other node (counts for each of its node's ranks, and the
// totals everyone needs to make the same capacity decisions), relays the slots that reach me to the ranks of my
// node they are for, waits for every source rank's relayed slot, then derives the receive-side handle fields, the
// start rows my node's forwarders need (published in my NVL area) and the counts the host needs.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_notify(const InternodeParams p) {
    const In in(p);
    const int R = in.R, N = in.N, C = in.C, G = in.G, c = blockIdx.x;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
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
        for (int t0 = begin; t0 < end; t0 += kWarpSize) {
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
            if (x < R)
                gbl_cpm[x * C + cc] = acc;
            else
                rdma_cpm[(x - R) * C + cc] = acc;
        }
    }
    __syncthreads();

    // ---- one network slot per node n: mine for the ranks of node n; node m's stays here (I am its rail peer) ----
    const int L = p.num_experts / R;
    const Slot sl(R, N, C, G, L);
    const int32_t* per_expert = reinterpret_cast<const int32_t*>(p.num_tokens_per_expert);
    for (int n = warp; n < N; n += num_warps) {
        int32_t* slot =
            reinterpret_cast<int32_t*>(in.local((n == in.m ? p.lay.notify_recv + int64_t(n) * p.lay.slot_bytes
                                                           : p.lay.notify_send + int64_t(n) * p.lay.slot_bytes)));
        if (lane == 0) {
            slot[EP_RT_IN_SLOT_HIDDEN_BYTES] = p.hidden_bytes;
            slot[EP_RT_IN_SLOT_NUM_TOPK] = p.num_topk;
            slot[EP_RT_IN_SLOT_NUM_CHANNELS] = C;
            slot[EP_RT_IN_SLOT_NUM_EXPERTS] = p.num_experts;
            slot[EP_RT_IN_SLOT_NUM_SCALES] = p.num_scales;
        }
        for (int r = lane; r < R; r += kWarpSize) slot[sl.tot + r] = gbl_cpm[r * C + C - 1];
        for (int q = lane; q < N; q += kWarpSize) slot[sl.node + q] = rdma_cpm[q * C + C - 1];
        for (int cc = lane; cc < C; cc += kWarpSize)
            slot[sl.stream + cc] = rdma_cpm[n * C + cc] - (cc > 0 ? rdma_cpm[n * C + cc - 1] : 0);
        for (int l = 0; l < G; ++l) {
            const int d = n * G + l;
            int32_t* part = slot + sl.per + l * sl.per_words;
            for (int cc = lane; cc < C; cc += kWarpSize)
                part[cc] = gbl_cpm[d * C + cc] - (cc > 0 ? gbl_cpm[d * C + cc - 1] : 0);
            for (int e = lane; e < L; e += kWarpSize) part[C + e] = per_expert != nullptr ? per_expert[d * L + e] : 0;
        }
        __threadfence();
        __syncwarp();
        if (n != in.m)
            net_put_signal_warp(in.local(p.lay.notify_recv + int64_t(in.m) * p.lay.slot_bytes), slot,
                                size_t(sl.net_words) * 4, in.word(p.lay.notify_words, in.m), 1, in.pe(n));
    }
    __syncthreads();
    if (threadIdx.x == 0) net_flush();  // before I wait for anything my slots cause

    // ---- as each rail peer's slot arrives (mine is here already), relay each source's part to the rank of my node
    // it is for: a warp per source node, so a source that never comes holds up no other source's relay ----
    bool ok = true;
    for (int s = warp; s < N; s += num_warps) {
        bool here = true;
        if (s != in.m && lane == 0)
            here = wait_word(in.word(p.lay.notify_words, s), seq, p.net_timeout_ns, sink, EP_RT_PHASE_IN_NOTIFY,
                             in.rail(s), -1);
        if (!__shfl_sync(0xffffffffu, here, 0)) {
            ok = false;
            continue;
        }
        const int src = s * G + in.j;
        const int32_t* from =
            reinterpret_cast<const int32_t*>(in.local(p.lay.notify_recv + int64_t(s) * p.lay.slot_bytes));
        // (the header says how long the source's slot is; a mismatch is reported by the receiver)
        const int their_c = ld_peer_written_b32(from + EP_RT_IN_SLOT_NUM_CHANNELS);
        const int their_l = ld_peer_written_b32(from + EP_RT_IN_SLOT_NUM_EXPERTS) / R;
        const Slot ts(R, N, min(max(their_c, 0), EP_RT_MAX_CHANNELS), G, min(max(their_l, 0), EP_RT_MAX_LOCAL_EXPERTS));
        for (int l = 0; l < G; ++l) {
            int32_t* to = reinterpret_cast<int32_t*>(in.nvl(l, p.nvl.slots + int64_t(src) * p.nvl.slot_bytes));
            for (int w = lane; w < ts.per; w += kWarpSize) to[w] = ld_peer_written_b32(from + w);
            for (int w = lane; w < ts.per_words; w += kWarpSize)
                to[ts.per + w] = ld_peer_written_b32(from + ts.per + l * ts.per_words + w);
            __syncwarp();
            if (lane == 0) release_nvl(in.nvl_word(l, p.nvl.slot_flags, src), seq);
        }
    }
    if (__syncthreads_or(!ok)) return;  // (reported: the rail peer that never came)

    // ---- wait for every source rank's relayed slot (from its rail peer on my node) ----
    // (a timeout names the source whose counts never came: its forwarder here waits for it)
    for (int s = threadIdx.x; s < R; s += blockDim.x)
        ok = ok && wait_flag(in.nvl_word(in.j, p.nvl.slot_flags, s), seq, in.node_timeout_ns(), sink,
                             EP_RT_PHASE_IN_NOTIFY_RELAY, s, -1);
    const bool failed = __syncthreads_or(!ok);
    auto slot_of = [&](int s) {
        return reinterpret_cast<const volatile int32_t*>(in.nvl(in.j, p.nvl.slots + int64_t(s) * p.nvl.slot_bytes));
    };
    if (!failed) {
        for (int s = threadIdx.x; s < R; s += blockDim.x) {
            const volatile int32_t* q = slot_of(s);
            if (q[EP_RT_IN_SLOT_HIDDEN_BYTES] != p.hidden_bytes || q[EP_RT_IN_SLOT_NUM_TOPK] != p.num_topk ||
                q[EP_RT_IN_SLOT_NUM_CHANNELS] != C || q[EP_RT_IN_SLOT_NUM_EXPERTS] != p.num_experts ||
                q[EP_RT_IN_SLOT_NUM_SCALES] != p.num_scales)
                report_error(sink, EP_RT_ERR_MISMATCH, EP_RT_PHASE_IN_NOTIFY, s, -1, q[EP_RT_IN_SLOT_HIDDEN_BYTES],
                             q[EP_RT_IN_SLOT_NUM_TOPK]);
        }
    }
    if (__syncthreads_or(failed || error_raised(sink))) return;

    // ---- receive side: [6], [5] (from the counts to me), [3], [4] (from my rail sources' stream counts) ----
    __shared__ int gbl_prefix[EP_RT_IN_MAX_RANKS];
    __shared__ int rdma_prefix[EP_RT_IN_MAX_NODES];
    __shared__ int max_stream_s, max_recv_s, max_fwd_s;
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int s = 0; s < R; ++s) gbl_prefix[s] = (acc += slot_of(s)[sl.tot + in.me]);
        acc = 0;
        for (int s = 0; s < N; ++s) rdma_prefix[s] = (acc += slot_of(in.rail(s))[sl.node + in.m]);
        max_stream_s = max_recv_s = max_fwd_s = 0;
    }
    __syncthreads();
    int32_t* recv_gbl_prefix = reinterpret_cast<int32_t*>(p.recv_gbl_prefix);
    int32_t* recv_gbl_cpm = reinterpret_cast<int32_t*>(p.recv_gbl_cpm);
    int32_t* recv_rdma_prefix = reinterpret_cast<int32_t*>(p.recv_rdma_prefix);
    int32_t* recv_rdma_cpm = reinterpret_cast<int32_t*>(p.recv_rdma_cpm);
    int32_t* pub = reinterpret_cast<int32_t*>(in.nvl(in.j, p.nvl.pub));  // my start rows, for my node's forwarders
    for (int s = threadIdx.x; s < R; s += blockDim.x) {
        recv_gbl_prefix[s] = gbl_prefix[s];
        int acc = s > 0 ? gbl_prefix[s - 1] : 0;
        const volatile int32_t* q = slot_of(s);
        for (int cc = 0; cc < C; ++cc) {
            recv_gbl_cpm[s * C + cc] = acc;
            pub[s * EP_RT_MAX_CHANNELS + cc] = acc;
            acc += q[sl.per + cc];
        }
    }
    for (int s = threadIdx.x; s < N; s += blockDim.x) {
        recv_rdma_prefix[s] = rdma_prefix[s];
        const volatile int32_t* q = slot_of(in.rail(s));
        int acc = 0;
        for (int cc = 0; cc < C; ++cc) recv_rdma_cpm[s * C + cc] = (acc += q[sl.stream + cc]);
    }
    // Global maxima, the same on every rank: the longest (rank -> node) stream, the most rows a rank receives and
    // the most a rank forwards.
    for (int d = threadIdx.x; d < R; d += blockDim.x) {
        int into = 0, fwd = 0, stream = 0;
        for (int s = 0; s < R; ++s) into += slot_of(s)[sl.tot + d];
        for (int n = 0; n < N; ++n) fwd += slot_of(n * G + d % G)[sl.node + d / G];
        for (int n = 0; n < N; ++n) stream = max(stream, int(slot_of(d)[sl.node + n]));
        atomicMax(&max_recv_s, into);
        atomicMax(&max_fwd_s, fwd);
        atomicMax(&max_stream_s, stream);
    }
    __syncthreads();
    if (threadIdx.x == 0) release_nvl(in.nvl_word(in.j, p.nvl.pub_flag, 0), in.seq(EP_RT_IN_WS_DISPATCH));
    const int num_recv = gbl_prefix[R - 1], num_rdma_recv = rdma_prefix[N - 1];
    if (threadIdx.x == 0) {
        // Capacity decisions every rank makes alike: a dispatch that does not fit moves no data (the host raises
        // before launching it, or with num_worst_tokens the error is reported here and the Buffer stays usable).
        int skip = 0;
        if (max_stream_s > p.lay.cap) {
            skip = 1;
            if (p.host_token == 0)
                defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_NOTIFY, -1, -1, max_stream_s, p.lay.cap);
        } else if (max_recv_s > p.nvl_capacity_rows) {
            skip = 1;
            if (p.host_token == 0)
                defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_FORWARD, -1, -1, max_recv_s, p.nvl_capacity_rows);
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
            for (int s = 0; s < R; ++s) sum += slot_of(s)[sl.per + C + l];
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
// A cached dispatch starts with the handshake and publishes the handle's start rows for my node's forwarders.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_send(const InternodeParams p) {
    allow_next_kernel_to_start();  // the forward kernel waits for its data through flags and signal words
    const In in(p);
    const int R = in.R, N = in.N, C = in.C, G = in.G, c = blockIdx.x;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
    if (p.cached) {
        if (!handshake(in, EP_RT_IN_HS_CACHED, in.seq(EP_RT_IN_WS_CACHED), EP_RT_PHASE_IN_HANDSHAKE)) return;
        if (c == 0) {
            int32_t* pub = reinterpret_cast<int32_t*>(in.nvl(in.j, p.nvl.pub));
            const int32_t* recv_gbl_cpm = reinterpret_cast<const int32_t*>(p.recv_gbl_cpm);
            for (int i = threadIdx.x; i < R * C; i += blockDim.x)
                pub[(i / C) * EP_RT_MAX_CHANNELS + i % C] = recv_gbl_cpm[i];
            __syncthreads();
            if (threadIdx.x == 0) release_nvl(in.nvl_word(in.j, p.nvl.pub_flag, 0), in.seq(EP_RT_IN_WS_DISPATCH));
        }
    }
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
                        defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_NOTIFY, -1, c, stream_pos + 1, p.lay.cap);
                    continue;
                }
                uint8_t* r = in.record(n == in.m ? p.lay.recv : p.lay.stage, n, stream_pos);
                warp_copy<Src::kInput>(r, reinterpret_cast<const uint8_t*>(p.x) + int64_t(t) * p.hidden_bytes,
                                       p.hidden_bytes, lane);
                for (int i = lane; i < S; i += kWarpSize)
                    reinterpret_cast<int32_t*>(r + rec.scales)[i] =
                        x_scales[int64_t(t) * p.scale_token_stride + int64_t(i) * p.scale_hidden_stride];
                for (int k = lane; k < K; k += kWarpSize) {
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
    if (threadIdx.x == 0) {  // my forward kernel may already run: my own node's records of channel c are here
        __threadfence();
        st_release_sys(own_ready(p, 0, c), in.seq(EP_RT_IN_WS_DISPATCH));
    }
    // Each other node's range in chunks (a bare signal when empty), starting from a different node per (rank,
    // channel) against incast. The receiver counts the same chunks from the same count (recv_rdma_cpm).
    for (int k = 0; k < N; ++k) {
        const int n = (in.m + 1 + k + c) % N;
        if (n == in.m) continue;
        const int first = c > 0 ? rdma_cpm[n * C + c - 1] : 0;
        const int count = skip ? 0 : max(0, min(rdma_cpm[n * C + c], int(p.lay.cap)) - first);
        const int chunks = stream_chunks(count);
        for (int q = 0; q < chunks; ++q) {
            uint64_t* sig = in.word(p.lay.dispatch_words, chunk_word(in.m, c, q));
            const int a = chunk_begin(count, chunks, q), b = chunk_begin(count, chunks, q + 1);
            if (b > a) {
                net_put_signal_block(in.record(p.lay.recv, in.m, first + a), in.record(p.lay.stage, n, first + a),
                                     size_t(b - a) * p.lay.record_bytes, sig, 1, in.pe(n));
            } else if (threadIdx.x == 0) {
                net_signal_add(sig, 1, in.pe(n));
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) net_flush();
}

// ------------------------------------------------------------------------------------------------
// Forward (grid N * C, block (s, c)): as the rail peer of source rank src = s * G + j, wait for its channel c's
// records in my receive area (mine: the NIC wrote them into my memory), then push each record into the NVL buffer
// of every rank of my node its mask names, at its final row there (that rank's start row of block (src, c), which
// it published, plus the records before it for that rank), record where it went (send_nvl_head), and tell each
// rank of my node that block (src, c) is in its buffer.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_forward(const InternodeParams p) {
    allow_next_kernel_to_start();  // the receive kernel waits for every block it copies through the relay flags
    const In in(p);
    const int C = in.C, G = in.G, s = blockIdx.x / C, c = blockIdx.x % C, src = s * G + in.j;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
    const int64_t seq = in.seq(EP_RT_IN_WS_DISPATCH);
    const ErrorSink sink = in.sink();
    const int32_t* recv_rdma_cpm = reinterpret_cast<const int32_t*>(p.recv_rdma_cpm);
    const int32_t* recv_rdma_prefix = reinterpret_cast<const int32_t*>(p.recv_rdma_prefix);
    int32_t* nvl_head = reinterpret_cast<int32_t*>(p.send_nvl_head);
    const bool skip = !p.cached && *reinterpret_cast<volatile int64_t*>(in.ws + EP_RT_IN_WS_SKIP) != 0;
    const Rec rec(p.hidden_bytes, p.num_scales, p.num_topk);
    const int row_base = s > 0 ? recv_rdma_prefix[s - 1] : 0;
    __shared__ int start[EP_RT_MAX_NVL_RANKS], base[EP_RT_MAX_NVL_RANKS];  // rank l's start row of (src, c), and
        // the rows of src before channel c
    __shared__ int warp_counts[EP_RT_MAX_NVL_RANKS][32];

    bool ok = true;
    if (s == in.m && threadIdx.x == 0)  // my own node's records, written by my send kernel (which may still run)
        ok = wait_flag(own_ready(p, 0, c), seq, in.node_timeout_ns(), sink, EP_RT_PHASE_IN_FORWARD, in.me, c);
    if (threadIdx.x >= kWarpSize && threadIdx.x < kWarpSize + G) {  // the start rows of every rank of my node
        const int l = threadIdx.x - kWarpSize;
        ok = wait_flag(in.nvl_word(l, p.nvl.pub_flag, 0), seq, in.node_timeout_ns(), sink, EP_RT_PHASE_IN_FORWARD,
                       in.m * G + l, c);
        if (ok) {
            const volatile int32_t* pub = reinterpret_cast<const volatile int32_t*>(in.nvl(l, p.nvl.pub));
            start[l] = pub[src * EP_RT_MAX_CHANNELS + c];
            base[l] = start[l] - pub[src * EP_RT_MAX_CHANNELS];
        }
    }
    if (__syncthreads_or(!ok || error_raised(sink))) return;

    const int first = min(c > 0 ? recv_rdma_cpm[s * C + c - 1] : 0, int(p.lay.cap));
    const int count = skip ? 0 : min(recv_rdma_cpm[s * C + c], int(p.lay.cap)) - first;  // (capacity: the sender's)
    const int chunks = stream_chunks(count);
    int running = 0;  // lane l < G of every warp: records of this block already sent to rank (my node, l)
    for (int chunk = 0; chunk < chunks; ++chunk) {
        // The chunk's records are in my receive area once its signal is here (put-with-signal).
        if (s != in.m && threadIdx.x == 0)
            ok = wait_next(in.word(p.lay.dispatch_words, chunk_word(s, c, chunk)),
                           reinterpret_cast<int64_t*>(p.consumed) + chunk_word(s, c, chunk), p.net_timeout_ns, sink,
                           EP_RT_PHASE_IN_FORWARD, in.rail(s), c);
        if (__syncthreads_or(!ok || error_raised(sink))) return;
        const int lo = first + chunk_begin(count, chunks, chunk), last = first + chunk_begin(count, chunks, chunk + 1);
        // Tiles of blockDim records: each warp ballots its 32 per local rank, a block scan gives each warp its
        // first row per rank, then each warp pushes its selected records one after another.
        for (int i0 = lo; i0 < last; i0 += blockDim.x) {
            const int i = i0 + threadIdx.x;
            const uint8_t* r = in.record(p.lay.recv, s, i);
            const int mask = i < last ? ld_peer_written_b32(reinterpret_cast<const int32_t*>(r + rec.meta) + 1) : 0;
            unsigned ballots[EP_RT_MAX_NVL_RANKS];
#pragma unroll
            for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l) {
                ballots[l] = __ballot_sync(0xffffffffu, l < G && ((mask >> l) & 1));
                if (lane == 0 && l < G) warp_counts[l][warp] = __popc(ballots[l]);
            }
            __syncthreads();
            int before[EP_RT_MAX_NVL_RANKS];  // rows of rank l taken by the warps before mine in this tile
            int tile_total = 0;  // lane l: this tile's rows of rank l
#pragma unroll
            for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l) {
                before[l] = 0;
                if (l >= G) continue;
                int total = 0;
                for (int w = 0; w < num_warps; ++w) {
                    before[l] += w < warp ? warp_counts[l][w] : 0;
                    total += warp_counts[l][w];
                }
                if (lane == l) tile_total = total;
            }
            int run[EP_RT_MAX_NVL_RANKS];  // the block's rows of rank l before this tile (every warp has them)
#pragma unroll
            for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l) run[l] = __shfl_sync(0xffffffffu, running, l < G ? l : 0);
            // This thread's record: send_nvl_head (the row within its (src -> rank l) stream, -1 if not for l).
            if (!p.cached && i < last && row_base + i < p.num_fwd_rows) {
#pragma unroll
                for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l) {
                    if (l >= G) continue;
                    const int at = before[l] + __popc(ballots[l] & ((1u << lane) - 1u));
                    nvl_head[int64_t(row_base + i) * G + l] = (mask >> l) & 1 ? base[l] + run[l] + at : -1;
                }
            }
            // Push: the warp walks its 32 records in order, each to every rank it is for.
            for (int q = 0; q < kWarpSize; ++q) {
                const int iq = i0 + warp * kWarpSize + q;
                if (iq >= last) break;  // warp-uniform
                const int mq = __shfl_sync(0xffffffffu, mask, q);
                const uint8_t* from = in.record(p.lay.recv, s, iq);
#pragma unroll
                for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l) {
                    if (l >= G || !((mq >> l) & 1)) continue;  // warp-uniform
                    const int row = start[l] + run[l] + before[l] + __popc(ballots[l] & ((1u << q) - 1u));
                    if (row < p.nvl_capacity_rows) {  // (the notify's capacity decision keeps rows below it)
                        warp_copy<Src::kPeerWritten>(in.nvl(l, p.nvl.records + int64_t(row) * p.lay.record_bytes), from,
                                                     p.lay.record_bytes, lane);
                    } else if (lane == 0) {  // only a cached dispatch from a handle without facts gets here
                        defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_FORWARD, in.m * G + l, c, row + 1,
                                    p.nvl_capacity_rows);
                    }
                }
            }
            if (lane < G) running += tile_total;
            __syncthreads();  // warp_counts is reused
        }
    }
    // num_worst_tokens: rows of send_nvl_head past the real ones carry no destination.
    if (p.fill_unused && blockIdx.x == 0) {
        const int num_rdma_recv = recv_rdma_prefix[in.N - 1];
        for (int64_t i = int64_t(num_rdma_recv) * G + threadIdx.x; i < int64_t(p.num_fwd_rows) * G; i += blockDim.x)
            nvl_head[i] = -1;
    }
    // The block's last writes: after its relay flags nothing more of this call is written here (the receive kernel,
    // which may complete before this kernel does, is the call's end).
    __syncthreads();
    if (threadIdx.x < G) release_nvl(in.nvl_word(threadIdx.x, p.nvl.relay, src * EP_RT_MAX_CHANNELS + c), seq);
}

// ------------------------------------------------------------------------------------------------
// Receive (grid C): block c copies, for every source rank src, block (src, c) of my rows from my own NVL buffer
// (where src's rail peer on my node pushed them, at their final rows) into my outputs.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_recv(const InternodeParams p) {
    const In in(p);
    const int R = in.R, C = in.C, G = in.G, c = blockIdx.x;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
    const int64_t seq = in.seq(EP_RT_IN_WS_DISPATCH);
    const ErrorSink sink = in.sink();
    const int32_t* recv_gbl_cpm = reinterpret_cast<const int32_t*>(p.recv_gbl_cpm);
    const int32_t* recv_gbl_prefix = reinterpret_cast<const int32_t*>(p.recv_gbl_prefix);
    const bool skip = !p.cached && *reinterpret_cast<volatile int64_t*>(in.ws + EP_RT_IN_WS_SKIP) != 0;
    const Rec rec(p.hidden_bytes, p.num_scales, p.num_topk);
    const int S = p.num_scales, K = p.num_topk, L = p.num_experts / R;
    const uint8_t* records = in.nvl(in.j, p.nvl.records);

    for (int src = 0; src < R; ++src) {
        if (threadIdx.x == 0)
            wait_flag(in.nvl_word(in.j, p.nvl.relay, src * EP_RT_MAX_CHANNELS + c), seq, in.node_timeout_ns(), sink,
                      EP_RT_PHASE_IN_RECV, in.m * G + src % G, c);
        if (__syncthreads_or(error_raised(sink))) return;
        if (skip) continue;
        const int first = recv_gbl_cpm[src * C + c];
        const int last = min(c + 1 < C ? recv_gbl_cpm[src * C + c + 1] : recv_gbl_prefix[src],
                             int(min(int64_t(p.num_out_rows), p.nvl_capacity_rows)));
        for (int out = first + warp; out < last; out += num_warps) {
            const uint8_t* rr = records + int64_t(out) * p.lay.record_bytes;
            warp_copy<Src::kPeerWritten>(reinterpret_cast<uint8_t*>(p.recv_x) + int64_t(out) * p.hidden_bytes, rr,
                                         p.hidden_bytes, lane);
            for (int q = lane; q < S; q += kWarpSize)
                reinterpret_cast<int32_t*>(p.recv_x_scales)[int64_t(out) * S + q] =
                    ld_peer_written_b32(reinterpret_cast<const int32_t*>(rr + rec.scales) + q);
            if (p.recv_topk_idx) {
                for (int k = lane; k < K; k += kWarpSize) {
                    const int e = ld_peer_written_b32(reinterpret_cast<const int32_t*>(rr + rec.idx) + k);
                    const bool local = e >= in.me * L && e < (in.me + 1) * L;
                    store_topk_idx(p.recv_topk_idx, p.recv_topk_idx_bits, int64_t(out) * K + k,
                                   local ? e - in.me * L : -1);
                    const float w =
                        __int_as_float(ld_peer_written_b32(reinterpret_cast<const int32_t*>(rr + rec.weights) + k));
                    if (p.recv_topk_weights)
                        reinterpret_cast<float*>(p.recv_topk_weights)[int64_t(out) * K + k] = local ? w : 0.0f;
                }
            }
            if (p.recv_src_meta && lane == 0) {
                int32_t* meta = reinterpret_cast<int32_t*>(p.recv_src_meta + int64_t(out) * 8);
                meta[0] = src / G;
                meta[1] = ld_peer_written_b32(reinterpret_cast<const int32_t*>(rr + rec.meta) + 1);
            }
        }
    }
    // num_worst_tokens: rows past the real count carry no expert.
    if (p.fill_unused && p.recv_topk_idx) {
        const int num_recv = recv_gbl_prefix[R - 1];
        for (int64_t i = int64_t(num_recv) * K + int64_t(c) * blockDim.x + threadIdx.x; i < int64_t(p.num_out_rows) * K;
             i += int64_t(C) * blockDim.x)
            store_topk_idx(p.recv_topk_idx, p.recv_topk_idx_bits, i, -1);
    }
    if (!last_block(in.ws + EP_RT_IN_WS_TICKET + 1)) return;
    if (p.cached) advance(in, EP_RT_IN_WS_CACHED, in.seq(EP_RT_IN_WS_CACHED));
    advance(in, EP_RT_IN_WS_DISPATCH, seq);
    report_deferred(in);
}

// ------------------------------------------------------------------------------------------------
// Combine publish (grid C): after the handshake (the previous call's readers are done), copy my rows (and weights)
// into my NVL buffer, then publish my recv_gbl_rank_prefix_sum and a ready flag for my node.
// NVL row layout: bf16 row (2H bytes) then K f32 weights, per row, 16-aligned.
__device__ __forceinline__ int64_t combine_row_bytes(const InternodeParams& p) {
    return align16(int64_t(p.hidden_bytes) + 4 * int64_t(p.num_topk));
}

extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_combine_publish(const InternodeParams p) {
    const In in(p);
    const int R = in.R, c = blockIdx.x;
    const int64_t seq = in.seq(EP_RT_IN_WS_COMBINE);
    if (!handshake(in, EP_RT_IN_HS_COMBINE, seq, EP_RT_PHASE_IN_COMBINE_HANDSHAKE)) return;
    const int num_recv = reinterpret_cast<const int32_t*>(p.recv_gbl_prefix)[R - 1];
    const int64_t row_bytes = combine_row_bytes(p);
    const int K = p.num_topk;
    uint8_t* rows = in.nvl(in.j, p.nvl.records);
    if (num_recv <= p.nvl_capacity_rows) {
        const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
        for (int i = c * num_warps + warp; i < num_recv; i += gridDim.x * num_warps) {
            uint8_t* dst = rows + int64_t(i) * row_bytes;
            warp_copy<Src::kInput>(dst, reinterpret_cast<const uint8_t*>(p.x) + int64_t(i) * p.hidden_bytes,
                                   p.hidden_bytes, lane);
            if (p.topk_weights)
                for (int k = lane; k < K; k += kWarpSize)
                    reinterpret_cast<float*>(dst + p.hidden_bytes)[k] =
                        reinterpret_cast<const float*>(p.topk_weights)[int64_t(i) * K + k];
        }
    } else if (c == 0 && threadIdx.x == 0) {  // the host checks this first; here for handles without facts
        defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_COMBINE_HANDSHAKE, in.me, -1, num_recv, p.nvl_capacity_rows);
    }
    if (!last_block(in.ws + EP_RT_IN_WS_TICKET + 2)) return;
    int32_t* pub = reinterpret_cast<int32_t*>(in.nvl(in.j, p.nvl.ready_prefix));
    for (int s = threadIdx.x; s < R; s += blockDim.x) pub[s] = reinterpret_cast<const int32_t*>(p.recv_gbl_prefix)[s];
    __syncthreads();
    if (threadIdx.x == 0) release_nvl(in.nvl_word(in.j, p.nvl.ready, 0), seq);
}

// ------------------------------------------------------------------------------------------------
// Combine forward (grid C): for each source node s and channel c, every token I forwarded in dispatch: sum its rows
// on my node's ranks (local rank ascending, f32) -> bf16 (the first rounding), weights in f32, at its stream
// position; put each (s, c) range back to the source (my rail peer on node s), or write it in place for my node.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_combine_forward(const InternodeParams p) {
    allow_next_kernel_to_start();  // the reduce kernel waits for every partial through signal words and a flag
    const In in(p);
    const int N = in.N, C = in.C, G = in.G, c = blockIdx.x;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
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
        ok = wait_flag(in.nvl_word(threadIdx.x, p.nvl.ready, 0), seq, in.node_timeout_ns(), sink,
                       EP_RT_PHASE_IN_COMBINE_FORWARD, in.m * G + threadIdx.x, c);
    if (__syncthreads_or(!ok)) return;
    for (int q = threadIdx.x; q < G * N; q += blockDim.x) {
        const int l = q / N, s = q % N, src = s * G + in.j;
        const volatile int32_t* pub = reinterpret_cast<const volatile int32_t*>(in.nvl(l, p.nvl.ready_prefix));
        prefix[l][s] = src > 0 ? pub[src - 1] : 0;
    }
    __syncthreads();

    // The other nodes first (from a different one per (rank, channel), against incast), my own node last: its
    // flag is this block's last write, after which the reduce kernel (perhaps already running) may finish the call.
    for (int k = 0; k < N; ++k) {
        const int s = k == N - 1 ? in.m : (in.m + 1 + (k + c) % (N - 1)) % N;
        const int cap = int(p.lay.cap);
        const int first = min(c > 0 ? recv_rdma_cpm[s * C + c - 1] : 0, cap);
        const int count = min(recv_rdma_cpm[s * C + c], cap) - first;
        if (recv_rdma_cpm[s * C + c] > cap && threadIdx.x == 0)  // only a handle without facts gets here
            defer_error(in, EP_RT_ERR_CAPACITY, EP_RT_PHASE_IN_COMBINE_FORWARD, -1, c, recv_rdma_cpm[s * C + c], cap);
        const int row_base = s > 0 ? recv_rdma_prefix[s - 1] : 0;
        const int64_t area = s == in.m ? p.lay.recv : p.lay.stage;
        const int chunks = stream_chunks(count);
        for (int chunk = 0; chunk < chunks; ++chunk) {
            uint64_t* sig = in.word(p.lay.combine_words, chunk_word(in.m, c, chunk));
            const int lo = first + chunk_begin(count, chunks, chunk),
                      last = first + chunk_begin(count, chunks, chunk + 1);
            for (int i = lo + warp; i < last; i += num_warps) {
                const int32_t* head = nvl_head + int64_t(row_base + i) * G;
                uint8_t* out = in.record(area, s, i);
                const uint8_t* rows[EP_RT_MAX_NVL_RANKS];
#pragma unroll
                for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l) {
                    const int q = l < G ? head[l] : -1;
                    // (rows past the NVL capacity were never published: only a handle without facts gets there,
                    // and its publish kernel defers the error)
                    rows[l] = q >= 0 && prefix[l][s] + q < p.nvl_capacity_rows
                                  ? in.nvl(l, p.nvl.records + int64_t(prefix[l][s] + q) * row_bytes)
                                  : nullptr;
                }
                for (int v = lane; v < hidden_int4; v += kWarpSize) {
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
                for (int kk = lane; kk < K; kk += kWarpSize) {
                    float acc = 0.0f;
#pragma unroll
                    for (int l = 0; l < EP_RT_MAX_NVL_RANKS; ++l)
                        if (rows[l] != nullptr)
                            acc += __int_as_float(
                                ld_peer_written_b32(reinterpret_cast<const int32_t*>(rows[l] + p.hidden_bytes) + kk));
                    reinterpret_cast<float*>(out + p.hidden_bytes)[kk] = acc;
                }
            }
            __threadfence();
            __syncthreads();
            if (s == in.m) continue;  // my own node's partials stay here for my reduce kernel
            if (last > lo)
                net_put_signal_block(in.record(p.lay.recv, in.m, lo), in.record(p.lay.stage, s, lo),
                                     size_t(last - lo) * p.lay.record_bytes, sig, 1, in.pe(s));
            else if (threadIdx.x == 0)
                net_signal_add(sig, 1, in.pe(s));
        }
        if (s != in.m) continue;
        __syncthreads();
        if (threadIdx.x == 0) net_flush();
        if (threadIdx.x == 0) st_release_sys(own_ready(p, 1, c), seq);  // (after the fence of the last chunk)
    }
}

// ------------------------------------------------------------------------------------------------
// Combine reduce (grid C): my tokens of channel c, once every node's partials for this channel are here: bias
// first, then nodes ascending, in f32 -> bf16; weights the same in f32.
extern "C" __global__ void __launch_bounds__(512) ep_rt_internode_combine_reduce(const InternodeParams p) {
    const In in(p);
    const int N = in.N, C = in.C, c = blockIdx.x;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
    const int64_t seq = in.seq(EP_RT_IN_WS_COMBINE);
    const ErrorSink sink = in.sink();
    const int32_t* rdma_cpm = reinterpret_cast<const int32_t*>(p.rdma_cpm);
    const int32_t* rdma_head = reinterpret_cast<const int32_t*>(p.send_rdma_head);
    const int H = p.hidden_bytes / 2, K = p.num_topk, hidden_int4 = H / 8;

    // Every chunk of every other node's partials for channel c (the chunks of the count I sent it in dispatch), and
    // my own node's, which my forward kernel (perhaps still running) flags.
    bool ok = true;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        if (n == in.m) {
            ok = ok && wait_flag(own_ready(p, 1, c), seq, in.node_timeout_ns(), sink, EP_RT_PHASE_IN_COMBINE_REDUCE,
                                 in.me, c);
            continue;
        }
        const int first = min(c > 0 ? rdma_cpm[n * C + c - 1] : 0, int(p.lay.cap));
        const int chunks = stream_chunks(min(rdma_cpm[n * C + c], int(p.lay.cap)) - first);
        for (int q = 0; q < chunks && ok; ++q)
            ok = wait_next(in.word(p.lay.combine_words, chunk_word(n, c, q)),
                           reinterpret_cast<int64_t*>(p.consumed) + kCombineConsumed + chunk_word(n, c, q),
                           p.net_timeout_ns, sink, EP_RT_PHASE_IN_COMBINE_REDUCE, in.rail(n), c);
    }
    if (__syncthreads_or(!ok || error_raised(sink))) return;

    int begin, end;
    channel_range(p.num_tokens, C, c, begin, end);
    for (int t = begin + warp; t < end; t += num_warps) {
        const int32_t* head = rdma_head + int64_t(t) * N;
        const int4* b0 = p.bias0 ? reinterpret_cast<const int4*>(p.bias0) + int64_t(t) * hidden_int4 : nullptr;
        const int4* b1 = p.bias1 ? reinterpret_cast<const int4*>(p.bias1) + int64_t(t) * hidden_int4 : nullptr;
        for (int v = lane; v < hidden_int4; v += kWarpSize) {
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
            for (int k = lane; k < K; k += kWarpSize) {
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
    if (!handshake(in, EP_RT_IN_HS_BARRIER, seq, EP_RT_PHASE_BARRIER)) return;
    advance(in, EP_RT_IN_WS_BARRIER, seq);
}
