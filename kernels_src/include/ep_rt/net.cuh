// The network calls of ep_rt's kernels: every NVSHMEM operation goes through these wrappers, so one place says
// which NVSHMEM device calls ep_rt relies on (standard ones only: they run over IBGDA, IBRC, UCX and libfabric
// alike) and a test build can swap the transport for one that behaves like a real network (EP_RT_CHAOS_TRANSPORT:
// puts applied late, split and reordered, each signal only after its own data; quiets charged what a sweep costs).
//
// The rules every caller keeps (docs/INTERNODE_DESIGN.md, "Network rules"; shared/docs/NETWORK.md):
//   * Only ranks of other nodes are reached through the network, never yourself or a rank of your node (those
//     go through NVLink mappings): with a remote transport loaded NVSHMEM may route those through the NIC too.
//   * Data-before-flag comes only from put-with-signal: NVSHMEM orders a put-with-signal's signal after its own
//     data on every transport (OpenSHMEM 1.5, 9.8.1). A signal says nothing about any other put.
//   * No quiet and no fence: on IBGDA each walks every queue pair to every PE and polls its completion queue with
//     no deadline (a dead peer then hangs the kernel past ep_rt's own deadline). A source buffer is rewritten only
//     on evidence that its destination received it: a signal from that destination, or from a rank whose progress
//     needs it (the buffer credits of the LL kernels, the all-to-all that starts every internode call). Both
//     cubin flavours issue the same calls.
//   * A word the network writes is read only by the rank that owns it (the NIC wrote into its memory; CUDA orders
//     GPUDirect RDMA writes for the owning GPU only, CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER), through
//     net_signal_load, the read NVSHMEM's own nvshmem_signal_wait_until makes (volatile loads of the word;
//     nvshmem_defines.h), made an acquire here so the data loads after it stay after it. Signal words only grow
//     (SIGNAL_ADD counters) or are set once per use of their buffer (SIGNAL_SET, after the buffer's credit).
//   * A block calls net_flush() (one thread, after a __syncthreads() that follows the block's network calls)
//     before it waits for anything its own puts cause, and before its kernel ends. Over NVSHMEM it does nothing
//     (the network makes progress on its own); the chaos build delivers the block's queue there.
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>

#include <stdint.h>

#ifndef EP_RT_CHAOS_TRANSPORT
#define EP_RT_CHAOS_TRANSPORT 0
#endif

// The chaos build's queues (below): one per block index up to EP_RT_NET_CHAOS_QUEUES, each holding up to
// EP_RT_NET_CHAOS_SLOTS messages between two net_flush() calls. Defined in both builds for the probe kernel
// (low_latency.cu), which puts more than a queue holds.
#define EP_RT_NET_CHAOS_QUEUES 1024
#define EP_RT_NET_CHAOS_SLOTS 512
// The chaos build's counters (ep_rt_net_stats, u64 words, read and reset by the host through the module's global
// symbol): network operations issued by the module's kernels, and the nanoseconds each quiet is charged
// (ep_rt_net_sweep_ns, set by the host: a quiet's sweep over every queue pair at the emulated size).
#define EP_RT_NET_STAT_PUT_SIGNAL 0
#define EP_RT_NET_STAT_SIGNAL 1
#define EP_RT_NET_STAT_QUIET 2
#define EP_RT_NET_STAT_FENCE 3
#define EP_RT_NET_STAT_BYTES 4
#define EP_RT_NET_STAT_CHARGED_NS 5
#define EP_RT_NET_STAT_WORDS 8

namespace ep_rt {

namespace net_detail {
__device__ __forceinline__ uint32_t lane_id() {
    uint32_t v;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(v));
    return v;
}
__device__ __forceinline__ uint64_t ld_acquire_sys_u64(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
}  // namespace net_detail

// The value of a signal word the network writes into this rank's memory (see the rules above).
__device__ __forceinline__ uint64_t net_signal_load(const uint64_t* sig) { return net_detail::ld_acquire_sys_u64(sig); }

#if !EP_RT_CHAOS_TRANSPORT

__device__ __forceinline__ void net_count(int, uint64_t) {}

// The whole block: `bytes` from this rank's `src` to `dst` (a symmetric address, as on this rank) of PE `pe`,
// then `*sig += value` there once the data is visible to `pe`.
__device__ __forceinline__ void net_put_signal_block(void* dst, const void* src, size_t bytes, uint64_t* sig,
                                                     uint64_t value, int pe) {
    nvshmemx_putmem_signal_nbi_block(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_ADD, pe);
}

// One warp: as net_put_signal_block. (Under NVRTC, the cu12 flavour, this links only because the build's stdint.h
// makes uint64_t unsigned long, as in the device library: tools/cubin_toolchains.py STDINT_SHIM.)
__device__ __forceinline__ void net_put_signal_warp(void* dst, const void* src, size_t bytes, uint64_t* sig,
                                                    uint64_t value, int pe) {
    nvshmemx_putmem_signal_nbi_warp(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_ADD, pe);
}

// One thread: `*sig += value` at PE `pe` (no data: an empty range still announces itself).
__device__ __forceinline__ void net_signal_add(uint64_t* sig, uint64_t value, int pe) {
    nvshmemx_signal_op(sig, value, NVSHMEM_SIGNAL_ADD, pe);
}

// One thread: `*sig = value` at PE `pe` (a word set once per use of its buffer).
__device__ __forceinline__ void net_signal_set(uint64_t* sig, uint64_t value, int pe) {
    nvshmemx_signal_op(sig, value, NVSHMEM_SIGNAL_SET, pe);
}

// One thread, after a __syncthreads() that follows the block's network calls (see the rules above).
__device__ __forceinline__ void net_flush() {}

// One thread: NVSHMEM's quiet, a sweep of every queue pair on IBGDA. Never in a data path (the rules above,
// tests/test_network_rules.py); the chaos build charges it a sweep (only the probe kernel calls it, to show that).
__device__ __forceinline__ void net_quiet() { nvshmem_quiet(); }

#else  // EP_RT_CHAOS_TRANSPORT

// The chaos transport (INTERNODE.md 4.5, docs/CHAOS_TRANSPORT.md), a test build of the same calls. A put or
// signal is not performed when called: its descriptor (dst, src, bytes, pe, signal word, value and operation) goes
// into the calling block's queue in device memory, and the block's next net_flush() delivers the queue:
//   * whole messages in a pseudo-random order (seeded per call from %globaltimer, clock64, %gridid and the block),
//     with random pauses before and between them, so signals of different messages overtake each other's data;
//   * each message's data split into up to kMaxPieces pieces (16-byte multiples) applied in a random order, the
//     source read only then (a source rewritten before its destination acknowledged it delivers rewritten bytes);
//   * each message's signal only after its own data is complete: its pieces as nvshmem_putmem_nbi, then
//     nvshmem_quiet, then nvshmemx_signal_op. Never earlier.
// Delivery uses standard NVSHMEM calls only, so the chaos build runs over whatever transport NVSHMEM has (in the
// tests: P2P between emulated nodes, EP_RT_RANKS_PER_NODE). Its cost mode counts every network call of the module
// (ep_rt_net_stats) and charges each quiet or fence of ep_rt's own (not the ones delivery makes) the time the host
// set in ep_rt_net_sweep_ns.
//
// Limits of a test mode. A block with linear index >= kQueues, or whose queue already holds kSlots messages, has
// that put delivered at once by the calling thread (split, reordered and signalled after its data, but not late);
// the first time, a warning is printed. There is one queue per block index of a module: two kernels of one module
// putting at the same time would share queues (each net_flush then delivers the other's messages too, early, as a
// network may); a message queued by another kernel (an earlier one that ended without net_flush, or a concurrent
// one) prints a warning when it is delivered.
namespace net_chaos {

constexpr uint32_t kQueues = EP_RT_NET_CHAOS_QUEUES;
constexpr uint32_t kSlots = EP_RT_NET_CHAOS_SLOTS;  // <= 65536 (Queue::order is 16-bit)
constexpr int kMaxPieces = 8;
constexpr uint32_t kMaxGapNs = 2000;     // pause between messages (and, one time in four, between pieces)
constexpr uint32_t kMaxStartNs = 20000;  // pause before a net_flush delivers anything

struct Message {
    void* dst;
    const void* src;
    uint64_t bytes;
    uint64_t* sig;           // nullptr: no signal
    uint64_t value;
    unsigned long long grid; // %gridid of the kernel that queued it
    int32_t pe;
    int32_t op;              // NVSHMEM_SIGNAL_ADD or NVSHMEM_SIGNAL_SET
    uint32_t seq;            // its slot number + 1 once the descriptor is written (0: never written)
    uint32_t unused;
};

struct Queue {
    uint32_t head;           // messages [head, tail) are queued (32-bit slot numbers, wrapping); only net_flush
    uint32_t tail;           // moves head, enqueue reserves at tail
    int32_t busy;            // a net_flush is delivering this queue
    uint32_t unused;
    uint16_t order[kSlots];  // net_flush's scratch: the delivery order
    Message slot[kSlots];
};

// Zero-initialised, as every .global variable (PTX ISA). ~33 MiB of device memory per module load, no cubin bytes.
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

}  // namespace net_chaos
}  // namespace ep_rt

// The cost mode's counters and charge (host: cuModuleGetGlobal by these names).
extern "C" {
__device__ unsigned long long ep_rt_net_stats[EP_RT_NET_STAT_WORDS];
__device__ unsigned long long ep_rt_net_sweep_ns;
}

namespace ep_rt {

__device__ __forceinline__ void net_count(int stat, uint64_t n) {
    atomicAdd(&ep_rt_net_stats[stat], (unsigned long long)n);
}

namespace net_chaos {

// One thread: what a quiet or fence of ep_rt's own costs on a network (the host's estimate of one sweep).
__device__ __forceinline__ void charge_sweep(int stat) {
    net_count(stat, 1);
    const uint64_t ns = *reinterpret_cast<volatile unsigned long long*>(&ep_rt_net_sweep_ns);
    if (ns == 0) return;
    const uint64_t start = timer_ns();
    while (timer_ns() - start < ns) __nanosleep(ns < 1000 ? uint32_t(ns) : 1000u);
    net_count(EP_RT_NET_STAT_CHARGED_NS, ns);
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
    if (m.sig != nullptr) nvshmemx_signal_op(m.sig, m.value, m.op, m.pe);
}

// One thread (of a block or warp collective, or a net_signal_* caller; any number at once): queue the message
// in this block's queue, or deliver it now when the block has no queue or its queue is full.
static __device__ __noinline__ void enqueue(void* dst, const void* src, uint64_t bytes, uint64_t* sig, uint64_t value,
                                            int op, int pe) {
    net_count(bytes != 0 ? EP_RT_NET_STAT_PUT_SIGNAL : EP_RT_NET_STAT_SIGNAL, 1);
    if (bytes != 0) net_count(EP_RT_NET_STAT_BYTES, bytes);
    const uint32_t b = block_index();
    if (b < kQueues) {
        Queue& q = queues[b];
        uint32_t tail = *reinterpret_cast<volatile uint32_t*>(&q.tail);
        // Room: slot tail % kSlots last held message tail - kSlots, which net_flush finished reading before it
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
                m.op = op;
                st_release(&m.seq, tail + 1);  // the descriptor is complete
                return;
            }
            tail = seen;  // another thread of the block took it: try the next
        }
    }
    if (atomicExch(&warned_at_once, 1) == 0)
        printf(
            "ep_rt chaos transport: block %u has %s: its puts that find no room are delivered at once, not "
            "late (kQueues %u, kSlots %u)\n",
            b, b < kQueues ? "a full queue" : "no queue", kQueues, kSlots);
    Rng rng = seeded();
    deliver(Message{dst, src, bytes, sig, value, grid_id(), pe, op, 0, 0}, rng);
}

// One thread, after a __syncthreads() that follows the block's network calls: deliver every message of the
// block's queue (all those queued before that barrier; messages queued meanwhile by other threads are delivered
// too, the descriptor awaited if it is still being written), then nvshmem_quiet (of the delivery, not ep_rt's).
static __device__ __noinline__ void flush() {
    const uint32_t b = block_index();
    if (b < kQueues) {
        Queue& q = queues[b];
        while (atomicCAS(&q.busy, 0, 1) != 0) __nanosleep(100);  // one net_flush per block at a time (contract)
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
                    printf(
                        "ep_rt chaos transport: block %u delivers a message queued by another kernel (grid %llu, "
                        "this is %llu): a block that puts must net_flush before its kernel ends\n",
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
    if (net_chaos::first_thread_of_block()) net_chaos::enqueue(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_ADD, pe);
    __syncthreads();  // a block collective, as NVSHMEM's
}

__device__ __forceinline__ void net_put_signal_warp(void* dst, const void* src, size_t bytes, uint64_t* sig,
                                                    uint64_t value, int pe) {
    if (net_detail::lane_id() == 0) net_chaos::enqueue(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_ADD, pe);
    __syncwarp();  // a warp collective, as NVSHMEM's
}

__device__ __forceinline__ void net_signal_add(uint64_t* sig, uint64_t value, int pe) {
    net_chaos::enqueue(nullptr, nullptr, 0, sig, value, NVSHMEM_SIGNAL_ADD, pe);
}

__device__ __forceinline__ void net_signal_set(uint64_t* sig, uint64_t value, int pe) {
    net_chaos::enqueue(nullptr, nullptr, 0, sig, value, NVSHMEM_SIGNAL_SET, pe);
}

__device__ __forceinline__ void net_flush() { net_chaos::flush(); }

__device__ __forceinline__ void net_quiet() {
    net_chaos::flush();
    net_chaos::charge_sweep(EP_RT_NET_STAT_QUIET);
}

#endif  // EP_RT_CHAOS_TRANSPORT

}  // namespace ep_rt
