// Bulk copies through the copy engine of sm_90 (cp.async.bulk, the "TMA" of the 1-D kind, with mbarriers), for
// the tma variant (EP_RT_TMA=1; issue 23 item 5). Two users: the dispatch's receive (Copier below: one thread of
// the block drives a two-stage pipeline, a bulk load of a chunk from global memory into shared memory, completed
// on an mbarrier, then a bulk store of it back to global memory, while the next chunk loads; warps 1.. copy the
// small arrays meanwhile, side_copy), and the combine's reduction (intranode.cu, reduce_row_bulk: each warp's
// lane 0 bulk-loads its token's source rows into the warp's own two stages, which the lanes sum from).
//
// Ordering (PTX ISA, "Memory consistency model", proxies): the bulk copies are async-proxy operations. The data
// they read was written by peers and made visible to this block by the generic-proxy acquire of its flag (then a
// block barrier); fence.proxy.async.global orders that view before the driving thread's bulk reads. A chunk's load
// completes on its mbarrier (complete_tx) before the same thread issues its store; a stage is reloaded only after
// cp.async.bulk.wait_group.read says the store from it has read its shared memory; the last wait_group 0 waits for
// every store's writes. Addresses and sizes must be multiples of 16 bytes (the callers fall back otherwise).
#pragma once
#include <stdint.h>

#include "ep_rt/copy.cuh"

namespace ep_rt {
namespace tma {

constexpr int kStages = 2;
constexpr int kStageBytes = 16384;  // two stages: 32 KiB of static shared memory per block

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// The mbarriers' initialisation visible to the async proxy (before any bulk copy completes on them).
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Generic-proxy view of global memory (a peer's data, acquired through its flag) before async-proxy reads of it.
__device__ __forceinline__ void fence_global_to_async() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// The lanes' generic-proxy reads of a shared stage ordered before the async proxy's next writes into it (a bulk
// load that refills the stage).
__device__ __forceinline__ void fence_shared_to_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The dynamic shared memory this launch got (a kernel whose stages live there takes its plain path with less).
__device__ __forceinline__ uint32_t dynamic_smem_bytes() {
    uint32_t v;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void wait_phase(uint64_t* bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
    }
}

__device__ __forceinline__ void load_1d(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(smem)),
                 "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

__device__ __forceinline__ void store_1d(void* gmem, const void* smem, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem), "r"(smem_addr(smem)),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Every store issued so far has read its shared memory (its stage may be reloaded).
__device__ __forceinline__ void wait_stores_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// Every store issued so far has written global memory.
__device__ __forceinline__ void wait_stores_done() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// The block's copier: its stages and mbarriers in static shared memory; only thread `driver` calls copy().
struct Copier {
    uint8_t* stage;  // kStages x kStageBytes, 128-byte aligned
    uint64_t* bar;   // kStages mbarriers
    uint32_t parity;  // bit s: the phase stage s waits for next (the driving thread's own)

    // Every thread of the block constructs it at the same point (a block barrier inside).
    __device__ __forceinline__ Copier(uint8_t* stage_, uint64_t* bar_, int driver)
        : stage(stage_), bar(bar_), parity(0) {
        if (threadIdx.x == driver) {
            for (int s = 0; s < kStages; ++s) mbar_init(bar + s, 1);
            fence_mbar_init();
        }
        __syncthreads();
    }

    // The driving thread copies nbytes (a multiple of 16, both ends 16-byte aligned); returns when every byte is
    // written. Data a peer wrote: call fence_global_to_async() once after acquiring it.
    __device__ void copy(void* dst, const void* src, int64_t nbytes) {
        if (nbytes <= 0) return;
        const int64_t chunks = (nbytes + kStageBytes - 1) / kStageBytes;
        auto chunk_bytes = [&](int64_t k) {
            const int64_t left = nbytes - k * kStageBytes;
            return static_cast<uint32_t>(left < kStageBytes ? left : int64_t(kStageBytes));
        };
        auto issue_load = [&](int64_t k) {
            const int s = int(k % kStages);
            arrive_expect_tx(bar + s, chunk_bytes(k));
            load_1d(stage + s * kStageBytes, static_cast<const uint8_t*>(src) + k * kStageBytes, chunk_bytes(k),
                    bar + s);
        };
        wait_stores_read();  // the stages may still be read by the stores of an earlier copy
        issue_load(0);
        for (int64_t k = 0; k < chunks; ++k) {
            const int s = int(k % kStages);
            if (k + 1 < chunks) {
                wait_stores_read();  // the store of chunk k - 1 (the next stage's last use) has read it
                issue_load(k + 1);
            }
            wait_phase(bar + s, (parity >> s) & 1u);
            parity ^= 1u << s;
            store_1d(static_cast<uint8_t*>(dst) + k * kStageBytes, stage + s * kStageBytes, chunk_bytes(k));
        }
        wait_stores_done();
    }
};

__device__ __forceinline__ bool aligned16(const void* a, const void* b, int64_t nbytes) {
    return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | uintptr_t(nbytes)) & 15) == 0;
}

// Called by the whole block: rows through the copier's thread when both ends and the size allow a bulk copy, else
// every thread copies as block_copy does. Other threads return at once (side_copy's copies overlap the bulk one).
template <Src kSrc>
__device__ __forceinline__ void block_rows(Copier& copier, void* dst, const void* src, int64_t nbytes) {
    if (aligned16(dst, src, nbytes)) {
        if (threadIdx.x == 0) copier.copy(dst, src, nbytes);
    } else {
        block_copy<kSrc>(dst, src, nbytes);
    }
}

// Called by the whole block: nbytes (a multiple of 4) copied by threads 32.. (warp 0 drives the bulk copies).
template <Src kSrc>
__device__ __forceinline__ void side_copy(void* dst, const void* src, int64_t nbytes) {
    if (threadIdx.x < 32 || nbytes <= 0) return;
    const int index = threadIdx.x - 32, count = blockDim.x - 32;
    if (aligned16(dst, src, nbytes)) {
        copy_v4<kSrc>(static_cast<int4*>(dst), static_cast<const int4*>(src), nbytes / 16, index, count);
    } else {
        const int32_t* s = static_cast<const int32_t*>(src);
        int32_t* d = static_cast<int32_t*>(dst);
        for (int64_t i = index; i < nbytes / 4; i += count) st_na_b32(d + i, load_b32<kSrc>(s + i));
    }
}

}  // namespace tma
}  // namespace ep_rt
