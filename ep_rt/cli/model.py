"""python -m ep_rt model: what ep_rt's internode calls should cost on a real cluster, from a model (no GPU, nothing
measured): the link bounds, the stages of the issue-21 design and their overlap, the network operations per call
and kernel with their quiet sweeps, the queue pairs per GPU, and the published numbers placed on the model
(docs/INTERNODE_DESIGN.md, "Performance model"). Bad values are argparse errors, never tracebacks."""

from __future__ import annotations

import argparse

from ..testing import internode_model as im
from ..testing import network_ops as ops
from ..testing import pipeline_model as pm

PROG = "python -m ep_rt model"
_SHORT = {"dispatch_fp8": "dispatch FP8", "dispatch_bf16": "dispatch BF16", "combine_bf16": "combine BF16"}
DOC_PREDICTIONS = ((im.H800, 4096), (im.H200, 4096), (im.H200, 8192))  # the doc's prediction blocks


# ---- argument types: a clear argparse error for every bad value -----------------------------------------------


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return v


def _node_count(text: str) -> int:
    v = _positive_int(text)
    if v < 2:
        raise argparse.ArgumentTypeError(f"{text} node(s): internode calls need at least 2 nodes")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return v


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be zero or positive")
    return v


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Predicted internode high-throughput times and DeepEP's bandwidth metrics on a real "
        "cluster, the network operations per call and kernel (--ops), and the queue pairs per GPU (--queue-pairs); "
        'a model, nothing measured (docs/INTERNODE_DESIGN.md, "Performance model").',
    )
    ap.add_argument("--tokens", type=_positive_int, default=4096, help="tokens per rank (default 4096)")
    ap.add_argument("--hidden", type=_positive_int, default=7168, help="hidden size (default 7168)")
    ap.add_argument("--topk", type=_positive_int, default=8, help="experts per token (default 8)")
    ap.add_argument("--experts", type=_positive_int, default=256, help="experts (default 256)")
    ap.add_argument("--ranks-per-node", type=_positive_int, default=8, help="G (default 8)")
    ap.add_argument(
        "--nodes", type=_node_count, nargs="+", default=[2, 4, 8, 16], help="node counts, each >= 2 (default 2 4 8 16)"
    )
    ap.add_argument(
        "--nic",
        type=_positive_float,
        default=None,
        help="NIC GB/s per GPU and direction for every cluster (default 46: a 400 Gb/s NIC's achievable)",
    )
    ap.add_argument(
        "--notify-us", type=_non_negative_float, default=0.0, help="notify time added to the link bounds (default 0)"
    )
    ap.add_argument("--channels", type=_positive_int, default=20, help="channels = SMs per kernel (default 20)")
    ap.add_argument(
        "--chunks",
        type=_positive_int,
        default=8,
        help="put-with-signals per (channel, node) stream for the overlapped prediction (default 8)",
    )
    ap.add_argument(
        "--qps", type=_positive_int, default=ops.DEFAULT_QPS, help="num_qps_per_rank for the sweep costs (default 24)"
    )
    ap.add_argument("--mc-tokens", type=_positive_int, default=8192, help="Monte Carlo tokens (default 8192)")
    ap.add_argument("--seed", type=int, default=0, help="Monte Carlo seed (default 0)")
    what = ap.add_mutually_exclusive_group()
    what.add_argument(
        "--ops",
        action="store_true",
        help="only the network operations per call and kernel (EP of --nodes x --ranks-per-node)",
    )
    what.add_argument("--queue-pairs", action="store_true", help="only the RC queue pairs per GPU (EP16/64/256)")
    ap.add_argument(
        "--per-call",
        action="store_true",
        help="with --ops: one row per (EP, call), the README's summary, instead of the per-kernel tables",
    )
    ap.add_argument(
        "--markdown",
        action="store_true",
        help="the predictions as docs/INTERNODE_DESIGN.md carries them (--ops and --queue-pairs always print markdown)",
    )
    return ap


def _check_shape(ap: argparse.ArgumentParser, args) -> None:
    """The cross-argument rules the model needs, as argparse errors naming the values."""
    G = args.ranks_per_node
    for N in args.nodes:
        R = N * G
        if args.experts % R:
            ap.error(
                f"--experts {args.experts} is not a multiple of the {R} ranks of {N} nodes x {G} "
                f"(every rank holds the same number of experts)"
            )
        groups, per_node = min(N, 4), args.experts // N
        if args.topk > groups * per_node:
            ap.error(
                f"--topk {args.topk} is more than the {groups * per_node} experts of the {groups} node groups "
                f"a token may use at {N} nodes"
            )


# ---- the text tables ------------------------------------------------------------------------------------------


def published_for(
    cluster: im.Cluster, num_nodes: int, kind: str, ranks_per_node: int, num_tokens: int, nic_gbps: float | None
) -> str:
    """DeepEP's published RDMA figures for exactly this row's shape (nodes, ranks per node, tokens, kind, GPU); a NIC
    other than the published one is said."""
    hits = [
        p
        for p in im.PUBLISHED
        if p.cluster.name == cluster.name
        and p.num_nodes == num_nodes
        and p.ranks_per_node == ranks_per_node
        and p.num_tokens == num_tokens
        and p.kind == kind
        and p.who.startswith("DeepEP")
        and "Feb-2025" not in p.who
    ]
    nic = (
        f" at {hits[0].cluster.nic_gbps:g} GB/s NIC"
        if hits and nic_gbps and nic_gbps != hits[0].cluster.nic_gbps
        else ""
    )
    return ", ".join(f"{p.rdma_gbps:g} ({p.source})" for p in hits) + nic if hits else "-"


def _clusters(nic_gbps):
    return [(cl, im.Cluster(cl.name, nic_gbps or cl.nic_gbps, cl.nvl_gbps)) for cl in (im.H800, im.H200)]


def bounds_table(a) -> str:
    lines = [
        f"Link bounds: T={a.tokens}, H={a.hidden}, top-{a.topk}, E={a.experts}, top-min(N,4) node groups, "
        f"G={a.ranks_per_node}; routing by Monte Carlo ({a.mc_tokens} tokens, seed {a.seed}); notify "
        f"{a.notify_us:g} us; RDMA / NVL = DeepEP's printed metrics",
        "",
    ]
    head = (
        f"{'cluster':<18}{'EP':>5}  {'r':>5} {'n':>6} {'p':>6}  {'kind':<14}{'time us':>10}{'bound':>8}"
        f"{'RDMA':>8}{'NVL':>8}{'ceiling':>9}  published RDMA GB/s (DeepEP, same shape)"
    )
    lines += [head, "-" * len(head)]
    for cl, cluster in _clusters(a.nic):
        for N in a.nodes:
            st = im.routing_stats(N, a.ranks_per_node, a.experts, a.topk, None, a.mc_tokens, a.seed)
            preds = im.predict(
                cluster.nic_gbps,
                cluster.nvl_gbps,
                N,
                a.ranks_per_node,
                a.tokens,
                a.hidden,
                a.topk,
                a.experts,
                a.notify_us,
                st,
            )
            ceiling = im.rdma_metric_ceiling(cluster.nic_gbps, cluster.nvl_gbps, st, a.ranks_per_node)
            for i, kind in enumerate(im.KINDS):
                p = preds[kind]
                left = (
                    (
                        f"{cl.name.split()[0] + f' ({cluster.nic_gbps:g}/{cluster.nvl_gbps:g})':<18}"
                        f"{N * a.ranks_per_node:>5}  {st.ranks_per_token:5.2f} {st.nodes_per_token:6.3f} "
                        f"{st.own_node:6.3f}"
                    )
                    if i == 0
                    else " " * 44
                )
                lines.append(
                    f"{left}  {_SHORT[kind]:<14}{p.total_us:10.0f}{p.bound:>8}{p.rdma_gbps:8.1f}"
                    f"{p.nvl_gbps:8.1f}{ceiling:9.1f}  "
                    f"{published_for(cl, N, kind, a.ranks_per_node, a.tokens, a.nic)}"
                )
    lines += [
        "",
        "(cluster: NIC/NVLink GB/s per GPU and direction; time = max(NIC, NVLink) + notify; RDMA, NVL: "
        "DeepEP's metrics at that time; ceiling = the largest RDMA metric the links allow)",
    ]
    return "\n".join(lines)


def _prediction_rows(a, cluster: im.Cluster, cl: im.Cluster, num_tokens: int):
    """(EP, kind, pipeline, serial, one chunk, chunks, cu12 extra, published) for each node count and kind."""
    for N in a.nodes:
        st = im.routing_stats(N, a.ranks_per_node, a.experts, a.topk, None, a.mc_tokens, a.seed)
        for kind in ("dispatch_fp8", "combine_bf16"):
            pl = pm.pipeline(
                kind, cluster, N, a.ranks_per_node, num_tokens, a.hidden, a.topk, a.experts, a.channels, st
            )
            yield (
                N * a.ranks_per_node,
                kind,
                pl,
                pl.serial_us(),
                pl.overlapped_us(1),
                pl.overlapped_us(a.chunks),
                pm.cu12_sweeps_us(kind, N, a.ranks_per_node, a.chunks, num_qps=a.qps),
                published_for(cl, N, kind, a.ranks_per_node, num_tokens, a.nic),
            )


def predictions_table(a) -> str:
    lines = [
        f"The issue-21 design's stages (us) and the call time: kernels one after another (serial), overlapped "
        f"with 1 put-with-signal per (channel, node) stream, and with {a.chunks}; RDMA = DeepEP's metric at that "
        f"time; cu12 = quiet sweeps that flavour adds at {a.chunks} chunks (rail world, lower bound, estimate). "
        f"T={a.tokens}, C={a.channels}.",
        "",
    ]
    head = (
        f"{'cluster':<14}{'EP':>4}  {'kind':<13}{'slowest stage':>20}{'serial':>8}{'1 chunk':>9}"
        f"{f'{a.chunks} chunks':>10}{'RDMA':>14}{'cu12 +':>8}  published (DeepEP)"
    )
    lines += [head, "-" * len(head)]
    for cl, cluster in _clusters(a.nic):
        for ep, kind, pl, serial, one, many, cu12, pub in _prediction_rows(a, cluster, cl, a.tokens):
            slow = f"{pl.slowest} {pl.busy[pl.slowest]:.0f}"
            rdma = f"{pl.rdma_gbps(one):.1f} / {pl.rdma_gbps(many):.1f}"
            lines.append(
                f"{cl.name.split()[0] + f' ({cluster.nic_gbps:g})':<14}{ep:>4}  {_SHORT[kind]:<13}"
                f"{slow:>20}{serial:8.0f}{one:9.0f}{many:10.0f}{rdma:>14}{cu12:8.0f}  {pub}"
            )
    return "\n".join(lines)


def predictions_markdown(a) -> str:
    """The doc's prediction tables: H800 and H200 at 4096 tokens (DeepEP V1's shape), H200 at 8192 (V2's)."""
    out = []
    for cl, T in DOC_PREDICTIONS:
        cluster = im.Cluster(cl.name, a.nic or cl.nic_gbps, cl.nvl_gbps)
        out += [
            f"{cl.name} ({cluster.nic_gbps:g} GB/s NIC, {cluster.nvl_gbps:g} GB/s NVLink per GPU), T = {T}, "
            f"C = {a.channels}:",
            "",
            f"| EP | call | slowest stage (us) | serial (us) | overlapped, 1 chunk (us) | overlapped, {a.chunks} "
            f"chunks (us) | RDMA GB/s (1 / {a.chunks} chunks) | cu12 sweeps + (us) | DeepEP published RDMA GB/s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for ep, kind, pl, serial, one, many, cu12, pub in _prediction_rows(a, cluster, cl, T):
            out.append(
                f"| {ep} | {_SHORT[kind]} | {pl.slowest} {pl.busy[pl.slowest]:.0f} | {serial:.0f} | {one:.0f} "
                f"| {many:.0f} | {pl.rdma_gbps(one):.1f} / {pl.rdma_gbps(many):.1f} | {cu12:.0f} | {pub} |"
            )
        out.append("")
    return "\n".join(out).rstrip()


def placements_table(a) -> str:
    lines = [
        "Published numbers placed on the model, on their own hardware and shapes (not the options above): "
        "implied us = T * n * B / RDMA; NIC, NVL = the link loads that time implies; model us = the bound "
        "there:"
    ]
    head = (
        f"{'who':<44}{'hardware':<27}{'EP':>4}  {'kind':<14}{'RDMA':>6}{'implied us':>11}{'NIC GB/s':>9}"
        f"{'NVL GB/s':>9}{'model us':>9}  reading"
    )
    lines += [head, "-" * len(head)]
    for pub in im.PUBLISHED:
        pl = im.place(pub, im.routing_stats(pub.num_nodes, pub.ranks_per_node, 256, 8, None, a.mc_tokens, a.seed))
        lines.append(
            f"{pub.who:<44}{pub.cluster.name:<27}{pub.num_nodes * pub.ranks_per_node:>4}  "
            f"{_SHORT[pub.kind]:<14}{pub.rdma_gbps:6g}{pl.implied_us:11.0f}{pl.nic_gbps:9.1f}"
            f"{pl.nvl_gbps:9.1f}{pl.bound_us:9.0f}  {pl.reading}"
        )
    return "\n".join(lines)


def ops_text(a) -> str:
    out = []
    for N in a.nodes:
        shape = ops.Shape(N * a.ranks_per_node, a.ranks_per_node, a.channels, a.tokens, a.topk, a.experts)
        out.append(ops.ops_table_markdown(shape, a.qps))
    return "\n\n".join(out)


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if a.per_call and not a.ops:
        ap.error("--per-call summarises --ops: give both")
    _check_shape(ap, a)
    if a.queue_pairs:
        print(ops.qp_table_markdown(ranks_per_node=a.ranks_per_node, qps=(ops.CONFIG_CHANNELS, a.qps)))
    elif a.ops and a.per_call:
        print(ops.per_call_markdown([N * a.ranks_per_node for N in a.nodes], a.qps, a.ranks_per_node))
    elif a.ops:
        print(ops_text(a))
    elif a.markdown:
        print(predictions_markdown(a))
    else:
        print("\n\n".join((bounds_table(a), predictions_table(a), placements_table(a))))
    return 0
