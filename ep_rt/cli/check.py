"""python -m ep_rt [check]: run what ep_rt can do on this machine, compare every result with the reference, and
print a short table (then the benchmarks).

With GPUs (one rank per local GPU, or --ranks; several ranks may share a GPU), on fresh random inputs, each checked
bit for bit against ep_rt.reference:
  high throughput: get_dispatch_layout, dispatch, cached dispatch and combine (BF16, FP8 scales in every format,
    top-k and no top-k, num_worst_tokens, expert_alignment, bias, async events), then CUDA-graph replays;
  low latency: low_latency_dispatch / low_latency_combine (FP8, UE8M0, hooks, zero-copy, LogFMT, ...), then
    CUDA-graph replays;
then the HT and LL benchmarks (--no-bench skips them). --quick runs a few cases of each instead of all.
--internode G: the internode checks (and benchmark) on nodes of G ranks instead; on one host the nodes are
emulated (EP_RT_RANKS_PER_NODE=G).
Without a GPU no kernel can run: the reference implementation runs on the CPU instead (a dispatch + combine round
trip, over nodes of G ranks with --internode G) and the output says so.
"""

from __future__ import annotations

import argparse
import sys

import torch


def _cpu_demo(args) -> int:
    """No GPU: the reference's dispatch + combine round trip on the CPU, over nodes of G ranks with --internode G.
    Every option that needs kernels is named, with what runs instead."""
    from .. import reference

    G = args.internode
    R = args.ranks or (2 * G if G else 2)
    if G and (R % G or R // G < 2):
        print(f"--internode {G} --ranks {R}: the ranks must form at least 2 nodes of {G} ranks", file=sys.stderr)
        return 2
    print(
        "no CUDA GPU found: no kernel can run here, so ep_rt.reference runs on the CPU instead\n"
        f"({R} ranks{f' as {R // G} nodes of {G}' if G else ''}; nothing is compared with a kernel)."
    )
    if G:
        print(f"--internode {G}: the internode kernels need GPUs; this is the internode reference's round trip.")
    if args.quick:
        print("--quick: the CPU round trip is one small case either way.")
    if args.num_sms != NUM_SMS_DEFAULT or args.no_bench:
        print("--num-sms / --no-bench: there is no benchmark without a GPU.")
    torch.manual_seed(0)
    N, H, K, E = 64, 256, 4, 16 * R
    xs = [torch.randn(N, H).to(torch.bfloat16) for _ in range(R)]
    idxs = [torch.topk(torch.rand(N, E), K).indices for _ in range(R)]
    ws = [torch.rand(N, K) for _ in range(R)]
    if G:
        out = reference.internode_dispatch(xs, idxs, ws, E, num_channels=4, num_ranks_per_node=G)
        back = reference.internode_combine([o["recv_x"] for o in out], out)
    else:
        out = reference.intranode_dispatch(xs, idxs, ws, E, num_channels=4)
        back = reference.intranode_combine([o["recv_x"] for o in out], out)
    print(f"{'rank':>4} {'tokens':>6} {'received':>8} {'round trip = x * ranks reached':>31}")
    ok = True
    for r in range(R):
        reached = out[r]["is_token_in_rank"].sum(1, keepdim=True).float()
        good = torch.allclose(back[r]["combined_x"].float(), xs[r].float() * reached, rtol=1e-2, atol=1e-2)
        ok &= good
        print(f"{r:>4} {N:>6} {out[r]['num_recv']:>8} {'yes' if good else 'NO':>31}")
    return 0 if ok else 1


NUM_SMS_DEFAULT = 24


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ep_rt [check]", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=0, help="ranks to spawn (default: one per GPU)")
    parser.add_argument("--quick", action="store_true", help="a few checks instead of the whole list")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    parser.add_argument("--num-sms", type=int, default=NUM_SMS_DEFAULT, help="SMs (channels) for the benchmark")
    parser.add_argument(
        "--internode",
        type=int,
        default=0,
        metavar="G",
        help="check (and benchmark) internode mode instead, on nodes of G ranks; on one host the "
        "nodes are emulated (EP_RT_RANKS_PER_NODE=G) and the benchmark's 'RDMA' figures "
        "measure NVLink, not a network",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return _cpu_demo(args)
    from ..testing import main_check
    from ..testing.spawn import run_ranks

    num_ranks = args.ranks or max(torch.cuda.device_count(), 2 * args.internode)  # internode: two nodes at least
    body = main_check.internode_rank if args.internode else main_check.main_rank
    env = {"EP_RT_RANKS_PER_NODE": str(args.internode)} if args.internode else None
    results = run_ranks(body, num_ranks, args=(args.quick, not args.no_bench, args.num_sms), timeout_s=1800, env=env)
    print(
        f"ep_rt on {num_ranks} ranks, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, "
        f"seed {results[0]['seed']} (fresh each run); every check is bit-exact against ep_rt.reference "
        f"(LogFMT combines: within an allowance, measured in the notes after the table)"
    )
    print(f"{'case':<56} {'checks':>7} " + " ".join(f"{'rank ' + str(r):>7}" for r in range(num_ranks)))
    failed = 0
    for i, (name, checks, _) in enumerate(results[0]["rows"]):
        status = ["pass" if not res["rows"][i][2] else "FAIL" for res in results]
        failed += status.count("FAIL")
        print(f"{name:<56} {checks:>7} " + " ".join(f"{s:>7}" for s in status))
    for r, res in enumerate(results):
        for note in res.get("notes", []):
            print(f"rank {r} {note}")
    for r, res in enumerate(results):
        for name, _, failures in res["rows"]:
            for f in failures:
                print(f"rank {r} {name}: {f}")
    for res in results:
        if res["bench"]:
            print(res["bench"])
    return 1 if failed else 0
