"""The per-rank body of `python -m ep_rt tune` (ep_rt.cli.tune): the HT benchmark (ep_rt.testing.bench) at every
SM count of a sweep, for the caller's shape. Rank 0 draws the progress bar."""

from __future__ import annotations

import torch.distributed as dist

from . import bench
from .progress import Progress


def sweep_rank(rank, num_ranks, num_tokens, hidden, num_topk, num_experts, dtype, sms_list, warmup, iters):
    """One row per SM count: kernel and call times of the dispatch (bf16 or fp8) and of the combine of a bf16
    dispatch's rows, on this rank."""
    from .. import Buffer, Config

    dispatch = "dispatch FP8" if dtype == "fp8" else "dispatch BF16"
    buffer = Buffer(
        dist.group.WORLD, Config().get_nvl_buffer_size_hint(hidden * 2, num_ranks, num_tokens), explicitly_destroy=True
    )
    progress = Progress(len(sms_list), f"tuning on {num_ranks} ranks") if rank == 0 else None
    rows = []
    try:
        for i, num_sms in enumerate(sms_list):
            if progress:
                progress.update(i, f"num_sms={num_sms}")
            d, c = bench.bench_ht(
                buffer,
                num_tokens,
                hidden,
                num_topk,
                num_experts,
                num_sms,
                warmup,
                iters,
                workloads=(dispatch, "combine BF16"),
            )
            rows.append(
                {
                    "num_sms": num_sms,
                    "dispatch_us": d.kernel_us,
                    "dispatch_gbps": d.gbps,
                    "dispatch_call_us": d.call_us,
                    "combine_us": c.kernel_us,
                    "combine_gbps": c.gbps,
                    "combine_call_us": c.call_us,
                    "num_recv": d.num_recv,
                }
            )
        if progress:
            progress.update(len(sms_list), "done")
    finally:
        buffer.destroy()
    return rows
