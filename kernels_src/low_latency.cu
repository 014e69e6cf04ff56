// ep_rt-build: nvshmem min_arch=sm_90 variants=default,chaos,packed,packed_chaos
//
// Low-latency (decode) dispatch and combine over a symmetric NVSHMEM buffer.
//
// Peers on this node are written with plain stores through their NVLink-mapped symmetric base
// (peer_bases[r] != 0) and told with release stores of the signal. Peers on other nodes get one put-with-signal
// per message from this rank's staging area (include/ep_rt/net.cuh), whose SIGNAL_ADD counts the message into an
// arrival word at the receiver, and one signal op announcing each cell's count; the receiver waits for the count,
// then for that many arrivals, and clears the arrival words before it hands the buffer back (buffer credits, also
// signal ops). No quiet and no fence anywhere: a staging area is rewritten only after every peer's credit says it
// received the last call on that buffer. The chaos variant (EP_RT_CHAOS_TRANSPORT=1) delivers those puts late,
// split and reordered. A call is one kernel (ep_rt_ll_dispatch, ep_rt_ll_combine: every block sends, then
// receives, as DeepEP's), or with a receive hook two (the _send and _recv kernels, the split the hook needs); both
// run the same send and receive halves below. Signals carry a tag derived from a per-buffer epoch kept in
// device memory, so nothing is cleaned between calls and CUDA-graph replays stay correct. Every wait is
// time-limited: it reports into the error record, or in shrink mode masks the silent rank instead.
//
// The packed variants (EP_RT_LL_PACKED=1, docs/LL_PACKED_DESIGN.md) size the receive areas by what can arrive:
// the dispatch gives each source rank a block of T x min(16, L) slots, in which its messages to local expert l
// start after its messages to the lower local experts (the sender counts them from topk_idx, the receiver from
// the count signals), and the combine returns token t's k-th row into slot t x min(16, E) + k at its source (the
// host refuses a top-k above the expert count there). The dispatch
// message's header carries k (word 1), which the receive keeps in plane 1 of src_info for the combine.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "ep_rt/copy.cuh"
#include "ep_rt/logfmt.cuh"
#include "ep_rt/net.cuh"
#include "ep_rt/params.h"
#include "ep_rt/ptx.cuh"
#include "ep_rt/share.cuh"
#include "ep_rt/sync.cuh"
#include "ep_rt/topk.cuh"

using namespace ep_rt;

#ifndef EP_RT_LL_PACKED
#define EP_RT_LL_PACKED 0
#endif

namespace {

constexpr int kWarpSize = 32;
constexpr float kFp8Max = 448.0f;
constexpr int kTicketDispatchSend = 0, kTicketDispatchRecv = 1, kTicketCombineSend = 2, kTicketCombineRecv = 3;

// The tag of the use of a buffer that finds `epoch` earlier uses completed: 1..2^32-1 as a 32-bit pattern, never 0
// (the value of a cleaned buffer, which the credit of a buffer's first use must match).
__device__ __forceinline__ int32_t tag_of_epoch(uint32_t epoch) { return int32_t(epoch % 0xFFFFFFFFu + 1u); }

struct LL {
    const LowLatencyParams& p;
    int32_t* ws;
    int L, S;
    int32_t tag;       // this call's
    int32_t prev_tag;  // the previous call's on this buffer: what every peer's credit must hold before we write

    __device__ LL(const LowLatencyParams& params) : p(params) {
        ws = reinterpret_cast<int32_t*>(p.workspace);
        L = p.num_experts / p.num_ranks;
        S = p.hidden / 128;
        const uint32_t epoch = *reinterpret_cast<volatile uint32_t*>(ws + EP_RT_LL_WS_EPOCH + p.buffer_idx);
        tag = tag_of_epoch(epoch);
        prev_tag = epoch == 0 ? 0 : tag_of_epoch(epoch - 1);
    }
    __device__ ErrorSink sink() const { return ErrorSink{p.error, ws + EP_RT_LL_WS_CLAIM, p.rank}; }
    __device__ bool masked(int r) const {
        return p.mask != 0 && *reinterpret_cast<volatile int32_t*>(reinterpret_cast<int32_t*>(p.mask) + r) != 0;
    }
    // Rank r's NVLink-mapped symmetric base, or 0 for a rank of another node. Only ever a store destination:
    // no kernel here reads another rank's memory (tests/test_network_rules.py holds the uses).
    __device__ uint64_t peer(int r) const { return reinterpret_cast<const uint64_t*>(p.peer_bases)[r]; }
    __device__ bool remote(int r) const { return peer(r) == 0; }
    __device__ uint8_t* local(int64_t off) const { return reinterpret_cast<uint8_t*>(p.sym_base + off); }
    // Word [buffer][rank] of the credit area (u64 signal words; this rank's copy, peers' through signal_rank).
    __device__ int64_t credit_off(int rank) const {
        return p.credit_off + (int64_t(p.buffer_idx) * p.num_ranks + rank) * 8;
    }
    // This call's arrival word of cell c (u64, SIGNAL_ADD 1 per message from a rank of another node).
    __device__ uint64_t* arrival(int c) const { return reinterpret_cast<uint64_t*>(local(p.arrival_off)) + c; }
};

// The whole block sends n rows of `hidden` bf16 from src_rows[i] to dst_rows[i] (addresses, in shared memory):
// copied, or with kLogFmt encoded on the way (dst is then a combine slot). Flattened over (row, int4) so every
// thread keeps kUnroll 16-byte loads in flight even when there are only a few rows. Index math is 32-bit
// (n * hidden / 8 < 2^31 for every legal shape). The loop bound is warp-uniform because the encoder's shuffles
// need all 32 lanes, and H % 128 == 0 (with blockDim a multiple of 32) keeps every half-warp inside one
// division of one row, all-active or all-inactive. The sources are read-only input (expert outputs, or the
// zero-copy staging area the caller filled before the call).
template <bool kLogFmt>
__device__ void block_send_rows(const uint64_t* dst_rows, const uint64_t* src_rows, int n, int hidden) {
    const uint32_t row_int4 = uint32_t(hidden / 8), total = uint32_t(n) * row_int4;
    const uint32_t lane = threadIdx.x % kWarpSize;
    constexpr int kUnroll = 4;
    for (uint32_t j0 = threadIdx.x; j0 - lane < total; j0 += blockDim.x * kUnroll) {
        int4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const uint32_t j = j0 + u * blockDim.x;
            if (j < total) {
                const uint32_t i = j / row_int4, c = j - i * row_int4;
                v[u] = ld_input_v4(reinterpret_cast<const int4*>(src_rows[i]) + c);
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const uint32_t j = j0 + u * blockDim.x;
            const bool active = j < total;
            const uint32_t i = active ? j / row_int4 : 0, c = j - i * row_int4;
            if constexpr (kLogFmt) {
                logfmt_encode_int4(v[u], active, c, active ? reinterpret_cast<uint8_t*>(dst_rows[i]) : nullptr, hidden);
            } else if (active) {
                st_na_v4(reinterpret_cast<int4*>(dst_rows[i]) + c, v[u]);
            }
        }
    }
}

// LogFMT: one warp encodes one row of `hidden` bf16 into the slot `slot` (uniform loop, as above).
__device__ __forceinline__ void warp_encode_row(uint8_t* slot, const uint8_t* src, int hidden, int lane) {
    const uint32_t row_int4 = uint32_t(hidden / 8);
    for (uint32_t c0 = 0; c0 < row_int4; c0 += kWarpSize) {
        const uint32_t c = c0 + lane;
        const bool active = c < row_int4;
        const int4 v = active ? ld_input_v4(reinterpret_cast<const int4*>(src) + c) : make_int4(0, 0, 0, 0);
        logfmt_encode_int4(v, active, c, slot, hidden);
    }
}

// Set one 64-bit signal word at rank r: a release store through its NVLink mapping (after this rank's stores
// into r, which it announces), or a signal op of the network (SIGNAL_SET; it announces nothing but itself: data
// for a rank of another node is announced by its own put-with-signal, whose arrivals the receiver counts).
__device__ __forceinline__ void signal_rank(const LL& ll, int r, int64_t off, int64_t value) {
    const uint64_t base = ll.peer(r);
    if (base != 0)
        st_release_sys(reinterpret_cast<int64_t*>(base + off), value);
    else
        net_signal_set(reinterpret_cast<uint64_t*>(ll.local(off)), uint64_t(value), r);
}

// A signal: the tag in the high word, then the sender's shape digest (16 bits: a peer that called with another
// shape is caught instead of followed) and, for dispatch counts, the count (16 bits).
__device__ __forceinline__ int64_t make_signal(int32_t tag, int digest, int count) {
    return int64_t((uint64_t(uint32_t(tag)) << 32) | (uint32_t(digest & 0xFFFF) << 16) | uint32_t(count & 0xFFFF));
}
__device__ __forceinline__ int32_t tag_of_signal(int64_t v) { return int32_t(uint64_t(v) >> 32); }
__device__ __forceinline__ int digest_of_signal(int64_t v) { return int((uint64_t(v) >> 16) & 0xFFFF); }
__device__ __forceinline__ int count_of_signal(int64_t v) { return int(uint64_t(v) & 0xFFFF); }

// A signal of this call from `peer` whose digest differs from ours: reported (the caller's error; every rank must
// pass the same shape), and the signal is then treated as carrying nothing.
__device__ __forceinline__ bool same_shape(const LL& ll, int64_t v, int peer, int phase) {
    if (digest_of_signal(v) == (ll.p.shape_digest & 0xFFFF)) return true;
    report_error(ll.sink(), EP_RT_ERR_MISMATCH, phase, peer, -1, digest_of_signal(v), ll.p.shape_digest & 0xFFFF);
    return false;
}

// Wait until pred(signal) holds; false on timeout (reported with the tag `expected` and the tag seen, `tag_of`
// of the last value). In shrink mode a silent rank is masked instead.
template <typename T, typename Pred, typename TagOf>
__device__ bool wait_signal(const LL& ll, const T* sig, Pred pred, TagOf tag_of, int32_t expected, int peer, int phase,
                            T& value, int64_t& cycles) {
    const int64_t start_cycles = clock64();
    const uint64_t start = globaltimer_ns();
    const ErrorSink sink = ll.sink();
    int spins = 0;
    while (true) {
        value = ld_acquire_sys(sig);
        if (pred(value)) break;
        if (++spins == 64) {
            spins = 0;
            if (ll.masked(peer)) return false;
            if (int64_t(globaltimer_ns() - start) > ll.p.timeout_ns) {
                if (ll.p.mask != 0) {
                    if (atomicExch(reinterpret_cast<int32_t*>(ll.p.mask) + peer, 1) == 0)
                        printf("ep_rt: rank %d masks rank %d after a timeout (phase %d)\n", ll.p.rank, peer, phase);
                } else {
                    report_error(sink, EP_RT_ERR_TIMEOUT, phase, peer, -1, uint32_t(expected), uint32_t(tag_of(value)));
                }
                return false;
            }
            if (error_raised(sink)) return false;
        }
    }
    cycles += clock64() - start_cycles;
    return true;
}

// Buffer credits (params.h). A send kernel calls credit_prefetch at its start (the loads overlap its first
// loads of input), then wait_buffer_free in every block before its first write into a peer's buffer: thread r
// checks rank r's credit and spins only if it is not there yet. The whole block then writes after the check.
__device__ __forceinline__ int32_t credit_prefetch(const LL& ll) {
    const int r = threadIdx.x;
    return r < ll.p.num_ranks ? int32_t(*reinterpret_cast<const volatile int64_t*>(ll.local(ll.credit_off(r)))) : 0;
}

__device__ void wait_buffer_free(const LL& ll, int32_t prefetched) {
    for (int r = threadIdx.x; r < ll.p.num_ranks; r += blockDim.x) {
        if (ll.masked(r)) continue;
        // Free once r has read the previous call on this buffer; r may even have finished this call already (a
        // combine receive that needs nothing from us waits for nothing), which our writes then cannot disturb:
        // r's next use of the buffer waits for the next tag.
        const int32_t prev = ll.prev_tag, cur = ll.tag;
        auto is_free = [prev, cur](int32_t v) { return v == prev || v == cur; };
        if (r == int(threadIdx.x) && is_free(prefetched)) {
            asm volatile("fence.acq_rel.sys;" ::: "memory");  // the volatile load above + this fence: an acquire
            continue;
        }
        int64_t value;
        int64_t cycles = 0;
        wait_signal(
            ll, reinterpret_cast<const int64_t*>(ll.local(ll.credit_off(r))),
            [is_free](int64_t v) { return is_free(int32_t(v)); }, [](int64_t v) { return int32_t(v); }, prev, r,
            EP_RT_PHASE_LL_BUFFER_FREE, value, cycles);
    }
    __syncthreads();
}

// The last block of a receive kernel, once every block has finished reading this buffer: clear the arrival words
// of its `cells` (a local store; no sender adds to them before it sees our credit, and the system fence puts the
// clear before the credit for the NIC too), then hand the buffer back to every peer (our word [buffer][me] in
// each peer's credit area) with this call's tag.
__device__ void release_buffer(const LL& ll, int cells) {
    if (ll.p.has_remote_peers) {
        for (int c = threadIdx.x; c < cells; c += blockDim.x) *reinterpret_cast<volatile uint64_t*>(ll.arrival(c)) = 0;
        __syncthreads();
        if (threadIdx.x == 0) __threadfence_system();
        __syncthreads();
    }
    for (int r = threadIdx.x; r < ll.p.num_ranks; r += blockDim.x)
        if (!ll.masked(r)) signal_rank(ll, r, ll.credit_off(ll.p.rank), int64_t(uint32_t(ll.tag)));
    __syncthreads();
    if (threadIdx.x == 0) net_flush();
}

// A cell of a rank of another node: after its count `n` arrived (a signal op, unordered with the data), wait until
// its n messages' put-with-signals have all added to the cell's arrival word (each signal after its own data).
__device__ bool wait_arrivals(const LL& ll, int c, int n, int peer, int phase, int64_t& cycles) {
    if (n == 0) return true;
    int64_t value;
    return wait_signal(
        ll, reinterpret_cast<const int64_t*>(ll.arrival(c)), [n](int64_t v) { return v >= n; },
        [](int64_t v) { return int32_t(v); }, n, peer, phase, value, cycles);
}

// Non-hook calls launch the receive kernel as a programmatic dependent launch: once every send block has
// executed this, receive blocks may take free SM slots and wait on their signals while the sends finish (they
// synchronise through those signals, never through kernel completion). A no-op for an ordinary launch.
__device__ __forceinline__ void allow_receive_kernel_to_start() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// True in exactly one block: the last to finish (all earlier blocks' writes are visible to it). Send kernels
// need the system-scope fence (the last block then signals peers that read those writes over NVLink); receive
// kernels only hand the epoch to the next kernel, so a device-scope fence is enough and cheaper.
template <bool kPeersRead>
__device__ bool last_block(int32_t* ticket) {
    __shared__ bool is_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        if (kPeersRead)
            __threadfence_system();
        else
            __threadfence();
        is_last = atomicAdd(ticket, 1) == int(gridDim.x) - 1;
        if (is_last) __threadfence();
    }
    __syncthreads();
    return is_last;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
    return v;
}

// Message layout: int4 header (word 0 = source token), payload (bf16 row, or fp8 row then f32 scales).
// The whole block writes token t's message into `msg` (shared memory). Each thread issues all its loads of the
// row before converting any of them, so building a message costs one memory round trip, not one per group.
__device__ void build_message(const LL& ll, int t, uint8_t* msg) {
    const LowLatencyParams& p = ll.p;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
    if (threadIdx.x == 0) reinterpret_cast<int4*>(msg)[0] = make_int4(t, 0, 0, 0);
    const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(p.x) + int64_t(t) * p.hidden;
    uint8_t* payload = msg + 16;
    if (!p.use_fp8) {
        constexpr int kUnroll = 4;
        const int n = p.hidden / 8;
        for (int i0 = threadIdx.x; i0 < n; i0 += blockDim.x * kUnroll) {
            int4 v[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
                if (i0 + u * int(blockDim.x) < n)
                    v[u] = ld_input_v4(reinterpret_cast<const int4*>(x) + i0 + u * blockDim.x);
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
                if (i0 + u * int(blockDim.x) < n) reinterpret_cast<int4*>(payload)[i0 + u * blockDim.x] = v[u];
        }
        return;
    }
    float* scales = reinterpret_cast<float*>(payload + p.hidden);
    constexpr int kGroups = 4;  // groups of 128 channels per warp and pass: all of them at hidden 8192, 16 warps
    for (int g0 = warp; g0 < ll.S; g0 += kGroups * num_warps) {  // one warp per group, 4 channels per lane
        uint2 raw[kGroups];
#pragma unroll
        for (int i = 0; i < kGroups; ++i) {
            const int g = g0 + i * num_warps;
            if (g < ll.S) raw[i] = __ldg(reinterpret_cast<const uint2*>(x + g * 128 + lane * 4));
        }
#pragma unroll
        for (int i = 0; i < kGroups; ++i) {
            const int g = g0 + i * num_warps;
            if (g >= ll.S) break;  // warp-uniform
            const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw[i]);
            float v[4], amax = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = __bfloat162float(h[e]), amax = fmaxf(amax, fabsf(v[e]));
            amax = fmaxf(warp_max(amax), 1e-4f);
            float scale, scale_inv;
            if (p.round_scale) {  // scale_inv = 2^ceil(log2(amax / 448)), exactly
                const int bits = __float_as_int(__fmul_rn(amax, 1.0f / kFp8Max));
                const int e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0);
                scale_inv = __int_as_float((e + 127) << 23);
                scale = __int_as_float((127 - e) << 23);
            } else {
                scale_inv = __fmul_rn(amax, 1.0f / kFp8Max);
                scale = __fdiv_rn(kFp8Max, amax);
            }
            uint32_t packed = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float y = fminf(fmaxf(__fmul_rn(v[e], scale), -kFp8Max), kFp8Max);
                packed |= uint32_t(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3)) << (8 * e);
            }
            reinterpret_cast<uint32_t*>(payload + g * 128)[lane] = packed;
            if (lane == 0) scales[g] = scale_inv;
        }
    }
}

// before[k] += how many of the first n top-k entries (token-major, all tokens before this one) chose expert[k].
// One pass of the whole block with its loads in flight together, counted with shared-memory atomics.
__device__ void count_earlier_choices(const TopkIdx& topk, int n, const int64_t* expert, int* before, int K) {
    constexpr int kUnroll = 4;
    for (int j0 = threadIdx.x; j0 < n; j0 += blockDim.x * kUnroll) {
        int64_t v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = j0 + u * int(blockDim.x) < n ? topk[j0 + u * blockDim.x] : -1;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            if (v[u] < 0) continue;
            for (int k = 0; k < K; ++k)
                if (v[u] == expert[k]) atomicAdd(before + k, 1);
        }
    }
}

#if EP_RT_LL_PACKED
// The packed send's per-block facts, up to kShareTileCells experts, without a block-wide scan: each thread holds
// up to kPackedPreload of the N x K top-k ids in registers (loaded before the first message build, so their latency
// hides behind it); the block's histogram of them over the experts (hist, shared atomics, once per block) gives a
// cell's start as a sum over the lower local experts of its rank, which one warp per choice adds up.
constexpr int kPackedPreload = 4;

struct PreloadedIds {
    int64_t v[kPackedPreload];
    bool all;  // every id is in some thread's registers (n <= kPackedPreload x blockDim.x)
};

__device__ __forceinline__ PreloadedIds preload_ids(const TopkIdx& topk, int n) {
    PreloadedIds ids;
    ids.all = n <= kPackedPreload * int(blockDim.x);
#pragma unroll
    for (int u = 0; u < kPackedPreload; ++u) {
        const int j = int(threadIdx.x) + u * int(blockDim.x);
        ids.v[u] = ids.all && j < n ? topk[j] : -1;
    }
    return ids;
}

// id j of the n, from registers when preloaded (this thread's j only: j = threadIdx.x + u * blockDim.x)
template <typename Visit>
__device__ __forceinline__ void for_my_ids(const PreloadedIds& ids, const TopkIdx& topk, int n, Visit visit) {
    if (ids.all) {
#pragma unroll
        for (int u = 0; u < kPackedPreload; ++u) {
            const int j = int(threadIdx.x) + u * int(blockDim.x);
            if (j < n) visit(j, ids.v[u]);
        }
    } else {
        for (int j = threadIdx.x; j < n; j += blockDim.x) visit(j, topk[j]);
    }
}

// cell_start[k] = hist summed over [lower[k], expert[k]): one warp per choice k (K <= the block's warps).
__device__ __forceinline__ void cell_starts_from_hist(const int* hist, const int64_t* expert, const int64_t* lower,
                                                      int* cell_start, int K, int E) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    if (warp >= K) return;
    const int64_t e = expert[warp];
    int sum = 0;
    if (e >= 0 && e < E)
        for (int64_t v = lower[warp] + lane; v < e; v += kWarpSize) sum += hist[v];
    sum = __reduce_add_sync(0xffffffffu, sum);
    if (lane == 0) cell_start[warp] = sum;
}

// The packed position of token t's choices k (experts expert[k]; lower[k] = the first local expert of expert[k]'s
// rank; n_before = the entries of the tokens before t), for more experts than the histogram holds: before[k] as
// count_earlier_choices, and start[k] = how many of all n entries chose one of expert[k]'s rank's lower local
// experts, [lower[k], expert[k]). A pass over the entries per k (L1 serves the passes after the first), each
// thread's counts added per warp: two counters live at a time, not 2 x 16 (which spilled).
__device__ void count_packed_positions(const TopkIdx& topk, int n, int n_before, const int64_t* expert,
                                       const int64_t* lower, int* before, int* start, int K) {
    const int lane = threadIdx.x % kWarpSize;
    for (int k = 0; k < K; ++k) {
        const int64_t e = expert[k], lo = lower[k];
        int b = 0, c = 0;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const int64_t v = topk[j];
            b += v >= 0 && j < n_before && v == e;
            c += v >= 0 && v >= lo && v < e;
        }
        b = __reduce_add_sync(0xffffffffu, b), c = __reduce_add_sync(0xffffffffu, c);
        if (lane == 0 && b) atomicAdd(before + k, b);
        if (lane == 0 && c) atomicAdd(start + k, c);
    }
}
#endif

}  // namespace

// ------------------------------------------------------------------------------------------------
// Dispatch, send half: block per token (strided). The block builds the token's message once in shared memory,
// then warps_per_k warps per top-k entry k copy it to expert topk[t][k] at a slot fixed by token-major order, so
// the receive layout is deterministic (the reference's). Copying from shared memory instead of re-reading a
// staged row from L2 keeps the copy bound by NVLink stores; only NVSHMEM puts need the staged (symmetric) copy.
constexpr int kDispatchMessageInt4 = (16 + 2 * EP_RT_LL_MAX_HIDDEN) / 16;  // one message in shared memory

__device__ void dispatch_send(const LL& ll, int4* message) {
    const LowLatencyParams& p = ll.p;
    const int32_t credit = credit_prefetch(ll);
    bool free_checked = false;  // block-uniform
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
    const int R = p.num_ranks, me = p.rank, K = p.num_topk;
    const int warps_per_k = max(1, num_warps / max(K, 1));
    const int k = warp / warps_per_k, part = warp % warps_per_k;
    int32_t* counters = ll.ws + EP_RT_LL_WS_COUNTERS;
    // Bytes of the slot a message really uses (an FP8 message is about half the slot).
    const int64_t used_bytes = p.use_fp8 ? (16 + p.hidden + 4 * ll.S + 15) / 16 * 16 : 16 + 2 * int64_t(p.hidden);
    const int used_int4 = int(used_bytes / 16);
    const TopkIdx topk(p.topk_idx, p.topk_idx_bits);
    __shared__ int64_t expert[EP_RT_LL_MAX_TOPK];  // token t's choices
    __shared__ int before[EP_RT_LL_MAX_TOPK];  // choices of the same expert by earlier tokens
#if EP_RT_LL_PACKED
    __shared__ int cell_start[EP_RT_LL_MAX_TOPK];  // where the cell of expert[k] starts in our block at its rank
    __shared__ int64_t lower[EP_RT_LL_MAX_TOPK];  // the first local expert of expert[k]'s rank
    // Up to kShareTileCells experts (and K <= the block's warps), every cell start from one histogram of the block
    // (hist) and the earlier choices from the ids in registers; beyond, counted per token (count_packed_positions).
    __shared__ int hist[kShareTileCells];
    const int n_ids = p.num_tokens * K;
    const bool by_hist = p.num_experts <= kShareTileCells && K <= num_warps;
    const PreloadedIds ids = preload_ids(topk, by_hist && int(blockIdx.x) < p.num_tokens ? n_ids : 0);
    if (by_hist)
        for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) hist[e] = 0;  // ordered by the first sync
    bool hist_done = false;  // block-uniform
    const int64_t block_slots = int64_t(p.max_tokens) * min(EP_RT_LL_MAX_TOPK, ll.L);
    const int64_t stride = min(EP_RT_LL_MAX_TOPK, p.num_experts);  // staged copies per token (the host: K <= it)
#endif
    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
        if (int(threadIdx.x) < K) expert[threadIdx.x] = topk[int64_t(t) * K + threadIdx.x], before[threadIdx.x] = 0;
#if EP_RT_LL_PACKED
        if (int(threadIdx.x) < K) cell_start[threadIdx.x] = 0, lower[threadIdx.x] = expert[threadIdx.x] / ll.L * ll.L;
#endif
        build_message(ll, t, reinterpret_cast<uint8_t*>(message));
        __syncthreads();
#if EP_RT_LL_PACKED
        if (by_hist) {
            const int n_before = t * K, E = p.num_experts;
            for_my_ids(ids, topk, n_ids, [&](int j, int64_t v) {
                if (v < 0 || v >= E) return;  // out of range: reported by the send, not placed
                if (!hist_done) atomicAdd(hist + v, 1);
                if (j < n_before)
                    for (int kk = 0; kk < K; ++kk)
                        if (v == expert[kk]) atomicAdd(before + kk, 1);
            });
            hist_done = true;
            __syncthreads();
            cell_starts_from_hist(hist, expert, lower, cell_start, K, E);
        } else {
            count_packed_positions(topk, p.num_tokens * K, t * K, expert, lower, before, cell_start, K);
        }
        if (!free_checked) {  // the first writes into peers' buffers, or into staging they may still read
            wait_buffer_free(ll, credit);
            free_checked = true;
        } else {
            __syncthreads();
        }
        // A staged copy per choice bound to a rank of another node (its header says k), written only now: the
        // previous call's puts from this staging area are known received (buffer credits) after the check above.
        if (p.has_remote_peers) {
            for (int j = threadIdx.x; j < K * used_int4; j += blockDim.x) {
                const int kk = j / used_int4, i = j - kk * used_int4;
                const int64_t e = expert[kk];
                if (e < 0 || e >= p.num_experts || !ll.remote(int(e / ll.L))) continue;
                int4 v = message[i];
                if (i == 0) v.y = kk;
                reinterpret_cast<int4*>(ll.local(p.send_off + (t * stride + kk) * p.msg_bytes))[i] = v;
            }
            __syncthreads();
        }
#else
        // Deterministic slot of (t, k): how many (t', k') before it in token-major order chose the same expert.
        count_earlier_choices(topk, t * K, expert, before, K);
        if (!free_checked) {  // the first writes into peers' buffers follow: every peer must have read its last call
            wait_buffer_free(ll, credit);
            free_checked = true;
        }
        // The staged copy, written only now: the previous call's puts from this staging area are known received
        // (buffer credits) after the check above (a put's source is reusable once the put completed).
        uint8_t* staged = ll.local(p.send_off + int64_t(t) * p.msg_bytes);
        if (p.has_remote_peers)
            for (int i = threadIdx.x; i < used_int4; i += blockDim.x) reinterpret_cast<int4*>(staged)[i] = message[i];
        __syncthreads();
#endif
        if (k < K) {
            const int64_t e = expert[k];
            if ((e >= p.num_experts || e < -1) && lane == 0 && part == 0)  // out of range: reported, never followed
                report_error(ll.sink(), EP_RT_ERR_BAD_EXPERT, EP_RT_PHASE_LL_DISPATCH_SEND, -1, -1, e, p.num_experts);
            const int dst = (e >= 0 && e < p.num_experts) ? int(e / ll.L) : -1;
            if (dst >= 0 && !ll.masked(dst)) {
                int slot = before[k];
                for (int kk = 0; kk < k; ++kk) slot += expert[kk] == e;
                if (lane == 0 && part == 0) atomicAdd(counters + e, 1);  // totals, announced by the last block
                if (slot >= p.max_tokens) {  // only possible with duplicate experts in one token
                    if (lane == 0 && part == 0)
                        report_error(ll.sink(), EP_RT_ERR_CAPACITY, EP_RT_PHASE_LL_DISPATCH_SEND, -1, int(e), slot + 1,
                                     p.max_tokens);
                } else {
                    const int l = int(e % ll.L);
#if EP_RT_LL_PACKED
                    const int64_t pos = cell_start[k] + slot;
                    const bool fits = pos < block_slots;  // false only beside a cell past T, reported above
                    const int64_t off = p.recv_off + (int64_t(me) * block_slots + pos) * p.msg_bytes;
                    const uint8_t* staged = ll.local(p.send_off + (t * stride + k) * p.msg_bytes);
#else
                    const bool fits = true;
                    const int64_t off = p.recv_off + ((int64_t(l) * R + me) * p.max_tokens + slot) * p.msg_bytes;
#endif
                    const uint64_t base = ll.peer(dst);
                    if (fits && base != 0) {
                        int4* out = reinterpret_cast<int4*>(base + off);
#pragma unroll 4
                        for (int i = part * kWarpSize + lane; i < used_int4; i += warps_per_k * kWarpSize) {
#if EP_RT_LL_PACKED
                            int4 v = message[i];
                            if (i == 0) v.y = k;  // header word 1: the choice's k, for the combine's slot
                            st_na_v4(out + i, v);
#else
                            st_na_v4(out + i, message[i]);
#endif
                        }
                    } else if (fits && part == 0) {  // a whole warp; `staged` stays until dst's credit for this call
                        net_put_signal_warp(ll.local(off), staged, used_bytes, ll.arrival(int(l) * R + me), 1, dst);
                    }
                }
            }
        }
        __syncthreads();
    }
    if (!free_checked) wait_buffer_free(ll, credit);  // a block without tokens: the last block still signals
    // (after the __syncthreads that ends the loop or wait_buffer_free: every warp's puts are issued)
    if (threadIdx.x == 0) net_flush();
    if (!last_block<true>(ll.ws + EP_RT_LL_WS_TICKETS + kTicketDispatchSend)) return;
    // Last block: announce every (expert, me) count to the expert's rank, reset the slot counters. Over NVLink the
    // release store follows every block's stores (last_block's tickets and system fence); over the network the
    // count says how many put-with-signals to wait for, and needs no order of its own.
    for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) {
        const int dst = e / ll.L, l = e % ll.L;
        const int count = min(atomicExch(counters + e, 0), p.max_tokens);
        if (!ll.masked(dst))
            signal_rank(ll, dst, p.signal_off + (int64_t(l) * R + me) * 8, make_signal(ll.tag, p.shape_digest, count));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        net_flush();
        ll.ws[EP_RT_LL_WS_TICKETS + kTicketDispatchSend] = 0;
    }
}

extern "C" __global__ void __launch_bounds__(512) ep_rt_ll_dispatch_send(const LowLatencyParams p) {
    __shared__ int4 message[kDispatchMessageInt4];
    allow_receive_kernel_to_start();
    dispatch_send(LL(p), message);
}

// Dispatch receive, one batch of this block's messages (cell = (local expert l, source s), message i of the
// cell goes to row group_offset + i of expert l). Three outputs per message: the payload (int4 copies), the
// source token (word 0 of the header) and the FP8 scales (transposed to column-major, UE8M0 exponents packed
// 4 per word). One loop issues the loads of all three before any of their stores, so the batch costs about one
// memory round trip per kUnroll rows of work instead of one per output. Packed: cell c's messages start at slot
// cell_base(c) of its source's block, and the header's word 1 (the choice's k) goes to plane 1 of src_info.
// (The default build keeps its own signature: the same cubin bytes as before the packed variants.)
#if EP_RT_LL_PACKED
template <typename CellCount>
__device__ void copy_out_messages(const LL& ll, const ShareBatch& batch, int nb, CellCount cell_count) {
#else
__device__ void copy_out_messages(const LL& ll, const ShareBatch& batch, int nb) {
#endif
    const LowLatencyParams& p = ll.p;
    const int R = p.num_ranks;
    const int64_t RT = int64_t(R) * p.max_tokens;
    constexpr uint32_t kHeaderWords = EP_RT_LL_PACKED ? 2 : 1;  // header words copied out: the source token (, k)
    __shared__ int64_t msg_off[kShareBatch];  // the message, from the symmetric base
    __shared__ int expert_row[kShareBatch];  // its row within its local expert
    __shared__ int expert_of[kShareBatch];
#if EP_RT_LL_PACKED
    // Where each cell of the batch starts in its source's block: that source's counts to the lower local experts,
    // added by one warp per cell (a batch's messages come in runs of one cell; the first of each run sums).
    __shared__ int cell_base[kShareBatch];
    {
        const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
        for (int q = warp; q < nb; q += num_warps) {
            const int c = batch.cell[q], l = c / R, s = c % R;
            if (q > 0 && batch.cell[q - 1] == c) continue;  // (warp-uniform)
            int sum = 0;
            for (int m = lane; m < l; m += kWarpSize) sum += cell_count(m * R + s);
            sum = __reduce_add_sync(0xffffffffu, sum);
            if (lane == 0) cell_base[q] = sum;
        }
        __syncthreads();
    }
#endif
    if (int(threadIdx.x) < nb) {
        const int c = batch.cell[threadIdx.x], i = batch.index[threadIdx.x];
#if EP_RT_LL_PACKED
        int first = threadIdx.x;  // the run's first message, which holds the cell's base
        while (first > 0 && batch.cell[first - 1] == c) --first;
        const int64_t block_slots = int64_t(p.max_tokens) * min(EP_RT_LL_MAX_TOPK, ll.L);
        msg_off[threadIdx.x] = p.recv_off + (int64_t(c % R) * block_slots + cell_base[first] + i) * p.msg_bytes;
#else
        msg_off[threadIdx.x] = p.recv_off + (int64_t(c) * p.max_tokens + i) * p.msg_bytes;
#endif
        expert_row[threadIdx.x] = batch.group_offset[threadIdx.x] + i;
        expert_of[threadIdx.x] = c / R;
    }
    __syncthreads();
    const uint32_t payload_bytes = p.use_fp8 ? p.hidden : 2 * p.hidden;
    const uint32_t row_int4 = payload_bytes / 16, payload_total = uint32_t(nb) * row_int4;
    const uint32_t cols = !p.use_fp8 ? 0 : p.use_ue8m0 ? ll.S / 4 : ll.S;  // scale words per row
    const uint32_t side_total = uint32_t(nb) * (kHeaderWords + cols);  // header words + scale words
    uint8_t* recv_x = reinterpret_cast<uint8_t*>(p.recv_x);
    int32_t* src_info = reinterpret_cast<int32_t*>(p.recv_src_info);
    int32_t* scales_out = reinterpret_cast<int32_t*>(p.recv_x_scales);
    // Side item q: message q / (kHeaderWords + cols); words below kHeaderWords are the header's (the source
    // token, then k), word c + kHeaderWords the row's scale column c.
    auto load_side = [&](uint32_t q) -> int32_t {
        const uint32_t i = q / (kHeaderWords + cols), w = q - i * (kHeaderWords + cols);
        const uint8_t* msg = ll.local(msg_off[i]);
#if EP_RT_LL_PACKED
        if (w < kHeaderWords) return ld_peer_written_b32(reinterpret_cast<const int32_t*>(msg) + w);
#else
        if (w == 0) return ld_peer_written_b32(reinterpret_cast<const int32_t*>(msg));
#endif
        const int32_t* scales = reinterpret_cast<const int32_t*>(msg + 16 + p.hidden);
        if (!p.use_ue8m0) return ld_peer_written_b32(scales + (w - kHeaderWords));
        uint32_t word = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b)
            word |= ((uint32_t(ld_peer_written_b32(scales + 4 * (w - kHeaderWords) + b)) >> 23) & 0xFF) << (8 * b);
        return int32_t(word);
    };
    auto store_side = [&](uint32_t q, int32_t value) {
        const uint32_t i = q / (kHeaderWords + cols), w = q - i * (kHeaderWords + cols);
        const int64_t l = expert_of[i];
#if EP_RT_LL_PACKED
        if (w < kHeaderWords)  // plane w of src_info [2, L, R*T]
            src_info[(w * ll.L + l) * RT + expert_row[i]] = value;
#else
        if (w == 0)
            src_info[l * RT + expert_row[i]] = value;
#endif
        else
            scales_out[(l * cols + (w - kHeaderWords)) * RT + expert_row[i]] = value;
    };
    constexpr int kUnroll = 8;
    const uint32_t limit = max(payload_total, side_total);
    for (uint32_t j0 = threadIdx.x; j0 < limit; j0 += blockDim.x * kUnroll) {
        int4 v[kUnroll];
        int32_t side[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const uint32_t j = j0 + u * blockDim.x;
            if (j < payload_total) {
                const uint32_t i = j / row_int4, c = j - i * row_int4;
                v[u] = ld_peer_written_v4(reinterpret_cast<const int4*>(ll.local(msg_off[i] + 16)) + c);
            }
            if (j < side_total) side[u] = load_side(j);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const uint32_t j = j0 + u * blockDim.x;
            if (j < payload_total) {
                const uint32_t i = j / row_int4, c = j - i * row_int4;
                const int64_t row = int64_t(expert_of[i]) * RT + expert_row[i];
                st_na_v4(reinterpret_cast<int4*>(recv_x + row * payload_bytes) + c, v[u]);
            }
            if (j < side_total) store_side(j, side[u]);
        }
    }
}

// Every block of the grid has arrived here (all must be resident at once, as with a cooperative launch: the host
// sizes the grid by the kernel's occupancy). What any block observed before arriving is visible to every block
// after. The last block to arrive resets the count and completes the barrier by raising its generation, so the
// next barrier starts from zero whatever its grid (the one-kernel call and the hook's receive kernel differ).
// A block reads the generation before it arrives: it cannot move before every block, this one too, has.
__device__ void all_blocks_arrive(const LL& ll, int phase) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long* arrived = reinterpret_cast<unsigned long long*>(ll.ws + EP_RT_LL_WS_ARRIVED);
        unsigned long long* generation = reinterpret_cast<unsigned long long*>(ll.ws + EP_RT_LL_WS_ARRIVED_GEN);
        const unsigned long long mine = ld_acquire_gpu(generation);
        if (atomic_add_release_gpu(arrived, 1ull) == gridDim.x - 1) {
            __threadfence();  // after the add that saw every other block's (release) add: their writes are ours
            atomicExch(arrived, 0ull);
            atomic_add_release_gpu(generation, 1ull);
        } else {
            const uint64_t start = globaltimer_ns();
            // Twice the signal timeout: a block that waits for a silent rank arrives only after its own timeout.
            while (ld_acquire_gpu(generation) == mine) {
                if (int64_t(globaltimer_ns() - start) > 2 * ll.p.timeout_ns) {
                    report_error(ll.sink(), EP_RT_ERR_TIMEOUT, phase, -1, -1, int64_t(ld_acquire_gpu(arrived)),
                                 int64_t(gridDim.x));
                    break;
                }
            }
        }
    }
    __syncthreads();
}

// ------------------------------------------------------------------------------------------------
// Dispatch, receive half. Cells are (local expert l, source s), c = l * R + s; messages are placed expert by
// expert, sources ascending, so the layout is deterministic. Each block first waits for the count signals of
// its own cells (b, b + G, ...), then, once every block has, takes an even share of all messages.
// Packed: each cell starts where its source's counts to the lower local experts end (copy_out_messages adds them up).
__device__ void dispatch_recv(const LL& ll, int32_t* early, ShareSmem& share) {
    const LowLatencyParams& p = ll.p;
    const int R = p.num_ranks, E = p.num_experts;
    const int32_t tag = ll.tag;
    const int64_t* signals = reinterpret_cast<const int64_t*>(ll.local(p.signal_off));
    for (int c = blockIdx.x + threadIdx.x * gridDim.x; c < E; c += blockDim.x * gridDim.x) {
        const int s = c % R;
        int64_t value = 0;
        int64_t cycles = 0;
        if (!ll.masked(s))
            if (wait_signal(
                    ll, signals + c, [tag](int64_t v) { return tag_of_signal(v) == tag; }, tag_of_signal, tag, s,
                    EP_RT_PHASE_LL_DISPATCH_RECV, value, cycles) &&
                same_shape(ll, value, s, EP_RT_PHASE_LL_DISPATCH_RECV) && ll.remote(s))
                wait_arrivals(ll, c, count_of_signal(value), s, EP_RT_PHASE_LL_DISPATCH_RECV, cycles);
        if (p.wait_stats && cycles)
            atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + s, (unsigned long long)cycles);
    }
    // Read every signal now, while other blocks may still be waiting: most have arrived, and those that have
    // hold their final value, so after the barrier only the others are read again. early[c]: the count, or -1.
    auto arrived_count = [&](int c) -> int {
        const int64_t v = *reinterpret_cast<const volatile int64_t*>(signals + c);
        if (tag_of_signal(v) != tag) return -1;
        return digest_of_signal(v) == (p.shape_digest & 0xFFFF) ? count_of_signal(v) : 0;
    };
    const bool prefetched = E <= kShareTileCells;
    for (int c = threadIdx.x; prefetched && c < E; c += blockDim.x) early[c] = arrived_count(c);
    all_blocks_arrive(ll, EP_RT_PHASE_LL_DISPATCH_RECV);
    // Every block has read the tag: the next call on this buffer may use the next one.
    if (blockIdx.x == 0 && threadIdx.x == 0) ll.ws[EP_RT_LL_WS_EPOCH + p.buffer_idx] += 1;
    // A masked or silent source sends nothing.
    auto count = [&](int c) -> int {
        if (ll.masked(c % R)) return 0;
        const int early_count = prefetched ? early[c] : -1;
        const int n = early_count >= 0 ? early_count : arrived_count(c);
        return max(n, 0);
    };
    // Per-cell outputs, each cell by one block: layout_range, the expert's count, the cumulative stats.
    auto cell_outputs = [&](int c0, int n, const int* start) {
        for (int c = threadIdx.x; c < n; c += blockDim.x) {
            const int cell = c0 + c;
            if (cell % gridDim.x != blockIdx.x) continue;
            const int l = cell / R, s = cell % R, begin = start[c] - start[c - s], num = start[c + 1] - start[c];
            reinterpret_cast<int64_t*>(p.recv_layout_range)[cell] = (int64_t(begin) << 32) | int64_t(num);
            if (s == R - 1) reinterpret_cast<int32_t*>(p.recv_count)[l] = begin + num;
            if (p.cumulative_stats && num) atomicAdd(reinterpret_cast<int32_t*>(p.cumulative_stats) + l, num);
        }
    };
    for_each_share_batch(share, E, R, count, cell_outputs,
#if EP_RT_LL_PACKED
                         [&](int nb, const ShareBatch& batch) { copy_out_messages(ll, batch, nb, count); });
#else
                         [&](int nb, const ShareBatch& batch) { copy_out_messages(ll, batch, nb); });
#endif
    if (!last_block<false>(ll.ws + EP_RT_LL_WS_TICKETS + kTicketDispatchRecv)) return;
    release_buffer(ll, E);
    if (threadIdx.x == 0) ll.ws[EP_RT_LL_WS_TICKETS + kTicketDispatchRecv] = 0;
}

extern "C" __global__ void __launch_bounds__(256) ep_rt_ll_dispatch_recv(const LowLatencyParams p) {
    __shared__ int32_t early[kShareTileCells];
    __shared__ ShareSmem share;
    dispatch_recv(LL(p), early, share);
}

// One kernel per dispatch (no receive hook): every block sends its tokens, then takes its share of the receive.
// The two halves use shared memory one after the other, so it is one union (the message would not fit beside the
// receive's tiles). Launched cooperatively: a block that waits in the receive half never keeps a block that has
// yet to send from running.
union DispatchSmem {
    int4 message[kDispatchMessageInt4];
    struct {
        int32_t early[kShareTileCells];
        ShareSmem share;
    } recv;
};

extern "C" __global__ void __launch_bounds__(512) ep_rt_ll_dispatch(const LowLatencyParams p) {
    __shared__ DispatchSmem smem;
    const LL ll(p);
    dispatch_send(ll, smem.message);
    __syncthreads();  // every thread is done with the message before the receive's tiles overwrite it
    dispatch_recv(ll, smem.recv.early, smem.recv.share);
}

// ------------------------------------------------------------------------------------------------
// Combine, send half: every row of the dispatch layout goes back to its source rank s, into s's receive slot
// [global expert][source token], as bf16 or (use_logfmt) LogFMT-encoded on the way. Blocks take even shares of
// the rows (cell (l, s) holds layout_range's count; the handle's begin is the count prefix over s, which is
// the share walk's group offset). NVLink peers get stores from the whole block; remote ranks a warp per row.
__device__ void combine_send(const LL& ll, ShareSmem& share) {
    const LowLatencyParams& p = ll.p;
    wait_buffer_free(ll, credit_prefetch(ll));
    const int R = p.num_ranks, me = p.rank;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
    const int64_t RT = int64_t(R) * p.max_tokens, row_bytes = int64_t(p.hidden) * 2;
    const int64_t* ranges = reinterpret_cast<const int64_t*>(p.recv_layout_range);
    __shared__ uint64_t nvl_dst[kShareBatch], nvl_src[kShareBatch];  // rows for NVLink peers
    __shared__ int64_t remote_row[kShareBatch], remote_slot[kShareBatch];
    __shared__ int remote_rank[kShareBatch];
    __shared__ int num_nvl, num_remote;
    auto send_batch = [&](int nb, const ShareBatch& batch) {
        if (threadIdx.x == 0) num_nvl = num_remote = 0;
        __syncthreads();
        if (int(threadIdx.x) < nb) {
            const int c = batch.cell[threadIdx.x], l = c / R, s = c % R;
            if (!ll.masked(s)) {
                const int64_t row = int64_t(l) * RT + batch.group_offset[threadIdx.x] + batch.index[threadIdx.x];
                const int t = reinterpret_cast<const int32_t*>(p.recv_src_info)[row];
#if EP_RT_LL_PACKED
                // the choice's k, which the dispatch kept in plane 1 of src_info (the host checks the handle has it)
                const int k = reinterpret_cast<const int32_t*>(p.recv_src_info)[int64_t(ll.L) * RT + row];
                const int64_t stride = min(EP_RT_LL_MAX_TOPK, p.num_experts);  // the source's slots per token
                const int64_t slot = p.recv_off + (t * stride + k) * p.msg_bytes;
#else
                const int64_t slot = p.recv_off + ((int64_t(me) * ll.L + l) * p.max_tokens + t) * p.msg_bytes;
#endif
                const uint64_t base = ll.peer(s);
                if (base != 0) {
                    const int q = atomicAdd(&num_nvl, 1);
                    nvl_dst[q] = base + slot;
                    // zero_copy: the caller already wrote the row into the staging area (same packed position).
                    nvl_src[q] = p.zero_copy ? reinterpret_cast<uint64_t>(ll.local(p.send_off + row * p.msg_bytes))
                                             : p.x + uint64_t(row * row_bytes);
                } else {
                    const int q = atomicAdd(&num_remote, 1);
                    remote_row[q] = row, remote_slot[q] = slot, remote_rank[q] = s;
                }
            }
        }
        __syncthreads();
        if (p.use_logfmt)
            block_send_rows<true>(nvl_dst, nvl_src, num_nvl, p.hidden);  // host forbids zero_copy
        else
            block_send_rows<false>(nvl_dst, nvl_src, num_nvl, p.hidden);
        for (int q = warp; q < num_remote; q += num_warps) {
            const int64_t row = remote_row[q];
            uint8_t* staged = ll.local(p.send_off + row * p.msg_bytes);
            const uint8_t* x_row = reinterpret_cast<const uint8_t*>(p.x) + row * row_bytes;
            if (p.use_logfmt)
                warp_encode_row(staged, x_row, p.hidden, lane);  // payload and meta: msg_bytes
            else if (!p.zero_copy)
                warp_copy<Src::kPeerWritten>(staged, x_row, row_bytes, lane);
            __syncwarp();
            const int cell = int(remote_row[q] / RT) * R + me;  // (my local expert l, me): the receiver's word
            net_put_signal_warp(ll.local(remote_slot[q]), staged, p.use_logfmt ? p.msg_bytes : row_bytes,
                                ll.arrival(cell), 1, remote_rank[q]);
        }
    };
    for_each_share_batch(
        share, ll.L * R, R, [&](int c) { return int(ranges[c] & 0xFFFFFFFF); }, [](int, int, const int*) {},
        send_batch);
    // for_each_share_batch ends with a __syncthreads: every warp's puts are issued (queued, under chaos).
    if (threadIdx.x == 0) net_flush();
    if (!last_block<true>(ll.ws + EP_RT_LL_WS_TICKETS + kTicketCombineSend)) return;
    // Flag (expert me*L + l) at every rank, with the rows sent to it (a rank of another node waits for that many
    // arrivals; a masked one got none).
    for (int i = threadIdx.x; i < ll.L * R; i += blockDim.x) {
        const int dst = i % R, l = i / R;
        if (!ll.masked(dst))
            signal_rank(ll, dst, p.signal_off + (int64_t(l) * R + me) * 8,
                        make_signal(ll.tag, p.shape_digest, int(ranges[l * R + dst] & 0xFFFFFFFF)));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        net_flush();
        ll.ws[EP_RT_LL_WS_TICKETS + kTicketCombineSend] = 0;
    }
}

extern "C" __global__ void __launch_bounds__(256, 3) ep_rt_ll_combine_send(const LowLatencyParams p) {
    __shared__ ShareSmem share;
    allow_receive_kernel_to_start();
    combine_send(LL(p), share);
}

// acc[j] += w * y[j] for the 8 bf16 of v: an f32 multiply then an f32 add (no FMA), as the reference.
__device__ __forceinline__ void accumulate_bf16x8(const int4& v, float w, float acc[8]) {
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], __fmul_rn(w, __bfloat162float(h[j])));
}

// Plain rows: int4 i of every valid row k (row_off[k] >= 0), all loaded before the sum so the loads overlap.
__device__ __forceinline__ void accumulate_rows(const LL& ll, const int64_t* row_off, const float* weight, int K, int i,
                                                float acc[8]) {
    int4 v[EP_RT_LL_MAX_TOPK];
#pragma unroll
    for (int k = 0; k < EP_RT_LL_MAX_TOPK; ++k)
        if (k < K && row_off[k] >= 0)
            v[k] = ld_peer_written_v4(reinterpret_cast<const int4*>(ll.local(row_off[k])) + i);
#pragma unroll
    for (int k = 0; k < EP_RT_LL_MAX_TOPK; ++k)
        if (k < K && row_off[k] >= 0) accumulate_bf16x8(v[k], weight[k], acc);
}

// LogFMT rows: int4 i (8 channels of division i / 16) of every valid row. The castable form (low code bytes,
// high bits and signs) and the meta word are loaded together into one int4 per row, as most divisions are
// castable; a division that is not is reloaded as bf16 once its meta is known. Same sum order as above.
__device__ __forceinline__ void accumulate_logfmt_rows(const LL& ll, const int64_t* row_off, const float* weight, int K,
                                                       int i, float acc[8]) {
    const int hidden = ll.p.hidden;
    int4 v[EP_RT_LL_MAX_TOPK];  // castable: (low.x, low.y, high bits and signs, meta); otherwise 8 bf16
    uint32_t castable = 0;  // bit k: row k's division is castable
#pragma unroll
    for (int k = 0; k < EP_RT_LL_MAX_TOPK; ++k) {
        if (k >= K || row_off[k] < 0) continue;
        const uint8_t* slot = ll.local(row_off[k]);
        const uint2 low = ld_peer_written_v2(reinterpret_cast<const uint2*>(slot + logfmt_low_offset(i)));
        const uint16_t high = ld_peer_written_b16(reinterpret_cast<const uint16_t*>(slot + logfmt_high_offset(i)));
        const int32_t* meta = reinterpret_cast<const int32_t*>(slot + logfmt_meta_offset(i, hidden));
        v[k] = make_int4(int(low.x), int(low.y), int(high), ld_peer_written_b32(meta));
    }
#pragma unroll
    for (int k = 0; k < EP_RT_LL_MAX_TOPK; ++k) {
        if (k >= K || row_off[k] < 0) continue;
        const uint32_t meta = uint32_t(v[k].w);
        if (logfmt_castable(logfmt_meta_amax(meta), logfmt_meta_amin(meta)))
            castable |= 1u << k;
        else
            v[k] = ld_peer_written_v4(reinterpret_cast<const int4*>(ll.local(row_off[k]) + logfmt_bf16_offset(i)));
    }
#pragma unroll
    for (int k = 0; k < EP_RT_LL_MAX_TOPK; ++k) {
        if (k >= K || row_off[k] < 0) continue;
        if (!(castable >> k & 1)) {
            accumulate_bf16x8(v[k], weight[k], acc);
            continue;
        }
        const uint32_t meta = uint32_t(v[k].w);
        const LogFmtDivision d = logfmt_division(logfmt_meta_amax(meta), logfmt_meta_amin(meta));
        const LogFmtPart part{make_uint2(uint32_t(v[k].x), uint32_t(v[k].y)), uint32_t(v[k].z)};
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], __fmul_rn(weight[k], logfmt_decode(part, j, d)));
    }
}

// ------------------------------------------------------------------------------------------------
// Combine, receive half: work item = (token t, chunk of the hidden row). Chunks are as few as still give every
// block one item (so a block waits on a token's signals once and then streams its chunk), and at most
// blockDim.x int4 each, so a small batch still fills every SM. out[t] = sum over k ascending of w[t,k] * y_k, an f32 multiply then an f32 add (no FMA,
// as the reference), skipping -1 and masked ranks. All K rows are loaded before the sum so the loads overlap.
__device__ void combine_recv(const LL& ll) {
    const LowLatencyParams& p = ll.p;
    const int K = p.num_topk;
    const int hidden_int4 = p.hidden / 8;
    const int chunks =
        min((hidden_int4 + int(blockDim.x) - 1) / int(blockDim.x), max(1, int(gridDim.x) / max(p.num_tokens, 1)));
    const int chunk_int4 = (hidden_int4 + chunks - 1) / chunks;
    __shared__ int64_t row_off[EP_RT_LL_MAX_TOPK];
    __shared__ float weight[EP_RT_LL_MAX_TOPK];
    for (int item = blockIdx.x; item < p.num_tokens * chunks; item += gridDim.x) {
        const int t = item / chunks, chunk = item - t * chunks;
        const int chunk_end = min(hidden_int4, (chunk + 1) * chunk_int4);
        if (threadIdx.x < EP_RT_LL_MAX_TOPK) {
            const int k = threadIdx.x;
            int64_t off = -1;
            if (k < K) {
                const int64_t e = TopkIdx(p.topk_idx, p.topk_idx_bits)[int64_t(t) * K + k];
                if (e >= 0 && e < p.num_experts && !ll.masked(int(e / ll.L))) {
                    int64_t value;
                    int64_t cycles = 0;
                    const int32_t tag = ll.tag;
                    const int src = int(e / ll.L);
                    const int64_t flag = (e % ll.L) * p.num_ranks + src;  // word l * R + source
                    if (wait_signal(
                            ll, reinterpret_cast<const int64_t*>(ll.local(p.signal_off + flag * 8)),
                            [tag](int64_t v) { return tag_of_signal(v) == tag; }, tag_of_signal, tag, src,
                            EP_RT_PHASE_LL_COMBINE_RECV, value, cycles) &&
                        same_shape(ll, value, src, EP_RT_PHASE_LL_COMBINE_RECV) &&
                        (!ll.remote(src) || wait_arrivals(ll, int(flag), count_of_signal(value), src,
                                                          EP_RT_PHASE_LL_COMBINE_RECV, cycles)))
#if EP_RT_LL_PACKED
                        off = p.recv_off + (t * min(EP_RT_LL_MAX_TOPK, p.num_experts) + k) * p.msg_bytes;
#else
                        off = p.recv_off + (e * p.max_tokens + t) * p.msg_bytes;
#endif
                    if (p.wait_stats && cycles)
                        atomicAdd(reinterpret_cast<unsigned long long*>(p.wait_stats) + e / ll.L,
                                  (unsigned long long)cycles);
                }
                weight[k] = reinterpret_cast<const float*>(p.topk_weights)[int64_t(t) * K + k];
            }
            row_off[k] = off;
        }
        __syncthreads();
        for (int i = chunk * chunk_int4 + threadIdx.x; i < chunk_end; i += blockDim.x) {
            float acc[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
            if (p.use_logfmt)
                accumulate_logfmt_rows(ll, row_off, weight, K, i, acc);
            else
                accumulate_rows(ll, row_off, weight, K, i, acc);
            int4 packed;
            __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
            for (int j = 0; j < 8; ++j) h[j] = __float2bfloat16_rn(acc[j]);
            reinterpret_cast<int4*>(p.recv_x)[int64_t(t) * hidden_int4 + i] = packed;
        }
        __syncthreads();
    }
    if (!last_block<false>(ll.ws + EP_RT_LL_WS_TICKETS + kTicketCombineRecv)) return;
    release_buffer(ll, p.num_experts);
    if (threadIdx.x == 0) {
        ll.ws[EP_RT_LL_WS_TICKETS + kTicketCombineRecv] = 0;
        ll.ws[EP_RT_LL_WS_EPOCH + p.buffer_idx] += 1;
    }
}

extern "C" __global__ void __launch_bounds__(256, 2) ep_rt_ll_combine_recv(const LowLatencyParams p) {
    combine_recv(LL(p));
}

// One kernel per combine (no receive hook): every block sends its share of the rows, then sums its tokens.
// Launched cooperatively, as the dispatch.
extern "C" __global__ void __launch_bounds__(256, 2) ep_rt_ll_combine(const LowLatencyParams p) {
    __shared__ ShareSmem share;
    const LL ll(p);
    combine_send(ll, share);
    combine_recv(ll);
}

// ------------------------------------------------------------------------------------------------
// A time-limited barrier over the unmasked ranks (clean_low_latency_buffer, teardown): one block writes
// p.barrier_seq into its word at every rank, then waits until every unmasked peer's word here holds at least it.
// In shrink mode a peer that never comes is masked; otherwise the timeout is reported like any other. NVSHMEM's
// own barrier has no deadline and no mask.
extern "C" __global__ void __launch_bounds__(256) ep_rt_ll_barrier(const LowLatencyParams p) {
    const LL ll(p);
    const int R = p.num_ranks;
    // Signal every rank, masked ones too (a rank masked here may be alive and waiting for us: masks are each rank's
    // own view), but wait only for the unmasked ones.
    for (int r = threadIdx.x; r < R; r += blockDim.x)
        signal_rank(ll, r, p.signal_off + int64_t(p.rank) * 8, p.barrier_seq);
    __syncthreads();
    if (threadIdx.x == 0) net_flush();
    const int64_t seq = p.barrier_seq;
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        if (ll.masked(r)) continue;
        int64_t value, cycles = 0;
        wait_signal(
            ll, reinterpret_cast<const int64_t*>(ll.local(p.signal_off + int64_t(r) * 8)),
            [seq](int64_t v) { return v >= seq; }, [](int64_t v) { return int32_t(v); }, int32_t(seq), r,
            EP_RT_PHASE_LL_BARRIER, value, cycles);
    }
    __syncthreads();
    if (threadIdx.x == 0) __threadfence_system();
}

// ------------------------------------------------------------------------------------------------
// Test hook, never launched by ep_rt itself (tests/gpu/test_chaos_transport_gpu.py): one block puts to rank
// rank ^ 1 through net.cuh in patterns whose end state tells a transport that applies puts at once and in issue
// order (NVSHMEM over P2P) from one that applies them late and reordered (the chaos variant). Every put is a
// put-with-signal whose signal adds 1 to a sink word, unless said otherwise:
//   1. late:     4096 bytes whose source is rewritten (bit 23 of every word set) before the flush; the bug that
//                reusing a source before its destination acknowledged it is: P2P delivers the old words, chaos the
//                new ones;
//   2. order:    64 pairs of 64-byte puts to one destination each (words 1, then words 2), nothing between;
//   3. overtake: 64 words, each a put of 100 then a separate signal add of 1 to that same word: 101 where the
//                signal came after the data, 100 where it overtook it;
//   4. own:      64 put_signals whose signal word is their own data word (100, then + 1): always 101, since a
//                signal never overtakes its own data (the word's overlap is the probe's trick, not a legal use);
//   5. flood:    more puts than a chaos queue holds (EP_RT_NET_CHAOS_SLOTS + 64), after a first flush: all arrive;
//   6. a quiet: the chaos build's cost mode counts it and charges it a sweep (ep_rt_net_stats).
// Then the sink must hold 1 + 2 * 64 + 64 + (EP_RT_NET_CHAOS_SLOTS + 64): no signal lost.
// Sources at sym_base + send_off, destinations at sym_base + recv_off, packed in the order above, the sink last (the
// test mirrors the sizes). The host zeroes the destinations everywhere first, then runs this on every rank (an
// even number), synchronises, and reads its own destinations.
namespace {
constexpr int kProbeLate = 4096, kProbePairs = 64, kProbeRow = 64, kProbeFlood = EP_RT_NET_CHAOS_SLOTS + 64;
}

extern "C" __global__ void __launch_bounds__(256) ep_rt_ll_net_probe(const LowLatencyParams p) {
    const int me = p.rank, peer = p.rank ^ 1;
    const int warp = threadIdx.x / kWarpSize, num_warps = blockDim.x / kWarpSize;
    uint8_t* src = reinterpret_cast<uint8_t*>(p.sym_base + p.send_off);
    uint8_t* dst = reinterpret_cast<uint8_t*>(p.sym_base + p.recv_off);  // symmetric: the same offset at the peer
    int32_t* late = reinterpret_cast<int32_t*>(src);
    int32_t* first = reinterpret_cast<int32_t*>(src + kProbeLate);
    int32_t* second = first + kProbePairs * kProbeRow / 4;
    uint64_t* value = reinterpret_cast<uint64_t*>(second + kProbePairs * kProbeRow / 4);
    int4* flood = reinterpret_cast<int4*>(value + kProbePairs);
    uint8_t* d_late = dst;
    uint8_t* d_order = dst + kProbeLate;
    uint64_t* d_overtake = reinterpret_cast<uint64_t*>(d_order + kProbePairs * kProbeRow);
    uint64_t* d_own = d_overtake + kProbePairs;
    int4* d_flood = reinterpret_cast<int4*>(d_own + kProbePairs);
    uint64_t* sink = reinterpret_cast<uint64_t*>(d_flood + kProbeFlood);

    for (int i = threadIdx.x; i < kProbeLate / 4; i += blockDim.x) late[i] = (me << 24) | i;
    for (int i = threadIdx.x; i < kProbePairs * kProbeRow / 4; i += blockDim.x) first[i] = 1, second[i] = 2;
    for (int i = threadIdx.x; i < kProbePairs; i += blockDim.x) value[i] = 100;
    for (int i = threadIdx.x; i < kProbeFlood; i += blockDim.x) flood[i] = make_int4(i, me + 1, 7, ~i);
    __syncthreads();
    if (warp == 0) net_put_signal_warp(d_late, late, kProbeLate, sink, 1, peer);  // 1
    __syncthreads();
    for (int i = threadIdx.x; i < kProbeLate / 4; i += blockDim.x) late[i] |= 1 << 23;  // before the flush: a bug
    for (int j = warp; j < kProbePairs; j += num_warps) {
        net_put_signal_warp(d_order + j * kProbeRow, first + j * kProbeRow / 4, kProbeRow, sink, 1, peer);  // 2
        net_put_signal_warp(d_order + j * kProbeRow, second + j * kProbeRow / 4, kProbeRow, sink, 1, peer);
        net_put_signal_warp(d_overtake + j, value + j, 8, sink, 1, peer);  // 3
        if (threadIdx.x % kWarpSize == 0) net_signal_add(d_overtake + j, 1, peer);
        __syncwarp();
    }
    for (int j = 0; j < kProbePairs; ++j) net_put_signal_block(d_own + j, value + j, 8, d_own + j, 1, peer);  // 4
    __syncthreads();
    if (threadIdx.x == 0) net_flush();
    __syncthreads();
    for (int j = warp; j < kProbeFlood; j += num_warps) net_put_signal_warp(d_flood + j, flood + j, 16, sink, 1, peer);
    __syncthreads();
    if (threadIdx.x == 0) net_quiet();  // 6. the one quiet of ep_rt's code: the chaos build counts and charges it
}
