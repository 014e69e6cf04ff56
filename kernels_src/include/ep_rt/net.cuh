// The network calls of ep_rt's kernels: every NVSHMEM put, signal and quiet towards a rank of another node goes
// through these wrappers, so one place says which NVSHMEM device calls ep_rt relies on (standard ones only: they
// run over IBGDA, IBRC, UCX and libfabric alike) and a test build can swap the transport for one that behaves
// like a real network (EP_RT_CHAOS_TRANSPORT: puts applied late, split and reordered, each signal only after its
// own data).
//
// Contract for callers (what a real network allows, and the chaos build enforces):
//   * after net_put*(src, ...) the source bytes must stay unchanged until the caller's next net_quiet();
//   * a signal word says nothing about any put but its own (put_signal) or the ones before a net_quiet();
//   * a reader waits for the exact value of its word for this call, never for "at least some" progress.
//   * every block that called net_put* calls net_quiet() before the kernel ends, on every path (error paths
//     too), and before it waits for anything its own puts cause: the chaos build delivers a block's puts only in
//     its net_quiet() (a real network also makes progress without one, so this rule is stricter than NVSHMEM;
//     breaking it shows up there as a receiver's timeout, or as a warning when a later kernel finds the queue).
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>

#include <stdint.h>

#ifndef EP_RT_CHAOS_TRANSPORT
#define EP_RT_CHAOS_TRANSPORT 0
#endif

// The chaos build's queues (below): one per block index up to EP_RT_NET_CHAOS_QUEUES, each holding up to
// EP_RT_NET_CHAOS_SLOTS messages between two net_quiet() calls. Defined in both builds for the probe kernel
// (low_latency.cu), which puts more than a queue holds.
#define EP_RT_NET_CHAOS_QUEUES 1024
#define EP_RT_NET_CHAOS_SLOTS 512

namespace ep_rt {

namespace net_detail {
__device__ __forceinline__ uint32_t lane_id() {
    uint32_t v;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(v));
    return v;
}
}  // namespace net_detail

#if !EP_RT_CHAOS_TRANSPORT

// The whole block: `bytes` from this rank's `src` to `dst` (a symmetric address, as on this rank) of rank `pe`,
// then `*sig += value` there once the data is visible to `pe`.
__device__ __forceinline__ void net_put_signal_block(void* dst, const void* src, size_t bytes, uint64_t* sig,
                                                     uint64_t value, int pe) {
#if defined(__CUDACC_RTC__)
    // NVRTC (the cu12 flavour): its uint64_t is unsigned long long (libcu++'s cstdint prelude), but
    // libnvshmem_device.a was compiled where it is unsigned long, so the put-with-signal's internal
    // nvshmemi_transfer_put_signal<BLOCK>(..., uint64_t signal, ...) has no definition to link (nvJitLink:
    // undefined reference). The same semantics from calls that link: the block's put, then one thread quiets
    // (the data is delivered) and adds the signal. Slower on IBGDA (a quiet per message); cu13 is unaffected.
    nvshmemx_putmem_nbi_block(dst, src, bytes, pe);
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        nvshmem_quiet();
        nvshmemx_signal_op(sig, value, NVSHMEM_SIGNAL_ADD, pe);
    }
    __syncthreads();
#else
    nvshmemx_putmem_signal_nbi_block(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_ADD, pe);
#endif
}

// One warp: as net_put_signal_block.
__device__ __forceinline__ void net_put_signal_warp(void* dst, const void* src, size_t bytes, uint64_t* sig,
                                                    uint64_t value, int pe) {
#if defined(__CUDACC_RTC__)
    // NVRTC: the put-with-signal does not link (see net_put_signal_block); put, quiet, signal instead.
    nvshmemx_putmem_nbi_warp(dst, src, bytes, pe);
    __syncwarp();
    if (net_detail::lane_id() == 0) {
        nvshmem_quiet();
        nvshmemx_signal_op(sig, value, NVSHMEM_SIGNAL_ADD, pe);
    }
    __syncwarp();
#else
    nvshmemx_putmem_signal_nbi_warp(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_ADD, pe);
#endif
}

// One warp: a put without a signal (ordered only by a later net_quiet()).
__device__ __forceinline__ void net_put_warp(void* dst, const void* src, size_t bytes, int pe) {
    nvshmemx_putmem_nbi_warp(dst, src, bytes, pe);
}

// One thread: `*sig += value` at rank `pe` (no data: an empty range still announces itself).
__device__ __forceinline__ void net_signal_add(uint64_t* sig, uint64_t value, int pe) {
    nvshmemx_signal_op(sig, value, NVSHMEM_SIGNAL_ADD, pe);
}

// One thread, after a __syncthreads() that follows the block's puts: every put this thread's block issued is
// complete (delivered, and its source reusable).
__device__ __forceinline__ void net_quiet() { nvshmem_quiet(); }

#else  // EP_RT_CHAOS_TRANSPORT

// The chaos transport (INTERNODE.md 4.5), a test build of the same calls. A put or signal is not performed when
// called: its descriptor (dst, src, bytes, pe, signal word and value) goes into the calling block's queue in
// device memory, and the block's next net_quiet() delivers the queue:
//   * whole messages in a pseudo-random order (seeded per call from %globaltimer, clock64, %gridid and the block),
//     with random pauses before and between them, so signals of different messages overtake each other's data;
//   * each message's data split into up to kMaxPieces pieces (16-byte multiples) applied in a random order, the
//     source read only then (a send area rewritten before net_quiet delivers the rewritten bytes);
//   * each message's signal only after its own data is complete: its pieces as nvshmem_putmem_nbi, then
//     nvshmem_quiet, then nvshmemx_signal_op. Never earlier.
// Delivery uses standard NVSHMEM calls only, so the chaos build runs over whatever transport NVSHMEM has (in the
// tests: P2P between emulated nodes, EP_RT_RANKS_PER_NODE). It enforces the contract at the top of this file,
// no more: NVSHMEM itself may deliver any time between the put and the quiet.
//
// Limits of a test mode. A block with linear index >= kQueues, or whose queue already holds kSlots messages, has
// that put delivered at once by the calling thread (split, reordered and signalled after its data, but not late);
// the first time, a warning is printed. There is one queue per block index of a module: two kernels of one module
// putting at the same time would share queues (each net_quiet then delivers the other's messages too, early, as a
// network may); a message queued by another kernel (an earlier one that ended without net_quiet, or a concurrent
// one) prints a warning when it is delivered.
namespace net_chaos {

constexpr uint32_t kQueues = EP_RT_NET_CHAOS_QUEUES;
constexpr uint32_t kSlots = EP_RT_NET_CHAOS_SLOTS;  // <= 65536 (Queue::order is 16-bit)
constexpr int kMaxPieces = 8;
constexpr uint32_t kMaxGapNs = 2000;     // pause between messages (and, one time in four, between pieces)
constexpr uint32_t kMaxStartNs = 20000;  // pause before a net_quiet delivers anything

struct Message {
    void* dst;
    const void* src;
    uint64_t bytes;
    uint64_t* sig;           // nullptr: no signal
    uint64_t value;
    unsigned long long grid; // %gridid of the kernel that queued it
    int32_t pe;
    uint32_t seq;            // its slot number + 1 once the descriptor is written (0: never written)
};

struct Queue {
    uint32_t head;           // messages [head, tail) are queued (32-bit slot numbers, wrapping); only net_quiet
    uint32_t tail;           // moves head, enqueue reserves at tail
    int32_t busy;            // a net_quiet is delivering this queue
    uint32_t unused;
    uint16_t order[kSlots];  // net_quiet's scratch: the delivery order
    Message slot[kSlots];
};

// Zero-initialised, as every .global variable (PTX ISA). ~29 MiB of device memory per module load, no cubin bytes.
static __device__ Queue queues[kQueues];
static __device__ int warned_at_once, warned_foreign;

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long grid_id() {
    unsigned long long v;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(v));
    return v;
}
__device__ __forceinline__ uint64_t timer_ns() {
    uint64_t v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    return v;
}
__device__ __forceinline__ uint32_t block_index() {
    return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ __forceinline__ bool first_thread_of_block() {
    return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

// splitmix64: a good enough stream for shuffles and pauses.
struct Rng {
    uint64_t s;
    __device__ uint32_t below(uint32_t n) {  // in [0, n); 0 for n <= 1
        s += 0x9E3779B97F4A7C15ull;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return n <= 1 ? 0u : uint32_t((z >> 32) % n);
    }
};

__device__ __forceinline__ Rng seeded() {
    return Rng{timer_ns() ^ (uint64_t(clock64()) << 20) ^ (grid_id() * 0x2545F4914F6CDD1Dull) ^
               (uint64_t(block_index()) << 44) ^ (uint64_t(threadIdx.x) << 32)};
}

__device__ __forceinline__ void pause(Rng& rng, uint32_t max_ns) {
    const uint32_t ns = rng.below(max_ns);
    if (ns != 0) __nanosleep(ns);
}

// One thread: deliver m now. Its data in 1..kMaxPieces pieces of 16-byte multiples (piece i covers
// [floor(units * i / n) * 16, floor(units * (i + 1) / n) * 16) clipped to the size, units = ceil(bytes / 16), so
// no piece is empty and the last ends at `bytes`) in a random order, read from the source now; nvshmem_quiet
// completes them; only then the signal.
static __device__ __noinline__ void deliver(const Message m, Rng& rng) {
    if (m.bytes != 0) {
        const uint64_t units = (m.bytes + 15) / 16;
        const uint32_t most = units < uint64_t(kMaxPieces) ? uint32_t(units) : uint32_t(kMaxPieces);
        const uint32_t pieces = 1 + rng.below(most);
        uint8_t order[kMaxPieces];
        for (uint32_t i = 0; i < pieces; ++i) order[i] = uint8_t(i);
        for (uint32_t i = pieces - 1; i > 0; --i) {
            const uint32_t j = rng.below(i + 1);
            const uint8_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (uint32_t k = 0; k < pieces; ++k) {
            const uint64_t lo_u = units * order[k] / pieces * 16, hi_u = units * (order[k] + 1u) / pieces * 16;
            const uint64_t lo = lo_u < m.bytes ? lo_u : m.bytes, hi = hi_u < m.bytes ? hi_u : m.bytes;
            if (hi > lo)
                nvshmem_putmem_nbi(static_cast<uint8_t*>(m.dst) + lo, static_cast<const uint8_t*>(m.src) + lo,
                                   size_t(hi - lo), m.pe);
            if (rng.below(4) == 0) pause(rng, kMaxGapNs);
        }
        nvshmem_quiet();  // this message's data is delivered before its signal
    }
    if (m.sig != nullptr) nvshmemx_signal_op(m.sig, m.value, NVSHMEM_SIGNAL_ADD, m.pe);
}

// One thread (of a block or warp collective, or a net_signal_add caller; any number at once): queue the message
// in this block's queue, or deliver it now when the block has no queue or its queue is full.
static __device__ __noinline__ void enqueue(void* dst, const void* src, uint64_t bytes, uint64_t* sig,
                                            uint64_t value, int pe) {
    const uint32_t b = block_index();
    if (b < kQueues) {
        Queue& q = queues[b];
        uint32_t tail = *reinterpret_cast<volatile uint32_t*>(&q.tail);
        // Room: slot tail % kSlots last held message tail - kSlots, which net_quiet finished reading before it
        // published a head above it (release; acquired here, so our writes below come after its reads).
        while (tail - ld_acquire(&q.head) < kSlots) {
            const uint32_t seen = atomicCAS(&q.tail, tail, tail + 1);
            if (seen == tail) {
                Message& m = q.slot[tail % kSlots];
                m.dst = dst;
                m.src = src;
                m.bytes = bytes;
                m.sig = sig;
                m.value = value;
                m.grid = grid_id();
                m.pe = pe;
                st_release(&m.seq, tail + 1);  // the descriptor is complete
                return;
            }
            tail = seen;  // another thread of the block took it: try the next
        }
    }
    if (atomicExch(&warned_at_once, 1) == 0)
        printf("ep_rt chaos transport: block %u has %s: its puts that find no room are delivered at once, not "
               "late (kQueues %u, kSlots %u)\n", b, b < kQueues ? "a full queue" : "no queue", kQueues, kSlots);
    Rng rng = seeded();
    deliver(Message{dst, src, bytes, sig, value, grid_id(), pe, 0}, rng);
}

// One thread, after a __syncthreads() that follows the block's puts: deliver every message of the block's queue
// (all those queued before that barrier; messages queued meanwhile by other threads are delivered too, the
// descriptor awaited if it is still being written), then nvshmem_quiet.
static __device__ __noinline__ void quiet() {
    const uint32_t b = block_index();
    if (b < kQueues) {
        Queue& q = queues[b];
        while (atomicCAS(&q.busy, 0, 1) != 0) __nanosleep(100);  // one net_quiet per block at a time (contract)
        __threadfence();
        const uint32_t head = *reinterpret_cast<volatile uint32_t*>(&q.head);
        const uint32_t n = *reinterpret_cast<volatile uint32_t*>(&q.tail) - head;  // <= kSlots (enqueue's check)
        if (n != 0) {
            Rng rng = seeded();
            pause(rng, kMaxStartNs);
            for (uint32_t i = 0; i < n; ++i) q.order[i] = uint16_t(i);
            for (uint32_t i = n - 1; i > 0; --i) {  // Fisher-Yates
                const uint32_t j = rng.below(i + 1);
                const uint16_t t = q.order[i];
                q.order[i] = q.order[j];
                q.order[j] = t;
            }
            const unsigned long long me = grid_id();
            for (uint32_t i = 0; i < n; ++i) {
                const uint32_t s = head + q.order[i];
                Message& slot = q.slot[s % kSlots];
                while (ld_acquire(&slot.seq) != s + 1) {
                }  // reserved by a thread still writing it (finite: it waits for nothing)
                const Message m = slot;
                if (m.grid != me && atomicExch(&warned_foreign, 1) == 0)
                    printf("ep_rt chaos transport: block %u delivers a message queued by another kernel (grid %llu, "
                           "this is %llu): a block that puts must net_quiet before its kernel ends\n",
                           b, m.grid, me);
                deliver(m, rng);
                pause(rng, kMaxGapNs);
            }
            st_release(&q.head, head + n);  // the slots are free again
        }
        __threadfence();
        atomicExch(&q.busy, 0);
    }
    nvshmem_quiet();  // the signals, and anything delivered at once, are complete too
}

}  // namespace net_chaos

__device__ __forceinline__ void net_put_signal_block(void* dst, const void* src, size_t bytes, uint64_t* sig,
                                                     uint64_t value, int pe) {
    if (net_chaos::first_thread_of_block()) net_chaos::enqueue(dst, src, bytes, sig, value, pe);
    __syncthreads();  // a block collective, as NVSHMEM's
}

__device__ __forceinline__ void net_put_signal_warp(void* dst, const void* src, size_t bytes, uint64_t* sig,
                                                    uint64_t value, int pe) {
    if (net_detail::lane_id() == 0) net_chaos::enqueue(dst, src, bytes, sig, value, pe);
    __syncwarp();  // a warp collective, as NVSHMEM's
}

__device__ __forceinline__ void net_put_warp(void* dst, const void* src, size_t bytes, int pe) {
    if (net_detail::lane_id() == 0) net_chaos::enqueue(dst, src, bytes, nullptr, 0, pe);
    __syncwarp();  // a warp collective, as NVSHMEM's
}

__device__ __forceinline__ void net_signal_add(uint64_t* sig, uint64_t value, int pe) {
    net_chaos::enqueue(nullptr, nullptr, 0, sig, value, pe);
}

__device__ __forceinline__ void net_quiet() { net_chaos::quiet(); }

#endif  // EP_RT_CHAOS_TRANSPORT

}  // namespace ep_rt
