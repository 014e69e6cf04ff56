// PTX wrappers: memory-ordering primitives and the loads/stores the copy loops use.
// The undefined-behaviour loads (non-coherent reads of memory that peers write during the kernel)
// exist only behind EP_RT_AGGRESSIVE_PTX; tools/build_cubins.py builds a safe and an aggressive variant.
#pragma once
#include <stdint.h>

#ifndef EP_RT_AGGRESSIVE_PTX
#define EP_RT_AGGRESSIVE_PTX 0
#endif

namespace ep_rt {

__device__ __forceinline__ int64_t ld_acquire_sys(const int64_t* p) {
    int64_t v;
    asm volatile("ld.acquire.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys(int64_t* p, int64_t v) {
    asm volatile("st.release.sys.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ int32_t ld_acquire_sys(const int32_t* p) {
    int32_t v;
    asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long ld_acquire_gpu(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long atomic_add_release_gpu(unsigned long long* p, unsigned long long v) {
    unsigned long long old;
    asm volatile("atom.release.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}

__device__ __forceinline__ void st_release_sys(int32_t* p, int32_t v) {
    asm volatile("st.release.sys.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Read-only input that nobody writes while the kernel runs: the non-coherent path is legal here.
__device__ __forceinline__ int4 ld_input_v4(const int4* p) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Memory a peer wrote during this kernel, read after an acquire on its flag.
// Safe: a coherent load. Aggressive: the non-coherent texture path with 256-byte L2 prefetch,
// faster but outside the PTX memory model (DeepEP relies on the same trick).
__device__ __forceinline__ int4 ld_peer_written_v4(const int4* p) {
    int4 v;
#if EP_RT_AGGRESSIVE_PTX
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
#else
    asm volatile("ld.global.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
#endif
    return v;
}

__device__ __forceinline__ int32_t ld_peer_written_b32(const int32_t* p) {
    int32_t v;
#if EP_RT_AGGRESSIVE_PTX
    asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
#else
    asm volatile("ld.global.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#endif
    return v;
}

__device__ __forceinline__ uint2 ld_peer_written_v2(const uint2* p) {
    uint2 v;
#if EP_RT_AGGRESSIVE_PTX
    asm volatile("ld.global.nc.L1::no_allocate.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
#else
    asm volatile("ld.global.L1::no_allocate.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
#endif
    return v;
}

__device__ __forceinline__ uint16_t ld_peer_written_b16(const uint16_t* p) {
    uint16_t v;
#if EP_RT_AGGRESSIVE_PTX
    asm volatile("ld.global.nc.L1::no_allocate.b16 %0, [%1];" : "=h"(v) : "l"(p));
#else
    asm volatile("ld.global.L1::no_allocate.b16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
#endif
    return v;
}

// Streaming store that does not pollute L1 (remote NVLink or local).
__device__ __forceinline__ void st_na_v4(int4* p, const int4& v) {
    asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ void st_na_b32(int32_t* p, int32_t v) {
    asm volatile("st.global.L1::no_allocate.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

}  // namespace ep_rt
