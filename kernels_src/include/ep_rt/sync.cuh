// Cross-rank flags, call sequence numbers, time-limited waits and the error record.
// Every flag holds the sequence number of the collective call that last wrote it, so flags never
// need resetting: a wait succeeds once the flag reaches the current call's sequence number.
#pragma once
#include "ep_rt/params.h"
#include "ep_rt/ptx.cuh"

namespace ep_rt {

template <typename T>
__device__ __forceinline__ T* at(uint64_t base, int64_t byte_offset) {
    return reinterpret_cast<T*>(base + byte_offset);
}

// Where a kernel reports failure: the host-mapped record and the device-memory claim word.
struct ErrorSink {
    uint64_t record;   // ErrorRecord* (host-mapped)
    int32_t* claim;    // in this rank's buffer control region
    int rank;
};

__device__ __forceinline__ ErrorSink make_sink(uint64_t record, uint64_t local_buffer, const ControlLayout& ctrl,
                                               int rank) {
    return ErrorSink{record, at<int32_t>(local_buffer, ctrl.error_claim), rank};
}

// First failure wins; the host polls `code`, which is written last.
__device__ __forceinline__ void report_error(const ErrorSink& sink, int code, int phase, int peer, int channel,
                                             int64_t detail0, int64_t detail1) {
    if (atomicCAS(sink.claim, 0, 1) == 0) {
        volatile ErrorRecord* rec = reinterpret_cast<volatile ErrorRecord*>(sink.record);
        rec->phase = phase;
        rec->rank = sink.rank;
        rec->peer = peer;
        rec->channel = channel;
        rec->detail0 = detail0;
        rec->detail1 = detail1;
        __threadfence_system();
        rec->code = code;
        __threadfence_system();
    }
}

__device__ __forceinline__ bool error_raised(const ErrorSink& sink) {
    return *reinterpret_cast<volatile int32_t*>(sink.claim) != 0;
}

// Spin until *flag >= seq. On timeout (or when another block already failed) report and return false.
__device__ __noinline__ bool wait_flag(const int64_t* flag, int64_t seq, int64_t timeout_ns, const ErrorSink& sink,
                                       int phase, int peer, int channel) {
    uint64_t start = globaltimer_ns();
    int spins = 0;
    while (true) {
        int64_t v = ld_acquire_sys(flag);
        if (v - seq >= 0) return true;
        if (++spins == 64) {
            spins = 0;
            uint64_t now = globaltimer_ns();
            if (int64_t(now - start) > timeout_ns) {
                report_error(sink, EP_RT_ERR_TIMEOUT, phase, peer, channel, seq, v);
                return false;
            }
            if (error_raised(sink)) return false;
        }
    }
}

// Sequence numbers live in device memory (this rank's control region), one per kind of call, not in the
// kernel arguments: every block reads the current value when it starts and the last block to finish
// advances it. So a call captured in a CUDA graph gets a fresh number on every replay, and replays and
// eager calls interleave freely. All ranks make the same calls in the same order, so their numbers agree.
struct CallSeq {
    int64_t* value;
    int32_t* ticket;
};

__device__ __forceinline__ CallSeq call_seq(uint64_t local_buffer, const ControlLayout& ctrl, int kind) {
    return CallSeq{at<int64_t>(local_buffer, ctrl.call_seq) + kind,
                   at<int32_t>(local_buffer, ctrl.call_seq + EP_RT_CALL_KINDS * 8) + kind};
}

// This call's number. The previous call of this kind advanced it before its kernel ended (stream order).
__device__ __forceinline__ int64_t begin_call(const CallSeq& s) {
    return *reinterpret_cast<volatile int64_t*>(s.value) + 1;
}

// Every thread of every block calls this once, at the very end.
__device__ __forceinline__ void end_call(const CallSeq& s, int64_t seq) {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(s.ticket, 1) == int(gridDim.x) - 1) {
        *s.ticket = 0;
        *reinterpret_cast<volatile int64_t*>(s.value) = seq;
    }
}

}  // namespace ep_rt
