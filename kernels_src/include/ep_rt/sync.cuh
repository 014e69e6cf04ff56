// Cross-rank flags, time-limited waits and the error record.
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

}  // namespace ep_rt
