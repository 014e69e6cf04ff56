"""The benchmark rounds, shared by `python -m ep_rt bench` (the per-rank body here) and `python -m ep_rt` (check,
ep_rt.testing.main_check), so both measure with the same code: ep_rt.testing.bench's HT and LL benchmarks on
DeepEP's reference workloads."""

from __future__ import annotations

from dataclasses import asdict

import torch.distributed as dist

from . import bench

# DeepEP's formulas, as ep_rt.testing.bench applies them (written into --json output beside the numbers).
FORMULAS = {
    "ht kernel_us": "median of CUDA events around the dispatch (notify excluded, as DeepEP reports it) or combine "
    "kernel, L2 flushed and the ranks' GPUs lined up before each call",
    "ht call_us": "median of events on the caller's stream around the whole Python call (notify and the host's "
    "wait for the receive count included), the ranks lined up by a sleep that also covers the Python before the "
    "call's first launch (a host running ahead of the GPU); host_us: the call's host time without the line-up; "
    "caller_us: events around those calls, the GPU idle when each starts: the Python, the waits and the kernels in "
    "a row, what a caller waits for from the call's first line",
    "ht gbps": "received rows x hidden x 2 bytes / kernel time (FP8 dispatch: x (1 + 4/128) / 2, the FP8 row "
    "and its f32 scales)",
    "ll kernel_us": "send start to receive end of a whole call, from the kernels' own profiler times (DeepEP's "
    "kineto method); 'events' are the CUDA-event figures of the same calls",
    "ll call_us": "events around the whole Python call, what a caller waits for",
    "ll gbps": "this rank's valid selections x (hidden + hidden / 128 x 4 + 16) bytes (FP8 dispatch) or x hidden "
    "x 2 bytes (combine, LogFMT too) / kernel time",
    "internode kernel_us": "median over calls of the sum of the call's kernels (dispatch: send + forward + receive, "
    "notify apart as DeepEP reports it; combine: publish + forward + reduce), L2 flushed, the "
    "ranks met at a barrier before each call",
    "internode rdma_gbps": "DeepEP's 'RDMA' metric: sum of num_tokens_per_rdma_rank (tokens x nodes they reach, own "
    "node included) x bytes per token / kernel time (bytes: BF16 2H, FP8 H(1 + 4/128))",
    "internode nvl_gbps": "DeepEP's 'NVL' metric: received rows x bytes per token / kernel time",
    "internode emulated": "true: nodes emulated on one host (EP_RT_RANKS_PER_NODE), the 'RDMA' traffic crossed "
    "NVLink, not a network",
    "network": "LL and internode rows, only with the chaos cubins (EP_RT_CHAOS_TRANSPORT=1): per call, the "
    "put_signals, signals, quiets, fences, bytes and charged_ns (sweep time charged to the quiets and fences) the "
    "chaos transport counted over untimed calls after the timing; those rows' times are then not network timings "
    "(the chaos delays and charged sweeps included)",
}
LL_SHAPE = (128, 7168, 288)  # DeepEP's LL reference workload: tokens per rank, hidden, experts (top-8)
LL_EXPERTS = (288, 256)  # the expert counts of the LL rows: DeepEP's, and the other count peers publish


def ht_round(buffer, num_sms: int) -> list:
    return bench.bench_ht(buffer, num_sms=num_sms)


def ll_round(buffer, experts=LL_EXPERTS) -> list:
    """The LL reference workload at each expert count (default 288, and 256, the other count peers publish); all
    timed before any is profiled (bench_ll_shapes)."""
    return bench.bench_ll_shapes(buffer, tuple(experts))


def ht_buffer(num_ranks: int, num_sms: int, nvl_fraction: float = 1.0):
    """The HT benchmark's Buffer: an NVL buffer of nvl_fraction times the 4096-token hint at hidden 7168 (below 1,
    each call goes in rounds)."""
    from .. import Buffer, Config

    hint = Config(num_sms).get_nvl_buffer_size_hint(7168 * 2, num_ranks, 4096)
    return Buffer(dist.group.WORLD, _fraction_of(hint, nvl_fraction), explicitly_destroy=True)


def ll_buffer(num_ranks: int, experts=LL_EXPERTS):
    """The LL benchmark's Buffer, sized for LL_SHAPE's tokens and hidden at the largest of the expert counts (the
    hint grows with the expert count in both layouts), with DeepEP's num_qps_per_rank (experts per rank)."""
    from .. import Buffer

    T, H, _ = LL_SHAPE
    E = max(experts)
    return Buffer(
        dist.group.WORLD,
        0,
        Buffer.get_low_latency_rdma_size_hint(T, H, num_ranks, E),
        low_latency_mode=True,
        num_qps_per_rank=E // num_ranks,
        explicitly_destroy=True,
    )


def _fraction_of(hint: int, fraction: float) -> int:
    return -(-int(hint * fraction) // 128) * 128  # DeepEP's 128-byte alignment of the buffer sizes


def internode_buffer(num_ranks: int, num_sms: int, nvl_fraction: float = 1.0, rdma_fraction: float = 1.0):
    """The internode benchmark's Buffer: each buffer the given fraction of its one-pass hint for 4096 tokens at
    hidden 7168 (the node size from EP_RT_RANKS_PER_NODE, emulated nodes, or 8 ranks per node); below 1, each call
    goes in rounds (internode_rounds)."""
    from .. import Buffer, Config

    cfg = Config(num_sms)
    return Buffer(
        dist.group.WORLD,
        _fraction_of(cfg.get_nvl_buffer_size_hint(7168 * 2, num_ranks, 4096), nvl_fraction),
        _fraction_of(cfg.get_rdma_buffer_size_hint(7168 * 2, num_ranks, 4096), rdma_fraction),
        explicitly_destroy=True,
    )


def bench_rank(
    rank,
    num_ranks,
    ht: bool,
    ll: bool,
    num_sms: int,
    internode: bool = False,
    nvl_fraction: float = 1.0,
    rdma_fraction: float = 1.0,
    ll_experts=LL_EXPERTS,
) -> dict:
    """One rank of `python -m ep_rt bench`: the HT rows (dicts of bench.BenchRow), the LL rows, and with `internode`
    (ranks on several nodes, real or emulated) only the internode rows. nvl_fraction < 1: the HT Buffer's NVL
    buffer is that fraction of the 4096-token hint, and each call goes in rounds (`nvl_bytes` in the result); with
    `internode`, nvl_fraction and rdma_fraction scale the internode Buffer's two buffers alike (`nvl_bytes`,
    `rdma_bytes`)."""
    out = {"rank": rank, "ht": [], "ll": [], "internode": []}
    if internode:
        buffer = internode_buffer(num_ranks, num_sms, nvl_fraction, rdma_fraction)
        out["nvl_bytes"], out["rdma_bytes"] = buffer.num_nvl_bytes, buffer.num_rdma_bytes
        out["internode"] = [bench.internode_record(r) for r in bench.bench_internode(buffer, num_sms=num_sms)]
        buffer.destroy()
        return out
    if ht:
        buffer = ht_buffer(num_ranks, num_sms, nvl_fraction)
        out["nvl_bytes"] = buffer.num_nvl_bytes
        out["ht"] = [asdict(r) for r in ht_round(buffer, num_sms)]
        buffer.destroy()
    if ll:
        buffer = ll_buffer(num_ranks, ll_experts)
        # which LL cubin ran (EP_RT_LL_PACKED: "packed") and the buffer the hint sized for it
        out["ll_variant"], out["ll_rdma_bytes"] = buffer.low_latency_variant, buffer.num_rdma_bytes
        out["ll"] = ll_round(buffer, ll_experts)
        buffer.destroy()
    return out
