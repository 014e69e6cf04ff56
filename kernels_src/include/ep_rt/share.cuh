// Even shares of a list of cells' messages across the blocks of a grid.
//
// The low-latency receive-side work comes in cells ((local expert, source rank) pairs) whose message counts
// vary a lot: with the reference routing the busiest of 288 cells holds about three times the mean. One block
// per cell makes that busiest block set the kernel time. Instead every block computes the prefix sum of all
// counts and takes the messages [total * b / G, total * (b + 1) / G) of the list ordered by cell then index,
// so blocks differ by at most one message.
#pragma once
#include <stdint.h>

namespace ep_rt {

constexpr int kShareTileCells = 2048;  // cells whose counts are scanned at once in shared memory
constexpr int kShareBatch = 32;        // messages a block lays out at once

struct ShareBatch {
    int cell[kShareBatch];
    int index[kShareBatch];         // the message's index within its cell
    int group_offset[kShareBatch];  // messages in the earlier cells of the cell's group (group = R cells)
};

struct ShareSmem {
    int start[kShareTileCells + 1];  // exclusive prefix of the tile's counts; start[n] = the tile's total
    int warp_sums[32];
    ShareBatch batch;
};

// Sum of v over the block, returned to every thread.
__device__ __forceinline__ int block_sum(int v, int* warp_sums) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = (blockDim.x + 31) / 32;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    __syncthreads();  // earlier readers of warp_sums are done
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    int total = 0;
    for (int w = 0; w < num_warps; ++w) total += warp_sums[w];
    return total;
}

// In-place exclusive prefix sum of a[0..n), n <= kShareTileCells; a[n] = the total, also returned to every
// thread. Each thread scans a run of consecutive entries, then the runs' sums are scanned across the block.
__device__ int block_exclusive_scan(int* a, int n, int* warp_sums) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = (blockDim.x + 31) / 32;
    const int per = (n + int(blockDim.x) - 1) / int(blockDim.x);
    const int lo = min(n, int(threadIdx.x) * per), hi = min(n, lo + per);
    int run = 0;
    for (int i = lo; i < hi; ++i) run += a[i];
    int inclusive = run;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += v;
    }
    __syncthreads();  // earlier readers of warp_sums are done
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < num_warps; ++w) {
        before += w < warp ? warp_sums[w] : 0;
        total += warp_sums[w];
    }
    int offset = before + inclusive - run;
    for (int i = lo; i < hi; ++i) {
        const int v = a[i];
        a[i] = offset;
        offset += v;
    }
    if (threadIdx.x == 0) a[n] = total;
    __syncthreads();
    return total;
}

// Walk this block's share of the messages of cells 0..num_cells (cell c holds count(c) messages; cells come in
// groups of `group`, a group never split across tiles). Every thread of the block must call it.
//   on_tile(c0, n, start): after each tile of cells c0..c0+n is scanned (start = its exclusive prefix, with
//                          start[n] its total), for per-cell outputs; every tile is visited by every block.
//   visit(nb, batch):      for each batch of nb <= kShareBatch of this block's messages, in list order.
template <typename Count, typename OnTile, typename Visit>
__device__ void for_each_share_batch(ShareSmem& sm, int num_cells, int group, Count count, OnTile on_tile,
                                     Visit visit) {
    const int tile = kShareTileCells / group * group;
    auto scan_tile = [&](int c0, int n) {
        for (int c = threadIdx.x; c < n; c += blockDim.x) sm.start[c] = count(c0 + c);
        __syncthreads();
        return block_exclusive_scan(sm.start, n, sm.warp_sums);
    };
    int total = 0;
    if (num_cells <= tile) {
        total = scan_tile(0, num_cells);
    } else {
        int sum = 0;
        for (int c = threadIdx.x; c < num_cells; c += blockDim.x) sum += count(c);
        total = block_sum(sum, sm.warp_sums);
    }
    const int first = int(int64_t(total) * blockIdx.x / gridDim.x);
    const int last = int(int64_t(total) * (blockIdx.x + 1) / gridDim.x);
    int carry = 0;  // messages in the tiles before this one
    for (int c0 = 0; c0 < num_cells; c0 += tile) {
        const int n = min(tile, num_cells - c0);
        const int tile_total = num_cells <= tile ? total : scan_tile(c0, n);
        on_tile(c0, n, sm.start);
        const int lo = max(first - carry, 0), hi = min(last - carry, tile_total);
        for (int m0 = lo; m0 < hi; m0 += kShareBatch) {
            const int nb = min(kShareBatch, hi - m0);
            if (int(threadIdx.x) < nb) {
                const int m = m0 + threadIdx.x;
                int a = 0, b = n;  // the cell holding m: the largest a with start[a] <= m (start[n] > m)
                while (b - a > 1) {
                    const int mid = (a + b) / 2;
                    if (sm.start[mid] <= m)
                        a = mid;
                    else
                        b = mid;
                }
                sm.batch.cell[threadIdx.x] = c0 + a;
                sm.batch.index[threadIdx.x] = m - sm.start[a];
                sm.batch.group_offset[threadIdx.x] = sm.start[a] - sm.start[a - a % group];
            }
            __syncthreads();
            visit(nb, sm.batch);
            __syncthreads();
        }
        carry += tile_total;
        __syncthreads();  // everyone is done with start[] before the next tile overwrites it
    }
}

}  // namespace ep_rt
