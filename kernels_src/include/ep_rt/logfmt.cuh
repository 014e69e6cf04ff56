// LogFMT-10 codec of the low-latency combine (use_logfmt), per 128-channel division of a bf16 row; the
// plain-torch oracle is ep_rt/reference_ll.py (logfmt_encode / logfmt_decode).
//
// Wire format of a combine slot (msg_bytes = 2H + 4S, padded to 16): division d's payload starts at byte 256 d.
//   castable:     bytes [0, 128)   low 8 bits of the 128 codes (byte m = channel m of the division);
//                 bytes [128, 160) 16 uint16 words, word g (channels 8g..8g+7) holds for channel 8g+j
//                                  bit 2j = bit 8 of the code and bit 2j+1 = the sign;
//                 bytes [160, 256) unused.
//   not castable: the 256 bytes are the bf16 values, exactly as without LogFMT.
//   meta:         at byte 2H + 4d, bf16 amax then bf16 amin (amin = +inf for an all-zero division).
// One thread owns 8 consecutive channels (one int4 of bf16), so its part of a division is always one uint2 of
// low bytes and one uint16 of high bits and signs, or one int4 of bf16.
//
// Why it looks like this:
// * Castability is decided by exact comparisons (amax < 1, amin < amax), which are the reference's log2 tests
//   since log2 is monotonic and distinct bf16 values have distinct float32 logs. So a division that must
//   travel as bf16 always does, whatever the error of the approximate logarithm.
// * lg2.approx / ex2.approx as DeepEP uses them: one MUFU instruction each (the send side needs a logarithm per
//   element and would otherwise be compute-bound). They move a value by at most one code step relative to the
//   reference, which is why LogFMT results are compared with a tolerance.
// * Sender and receiver derive the division parameters from the bf16 meta with the same function and IEEE
//   intrinsics (no FMA contraction), so both sides agree bit for bit on log_amin and step.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace ep_rt {

constexpr uint32_t kLogFmtInt4PerDivision = 16;  // 128 channels, 8 bf16 per int4 (one thread's share)
constexpr int kLogFmtDivisionBytes = 256;     // a division's stride in a slot (its size as bf16)
constexpr int kLogFmtHighBitsOffset = 128;    // the uint16 words of high bits and signs, inside a division
constexpr uint32_t kLogFmtMaxCode = 511;      // 9-bit codes, 0 encodes zero
constexpr float kLogFmtNumSteps = 510.0f;
constexpr float kLogFmtMaxLogRange = 32.0f;   // log_amin >= log2(amax) - 32

__device__ __forceinline__ float lg2_approx(float x) {
    float y;
    asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

struct LogFmtDivision {
    bool castable;
    float log_amin, step;  // meaningful only when castable
};

// Exact: log2(amax) < 0 and log2(amin) < log2(amax) of the reference, without the logarithms.
__device__ __forceinline__ bool logfmt_castable(float amax, float amin) {
    return amax > 0.0f && amax < 1.0f && amin < amax;
}

__device__ __forceinline__ LogFmtDivision logfmt_division(float amax, float amin) {
    LogFmtDivision d;
    d.castable = logfmt_castable(amax, amin);
    const float log_amax = lg2_approx(amax);
    d.log_amin = fmaxf(lg2_approx(amin), __fsub_rn(log_amax, kLogFmtMaxLogRange));
    d.step = __fdiv_rn(__fsub_rn(log_amax, d.log_amin), kLogFmtNumSteps);
    return d;
}

// Meta word: bf16 amax in the low half (first in memory), bf16 amin in the high half.
__device__ __forceinline__ uint32_t logfmt_pack_meta(float amax, float amin) {
    return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(amax))) |
           (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(amin))) << 16);
}

__device__ __forceinline__ float logfmt_meta_amax(uint32_t meta) {
    return __bfloat162float(__ushort_as_bfloat16(uint16_t(meta & 0xFFFF)));
}
__device__ __forceinline__ float logfmt_meta_amin(uint32_t meta) {
    return __bfloat162float(__ushort_as_bfloat16(uint16_t(meta >> 16)));
}

// Amax and nonzero amin over the 16 consecutive lanes (a half-warp) that hold one division. All 32 lanes of
// the warp must call it (the shuffles name the full mask); an inactive half-warp passes 0 / +inf.
__device__ __forceinline__ void logfmt_half_warp_amax_amin(float& amax, float& amin) {
#pragma unroll
    for (int d = 8; d > 0; d >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
        amin = fminf(amin, __shfl_xor_sync(0xffffffffu, amin, d));
    }
}

// 8 channels of a castable division: low code bytes (uint2) and 16 bits of high bits and signs.
struct LogFmtPart {
    uint2 low;
    uint32_t high;
};

__device__ __forceinline__ LogFmtPart logfmt_encode8(const int4& x8, const LogFmtDivision& d) {
    // code = min(floor(max((log2|x| - log_amin) / step + rho, 0)), 511), rho = 2 - log2((1 + 2^step) / 2) / step.
    // |x| = 0 gives log2 = -inf, hence code 0, with no branch.
    const float inv_step = __frcp_rn(d.step);
    const float rho =
        __fsub_rn(2.0f, __fmul_rn(lg2_approx(__fmul_rn(__fadd_rn(1.0f, ex2_approx(d.step)), 0.5f)), inv_step));
    const uint32_t* words = reinterpret_cast<const uint32_t*>(&x8);
    uint32_t low[2] = {0, 0}, high = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const uint32_t bits = (words[j / 2] >> (16 * (j % 2))) & 0xFFFF;
        const float a = fabsf(__bfloat162float(__ushort_as_bfloat16(uint16_t(bits))));
        const float q = __fadd_rn(__fmul_rn(__fsub_rn(lg2_approx(a), d.log_amin), inv_step), rho);
        const uint32_t code = min(__float2uint_rd(fmaxf(q, 0.0f)), kLogFmtMaxCode);
        low[j / 4] |= (code & 0xFF) << (8 * (j % 4));
        high |= ((code >> 8) << (2 * j)) | ((bits >> 15) << (2 * j + 1));
    }
    return LogFmtPart{make_uint2(low[0], low[1]), high};
}

// Channel j (0..7) of a castable part: float(bf16(±2^((code - 1) * step + log_amin))), ±0 for code 0.
__device__ __forceinline__ float logfmt_decode(const LogFmtPart& part, int j, const LogFmtDivision& d) {
    const uint32_t low_byte = ((j < 4 ? part.low.x : part.low.y) >> (8 * (j % 4))) & 0xFF;
    const uint32_t code = low_byte | (((part.high >> (2 * j)) & 1) << 8);
    // Computed for every code and masked to +0 for code 0: a select, where a conditional ex2 became a branch.
    const float e = ex2_approx(__fadd_rn(__fmul_rn(float(int(code) - 1), d.step), d.log_amin));
    const float mag = __uint_as_float(__float_as_uint(e) & (code == 0 ? 0u : ~0u));
    const float value = (part.high >> (2 * j + 1)) & 1 ? -mag : mag;
    return __bfloat162float(__float2bfloat16_rn(value));
}

// Byte offsets inside a slot of the share of int4 c of the row (channels 8c..8c+7: division c / 16, part c % 16).
__device__ __forceinline__ uint32_t logfmt_low_offset(uint32_t c) {
    return kLogFmtDivisionBytes * (c / kLogFmtInt4PerDivision) + 8 * (c % kLogFmtInt4PerDivision);
}
__device__ __forceinline__ uint32_t logfmt_high_offset(uint32_t c) {
    return kLogFmtDivisionBytes * (c / kLogFmtInt4PerDivision) + kLogFmtHighBitsOffset +
           2 * (c % kLogFmtInt4PerDivision);
}
__device__ __forceinline__ uint32_t logfmt_bf16_offset(uint32_t c) { return 16 * c; }
__device__ __forceinline__ uint32_t logfmt_meta_offset(uint32_t c, int hidden) {
    return 2 * uint32_t(hidden) + 4 * (c / kLogFmtInt4PerDivision);
}

// Encodes int4 c of a row of `hidden` channels (x8 = its 8 bf16) into the combine slot `slot`. Called by all
// 32 lanes of a warp together, 16 consecutive lanes per division (see logfmt_half_warp_amax_amin); lanes
// without data pass active = false. One lane per division writes the meta word.
__device__ __forceinline__ void logfmt_encode_int4(const int4& x8, bool active, uint32_t c, uint8_t* slot, int hidden) {
    float amax = 0.0f, amin = __int_as_float(0x7f800000);  // +inf
    if (active) {
        const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&x8);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float a = fabsf(__bfloat162float(h[j]));
            amax = fmaxf(amax, a);
            if (a != 0.0f) amin = fminf(amin, a);
        }
    }
    logfmt_half_warp_amax_amin(amax, amin);
    if (!active) return;
    if (c % kLogFmtInt4PerDivision == 0)
        *reinterpret_cast<uint32_t*>(slot + logfmt_meta_offset(c, hidden)) = logfmt_pack_meta(amax, amin);
    const LogFmtDivision d = logfmt_division(amax, amin);
    if (d.castable) {
        const LogFmtPart part = logfmt_encode8(x8, d);
        *reinterpret_cast<uint2*>(slot + logfmt_low_offset(c)) = part.low;
        *reinterpret_cast<uint16_t*>(slot + logfmt_high_offset(c)) = uint16_t(part.high);
    } else {
        *reinterpret_cast<int4*>(slot + logfmt_bf16_offset(c)) = x8;
    }
}

}  // namespace ep_rt
