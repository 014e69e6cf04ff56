// topk_idx of either width: ep_rt.topk_idx_t (the type of outputs such as recv_topk_idx) is int64 or int32,
// chosen at run time (EP_RT_TOPK_IDX_BITS), and inputs of both widths are read in place, without a copy.
// The 64-bit path is the plain int64 load or store it always was.
#pragma once
#include <stdint.h>

namespace ep_rt {

struct TopkIdx {
    const void* ptr;
    bool narrow;  // int32 elements

    __device__ __forceinline__ TopkIdx(uint64_t address, int bits)
        : ptr(reinterpret_cast<const void*>(address)), narrow(bits == 32) {}

    __device__ __forceinline__ bool present() const { return ptr != nullptr; }

    __device__ __forceinline__ int64_t operator[](int64_t i) const {
        return narrow ? int64_t(static_cast<const int32_t*>(ptr)[i]) : static_cast<const int64_t*>(ptr)[i];
    }
};

__device__ __forceinline__ int topk_idx_bytes(int bits) { return bits == 32 ? 4 : 8; }

// Element i of a topk_idx array of `bits` width at `base` (a device address).
__device__ __forceinline__ void store_topk_idx(uint64_t base, int bits, int64_t i, int64_t value) {
    if (bits == 32)
        reinterpret_cast<int32_t*>(base)[i] = int32_t(value);
    else
        reinterpret_cast<int64_t*>(base)[i] = value;
}

}  // namespace ep_rt
