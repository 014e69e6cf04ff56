"""The per-rank bodies of `python -m ep_rt` (ep_rt.cli.check): every check against the reference, then the
benchmarks."""

from __future__ import annotations

import torch.distributed as dist

from . import bench as bench_mod, bench_main, selfcheck_ll
from .checker import select, shared_seed
from .selfcheck_ht import run_case, run_graph_case, standard_cases

# The cases of --quick (a name that is not a case raises: checker.select).
QUICK_HT = ("bf16 HT shape", "fp8 row scales", "num_worst_tokens", "holes (-1 in topk_idx)", "bias pair")
QUICK_INTERNODE = ("bf16 HT shape", "fp8 row scales", "num_worst_tokens", "every token spans every node", "bias pair")
QUICK_LL = ("fp8", "hooks", "LL reference shape (128 x 7168, top-8, 288 experts)")


def main_rank(rank, num_ranks, quick, bench, num_sms):
    """One rank of `python -m ep_rt`: every check against the reference, then the benchmark."""
    from .. import Buffer, Config

    hint = Config(num_sms).get_nvl_buffer_size_hint(7168 * 2, num_ranks, 4096)
    buffer = Buffer(dist.group.WORLD, hint, explicitly_destroy=True)
    seed = shared_seed(buffer.group)
    cases = select(standard_cases(num_ranks), QUICK_HT if quick else None)
    rows = []
    for i, case in enumerate(cases):
        chk = run_case(buffer, case, seed + i)
        rows.append((case.name, chk.checks, chk.failures))
    chk = run_graph_case(buffer, seed + 500)
    rows.append(("cuda graph replays (num_worst_tokens)", chk.checks, chk.failures))
    bench_rows = bench_main.ht_round(buffer, num_sms) if bench else []
    buffer.destroy()
    ll_rows, ll_bench, notes = low_latency_round(num_ranks, seed, quick, bench)
    return {
        "seed": seed,
        "rows": rows + ll_rows,
        "notes": notes,
        "bench": "\n".join(
            x
            for x in (
                bench_mod.format_rows(bench_rows, rank) if bench_rows else "",
                bench_mod.format_ll_rows(ll_bench, rank) if ll_bench else "",
            )
            if x
        ),
    }


def internode_rank(rank, num_ranks, quick, bench, num_sms):
    """One rank of `python -m ep_rt --internode G` (EP_RT_RANKS_PER_NODE set by the caller on one host): the internode
    cases against ep_rt.reference.internode_*, graph replays, then the internode benchmark (labelled emulated)."""
    from .. import Buffer, Config
    from . import selfcheck_internode as sci

    cfg = Config(num_sms)
    buffer = Buffer(
        dist.group.WORLD,
        cfg.get_nvl_buffer_size_hint(7168 * 2, num_ranks, 4096),
        cfg.get_rdma_buffer_size_hint(7168 * 2, num_ranks, 4096),
        explicitly_destroy=True,
    )
    G = buffer.topology.node_size
    seed = shared_seed(buffer.group)
    cases = select(sci.internode_cases(num_ranks, G), QUICK_INTERNODE if quick else None)
    rows = []
    for i, case in enumerate(cases):
        chk = sci.run_case(buffer, case, seed + i, G)
        rows.append(("internode " + case.name, chk.checks, chk.failures))
    chk = sci.run_graph_case(buffer, seed + 500, G)
    rows.append(("internode cuda graph replays (num_worst_tokens)", chk.checks, chk.failures))
    bench_rows = bench_mod.bench_internode(buffer, num_sms=num_sms) if bench else []
    buffer.destroy()
    return {
        "seed": seed,
        "rows": rows,
        "bench": bench_mod.format_internode_rows(bench_rows, rank) if bench_rows else "",
    }


def low_latency_round(num_ranks, seed, quick, bench):
    """The LL part of `python -m ep_rt`: checks against ep_rt.reference_ll, graph replays, the LL benchmark.
    Returns (rows, benchmark rows, notes: the checks' measurements to print, e.g. differing LogFMT outputs)."""
    from .. import Buffer

    cases = select(selfcheck_ll.ll_cases(num_ranks), QUICK_LL if quick else None)
    need = max(Buffer.get_low_latency_rdma_size_hint(c.max_tokens, c.hidden, num_ranks, c.num_experts) for c in cases)
    buffer = Buffer(dist.group.WORLD, 0, need, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
    rows, notes = [], []
    for i, case in enumerate(cases):
        chk = selfcheck_ll.run_ll_case(buffer, case, seed + 1000 + i)
        rows.append(("LL " + case.name, chk.checks, chk.failures))
        notes += [f"LL {case.name}: {n}" for n in chk.notes]
    chk = selfcheck_ll.run_ll_graph(buffer, seed + 2000)
    rows.append(("LL cuda graph replays", chk.checks, chk.failures))
    ll_bench = bench_main.ll_round(buffer) if bench else []
    buffer.destroy()
    return rows, ll_bench, notes
