"""python -m ep_rt bench: the benchmarks alone, on DeepEP's reference workloads and in DeepEP's formulas.

HT (one node): dispatch BF16, dispatch FP8 and combine of 4096 tokens x 7168 per rank, top-8 of 256 experts.
LL: dispatch FP8, combine BF16 and LogFMT of 128 tokens x 7168 per rank, top-8 of 288 (and 256) experts.
Internode (--internode G, nodes of G ranks): dispatch BF16 / FP8 and combine of the same workload in DeepEP's
internode metrics ("RDMA" and "NVL" GB/s); on one host the nodes are emulated and the "RDMA" traffic crosses NVLink,
so those rows say nothing about a network (they are labelled). Each row has the kernel time (what
DeepEP's figures are), the whole-call time (what a caller waits for) and the bandwidth; --json writes every
number with the formulas used. `python -m ep_rt` (check) runs the same benchmark code after its checks.
With the chaos cubins (EP_RT_CHAOS_TRANSPORT=1) each LL and internode row also has its network operations per
call (put-with-signals, signals, quiets, fences, bytes, charged sweep time) on a line under it and as "network" in
--json; those times are then not network timings (the chaos delays and charged sweeps are in them).
"""

from __future__ import annotations

import argparse
import json
import sys

from .. import __version__
from ..testing import bench as bench_mod
from ..testing.bench_main import FORMULAS, LL_EXPERTS
from ..transport.ll_layout import MAX_SIGNALS
from . import plot


def document(results: list, num_sms: int, gpu: str, num_gpus: int) -> dict:
    return {
        "ep_rt": __version__,
        "gpu": gpu,
        "num_gpus": num_gpus,
        "num_ranks": len(results),
        "num_sms": num_sms,
        "formulas": FORMULAS,
        "ranks": results,
    }


def text(doc: dict) -> str:
    out = [f"ep_rt bench: {doc['num_ranks']} ranks on {doc['num_gpus']} x {doc['gpu']} (HT with {doc['num_sms']} SMs)"]
    for res in doc["ranks"]:
        if res["ht"]:
            out.append(f"rank {res['rank']}: HT NVL buffer {res.get('nvl_bytes', 0) / 2**20:.1f} MiB")
            out.append(bench_mod.format_rows([bench_mod.BenchRow(**r) for r in res["ht"]], res["rank"]))
    for res in doc["ranks"]:
        if res["ll"]:
            out.append(bench_mod.format_ll_rows(res["ll"], res["rank"]))
    for res in doc["ranks"]:
        if res.get("internode"):
            if "rdma_bytes" in res:
                out.append(
                    f"rank {res['rank']}: internode buffers: NVL {res['nvl_bytes'] / 2**20:.1f} MiB, "
                    f"RDMA {res['rdma_bytes'] / 2**20:.1f} MiB"
                )
            out.append(
                bench_mod.format_internode_rows(
                    [bench_mod.InternodeBenchRow(**r) for r in res["internode"]], res["rank"]
                )
            )
    return "\n".join(out)


def bandwidth_series(doc: dict):
    """(workload labels, {"rank r": GB/s per label}) of every HT and LL row, for the bar chart."""
    labels, series = [], {}
    for res in doc["ranks"]:
        inter = res.get("internode", [])
        values = [r["gbps"] for r in res["ht"]] + [r["gbps"] for r in res["ll"]] + [r["rdma_gbps"] for r in inter]
        names = (
            [f"HT {r['name']}" for r in res["ht"]]
            + [f"{r['name']} ({r['experts']} experts)" for r in res["ll"]]
            + [f"{r['name']} (RDMA metric{', emulated' if r['emulated'] else ''})" for r in inter]
        )
        if not labels:
            labels = names
        if names != labels:
            raise ValueError(f"rank {res['rank']} ran other workloads ({names}) than rank 0 ({labels})")
        series[f"rank {res['rank']}"] = values
    return labels, series


def _expert_counts(text: str) -> tuple:
    """--ll-experts: comma-separated expert counts, each in [1, MAX_SIGNALS] (the LL kernels' most experts), no
    repeats."""
    try:
        counts = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 288,36, got {text!r}") from None
    bad = [e for e in counts if not 1 <= e <= MAX_SIGNALS]
    if bad:
        raise argparse.ArgumentTypeError(f"expert counts must be in [1, {MAX_SIGNALS}], got {bad}")
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"an expert count twice in {text!r}")
    return counts


def _check_experts_per_rank(parser, experts, num_ranks: int) -> None:
    uneven = [e for e in experts if e % num_ranks]
    if uneven:
        parser.error(f"--ll-experts: {uneven} not a multiple of the {num_ranks} ranks (each rank holds E / ranks)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ep_rt bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--ht-only", action="store_true", help="only the high-throughput benchmark")
    what.add_argument("--ll-only", action="store_true", help="only the low-latency benchmark")
    what.add_argument(
        "--internode",
        type=int,
        default=0,
        metavar="G",
        help="only the internode benchmark, on nodes of G ranks (on one host: emulated nodes, "
        "EP_RT_RANKS_PER_NODE=G; the 'RDMA' figures then measure NVLink, not a network)",
    )
    parser.add_argument("--ranks", type=int, default=0, help="ranks (default: one per local GPU)")
    parser.add_argument("--num-sms", type=int, default=24, help="SMs (channels) of the HT calls (default 24)")
    parser.add_argument(
        "--nvl-fraction",
        type=float,
        default=1.0,
        metavar="F",
        help="HT on one node: an NVL buffer of F times the 4096-token hint, so each call goes in about 1/F rounds "
        "(the cost of a round, issue 22 item 4; default 1: one pass); with --internode, the NVL buffer of F times "
        "its one-pass hint",
    )
    parser.add_argument(
        "--rdma-fraction",
        type=float,
        default=1.0,
        metavar="F",
        help="with --internode: an RDMA buffer of F times its one-pass hint for 4096 tokens, so calls go in rounds "
        "(the cost of a round across nodes; default 1)",
    )
    parser.add_argument(
        "--ll-experts",
        type=_expert_counts,
        default=None,
        metavar="E1,E2,...",
        help=f"the LL rows' expert counts (default {','.join(map(str, LL_EXPERTS))}; each a multiple of the ranks, at "
        f"most {MAX_SIGNALS}); e.g. 36 on one rank has the 36 local experts per rank of EP8 at 288",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="write the results as JSON ('-': stdout)")
    parser.add_argument("--plot", metavar="PNG", default=None, help="draw bandwidth per workload and rank")
    args = parser.parse_args(argv)
    for flag, value in (("--nvl-fraction", args.nvl_fraction), ("--rdma-fraction", args.rdma_fraction)):
        if not 0.0 < value <= 1.0:
            parser.error(f"{flag} must be in (0, 1], got {value}")
    if args.nvl_fraction != 1.0 and args.ll_only:
        parser.error("--nvl-fraction is for the high-throughput benchmarks (one node, or --internode)")
    if args.rdma_fraction != 1.0 and not args.internode:
        parser.error("--rdma-fraction is for the internode benchmark (--internode G)")
    if args.ll_experts is not None and (args.ht_only or args.internode):
        parser.error("--ll-experts is for the low-latency benchmark (not with --ht-only or --internode)")
    if args.ll_experts is not None and args.ranks:
        _check_experts_per_rank(parser, args.ll_experts, args.ranks)

    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(
            "bench: error: no CUDA GPU found; the benchmarks time the kernels (python -m ep_rt doctor says "
            "what this machine has)"
        )
        return 1
    from ..testing import bench_main
    from ..testing.spawn import run_ranks

    num_gpus = torch.cuda.device_count()
    num_ranks = args.ranks or num_gpus
    ll_experts = args.ll_experts or LL_EXPERTS
    _check_experts_per_rank(parser, ll_experts, num_ranks)
    if num_ranks > num_gpus:
        print(
            f"bench: warning: {num_ranks} ranks on {num_gpus} GPUs share GPUs; the times are not those of "
            f"{num_ranks} GPUs",
            file=sys.stderr,
        )
    env = {"EP_RT_RANKS_PER_NODE": str(args.internode)} if args.internode else None
    results = run_ranks(
        bench_main.bench_rank,
        num_ranks,
        args=(
            not args.ll_only,
            not args.ht_only,
            args.num_sms,
            bool(args.internode),
            args.nvl_fraction,
            args.rdma_fraction,
            ll_experts,
        ),
        timeout_s=3600,
        env=env,
    )
    doc = document(results, args.num_sms, torch.cuda.get_device_name(0), num_gpus)
    if args.json == "-":
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print(text(doc))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
            print(f"wrote {args.json}")
    if args.plot:
        labels, series = bandwidth_series(doc)
        note = plot.bars(args.plot, labels, series, "GB/s (DeepEP's formulas)", f"ep_rt on {num_ranks} ranks")
        print(note, file=sys.stderr if args.json == "-" else sys.stdout)
    return 0
