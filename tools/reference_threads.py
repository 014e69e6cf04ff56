"""What torch's CPU thread count does to many ranks running the LL reference at once on one host (the 2x8 pools of
tests/gpu run it on the CPU, NodesPool.reference_device). Spawns N processes, each computing one round of a 16-rank
case's reference the way selfcheck_ll.run_ll_case does for its own rank (every rank's inputs and dispatch, every
rank's expert outputs placed in their packed rows, the combine for its own rank), once with torch's default threads
(one per core in every process) and once with each process's share of the cores (tests/gpu/workers.py's
share_cpu_threads). Prints the wall time and the slowest process's time for each. No GPU needed.

    python tools/reference_threads.py [--procs 16] [--case bf16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def one_rank(threads: int, me: int, case_name: str, ranks: int) -> float:
    import torch

    if threads:
        torch.set_num_threads(threads)
    from ep_rt import reference_ll
    from ep_rt.testing.selfcheck_ll import expert_outputs, ll_cases, ll_inputs, to_packed

    (case,) = [c for c in ll_cases(ranks) if c.name == case_name]
    T, H, E = case.max_tokens, case.hidden, case.num_experts
    L = E // ranks
    start = time.perf_counter()
    xs, idxs, ws = ll_inputs(case, 1, ranks, "cpu")
    want = reference_ll.low_latency_dispatch(
        xs, idxs, T, E, use_fp8=case.use_fp8, round_scale=case.round_scale, use_ue8m0=case.use_ue8m0
    )
    ys = [expert_outputs(1, r, L, ranks, T, H, "cpu") for r in range(ranks)]
    packed = [
        to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T) for r in range(ranks)
    ]
    reference_ll.low_latency_combine(packed, idxs, ws, want, ranks=(me,))
    return time.perf_counter() - start


def run(threads: int, procs: int, case_name: str, ranks: int) -> tuple[float, float]:
    with mp.get_context("spawn").Pool(procs) as pool:
        start = time.perf_counter()
        times = pool.starmap(one_rank, [(threads, i % ranks, case_name, ranks) for i in range(procs)])
        return time.perf_counter() - start, max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=16, help="processes at once (the ranks sharing the host)")
    ap.add_argument("--ranks", type=int, default=16, help="the case's rank count")
    ap.add_argument("--case", default="bf16", help="an ep_rt.testing.selfcheck_ll.ll_cases name")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    for label, threads in (("torch's default", 0), ("share of the cores", max(1, cores // args.procs))):
        wall, slowest = run(threads, args.procs, args.case, args.ranks)
        print(
            f"{args.procs} processes on {cores} cores, threads {label} ({threads or 'default'}): "
            f"wall {wall:.1f} s, slowest process {slowest:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
