#!/usr/bin/env python3
"""The LL benchmark alone (ep_rt.testing.bench.bench_ll), on every local GPU, repeated: for comparing kernel changes
within one device call, where `python -m ep_rt` would spend most of its time on checks.

    PYTHONPATH=. python tools/ll_bench.py [--experts 288 256] [--repeats 2]

Prints each rank's table (format_ll_rows) per repeat. Correctness is not checked here: run the LL suite.
"""

import argparse
import sys

import torch
import torch.distributed as dist


def bench_rank(rank, num_ranks, experts, repeats):
    from ep_rt import Buffer
    from ep_rt.testing import bench

    need = max(Buffer.get_low_latency_rdma_size_hint(128, 7168, num_ranks, e) for e in experts)
    buffer = Buffer(dist.group.WORLD, 0, need, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
    tables = []
    for _ in range(repeats):
        rows = [row for e in experts for row in bench.bench_ll(buffer, num_experts=e)]
        tables.append(bench.format_ll_rows(rows, rank))
    buffer.destroy()
    return tables


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, nargs="+", default=[288])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from ep_rt.testing.spawn import run_ranks

    num_ranks = torch.cuda.device_count()
    results = run_ranks(bench_rank, num_ranks, args=(args.experts, args.repeats), timeout_s=900)
    for i in range(args.repeats):
        print(f"--- repeat {i}")
        for tables in results:
            print(tables[i])
    return 0


if __name__ == "__main__":
    sys.exit(main())
