// Vector copies shared by the kernel families: 16-byte loads kept in flight (kUnroll per thread), then
// streaming stores. kSrc says what is read: read-only input (non-coherent path, legal) or memory a peer wrote
// during the kernel (ld_peer_written: coherent unless the aggressive variant is built).
#pragma once
#include <stdint.h>

#include "ep_rt/ptx.cuh"

namespace ep_rt {

enum class Src { kInput, kPeerWritten };

template <Src kSrc>
__device__ __forceinline__ int4 load_v4(const int4* p) {
    if constexpr (kSrc == Src::kInput)
        return ld_input_v4(p);
    else
        return ld_peer_written_v4(p);
}

template <Src kSrc>
__device__ __forceinline__ int32_t load_b32(const int32_t* p) {
    if constexpr (kSrc == Src::kInput)
        return *p;
    else
        return ld_peer_written_b32(p);
}

// n int4 copied by `count` cooperating threads, this one being `index`.
template <Src kSrc>
__device__ __forceinline__ void copy_v4(int4* d, const int4* s, int64_t n, int index, int count) {
    constexpr int kUnroll = 4;
    for (int64_t i = index; i < n; i += int64_t(count) * kUnroll) {
        int4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            if (i + int64_t(u) * count < n) v[u] = load_v4<kSrc>(s + i + int64_t(u) * count);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            if (i + int64_t(u) * count < n) st_na_v4(d + i + int64_t(u) * count, v[u]);
    }
}

// The whole block copies nbytes (a multiple of 4); vectorised when both ends and the size are 16-byte aligned.
template <Src kSrc>
__device__ void block_copy(void* dst, const void* src, int64_t nbytes) {
    if (nbytes <= 0) return;
    const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | uintptr_t(nbytes);
    if ((mis & 15) == 0) {
        copy_v4<kSrc>(static_cast<int4*>(dst), static_cast<const int4*>(src), nbytes / 16, threadIdx.x, blockDim.x);
    } else {
        const int32_t* s = static_cast<const int32_t*>(src);
        int32_t* d = static_cast<int32_t*>(dst);
        for (int64_t i = threadIdx.x; i < nbytes / 4; i += blockDim.x) st_na_b32(d + i, load_b32<kSrc>(s + i));
    }
}

// One warp copies nbytes (a multiple of 16, 16-byte aligned).
template <Src kSrc>
__device__ __forceinline__ void warp_copy(void* dst, const void* src, int64_t nbytes, int lane) {
    copy_v4<kSrc>(static_cast<int4*>(dst), static_cast<const int4*>(src), nbytes / 16, lane, 32);
}

}  // namespace ep_rt
