"""Per-rank bodies of the chaos-transport GPU tests (test_chaos_transport_gpu.py; module level for spawn).

The probe kernel ep_rt_ll_net_probe (kernels_src/low_latency.cu) lives in the LL family; PROBE mirrors its sizes
(tests/transport/test_chaos_transport.py checks the mirror against the source)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import workers

CHAOS_SLOTS = 512  # EP_RT_NET_CHAOS_SLOTS (kernels_src/include/ep_rt/net.cuh)
PROBE = {"late": 4096, "pairs": 64, "row": 64, "flood": CHAOS_SLOTS + 64}
PROBE_SIGNALS = 1 + 3 * PROBE["pairs"] + PROBE["flood"]  # the probe's put-with-signals into the sink word
SEND_OFF, RECV_OFF = 0, 1 << 16  # in the caller's part of the symmetric buffer; sources and destinations apart
PROBE_RDMA_BYTES = 1 << 20


def probe_areas():
    """(name, offset from RECV_OFF, bytes) of the probe's destinations, in the kernel's order."""
    sizes = [
        ("late", PROBE["late"]),
        ("order", PROBE["pairs"] * PROBE["row"]),
        ("overtake", PROBE["pairs"] * 8),
        ("own", PROBE["pairs"] * 8),
        ("flood", PROBE["flood"] * 16),
        ("sink", 8),
    ]
    out, off = [], 0
    for name, size in sizes:
        out.append((name, off, size))
        off += size
    return out


def ll_suite(rank, num_ranks):
    """workers.ll_suite, plus the cubin the Buffer loaded (its variant says which transport ran)."""
    from ep_rt.ops.low_latency import LowLatencyOp
    from ep_rt.transport.nvshmem import host_flavour

    entry = LowLatencyOp.cubin_entry(torch.cuda.current_device(), host_flavour())
    res = workers.ll_suite(rank, num_ranks)
    res["cubin"] = entry["path"]
    return res


def net_probe(rank, num_ranks):
    """Run the probe kernel once on every rank (each puts to rank ^ 1), then read what arrived here."""
    from ep_rt import Buffer
    from ep_rt.runtime import abi
    from ep_rt.runtime.launch import Launcher

    buf = Buffer(
        dist.group.WORLD, 0, PROBE_RDMA_BYTES, low_latency_mode=True, num_qps_per_rank=1, explicitly_destroy=True
    )
    op = buf._ll
    rdma = op.rdma_tensor()
    rdma.zero_()
    torch.cuda.synchronize()
    dist.barrier()  # every destination is zero before anybody puts
    probe = Launcher(op.module, "ep_rt_ll_net_probe", abi.LowLatencyParams)
    probe.set(sym_base=op.sym, send_off=SEND_OFF, recv_off=RECV_OFF, rank=rank, num_ranks=num_ranks)
    if op.net_stats is not None:
        op.net_stats.reset()
    probe(1, torch.cuda.current_stream())
    torch.cuda.synchronize()
    stats = op.net_stats.read() if op.net_stats is not None else None
    sweep = int(op.net_stats.sweep.item()) if op.net_stats is not None else None
    dist.barrier()  # every rank's probe (and so every put into us) is complete
    area = {name: rdma[RECV_OFF + off : RECV_OFF + off + size].cpu().clone() for name, off, size in probe_areas()}
    buf.destroy()

    peer = rank ^ 1
    words = torch.arange(PROBE["late"] // 4, dtype=torch.int32)
    late = area["late"].view(torch.int32)
    old = (peer << 24) | words
    order = area["order"].view(torch.int32).view(PROBE["pairs"], PROBE["row"] // 4)
    j = torch.arange(PROBE["flood"], dtype=torch.int32)
    flood_want = torch.stack([j, torch.full_like(j, peer + 1), torch.full_like(j, 7), ~j], dim=1)

    def counts(t):
        values, n = torch.unique(t, return_counts=True)
        return {int(v): int(c) for v, c in zip(values, n)}

    return {
        "variant": op.module.entry["variant"],
        "late_old": int((late == old).sum()),  # the words as they were at the put
        "late_new": int((late == (old | (1 << 23))).sum()),  # the words rewritten before the flush
        "order_second_last": int((order == 2).all(dim=1).sum()),  # the pair arrived in issue order
        "order_first_last": int((order == 1).all(dim=1).sum()),  # reordered
        "overtake": counts(area["overtake"].view(torch.int64)),  # 101: signal after the data, 100: overtook it
        "own": counts(area["own"].view(torch.int64)),  # 101: a put_signal's signal after its own data
        "flood_ok": int((area["flood"].view(torch.int32).view(-1, 4) == flood_want).all(dim=1).sum()),
        "sink": int(area["sink"].view(torch.int64)[0]),  # one per put-with-signal of the probe
        "stats": stats,
        "sweep_ns": sweep,  # the chaos build's counts of the probe's operations, and its charge
    }


def _chunks(count: int) -> tuple[int, int]:
    """(put-with-signals, bare signals) of one (channel, node) stream of `count` entries (params.h
    EP_RT_IN_STREAM_CHUNKS): min(count, 8) chunks, or one bare signal when empty. Written from the rule, not the
    kernels."""
    return (min(count, 8), 0) if count > 0 else (0, 1)


def _streams(cpm: torch.Tensor, me_node: int) -> tuple[int, int]:
    """Sum of _chunks over every (channel, other node) stream of an inclusive prefix matrix [N, C]."""
    counts = torch.diff(cpm.cpu().to(torch.int64), dim=1, prepend=torch.zeros(cpm.size(0), 1, dtype=torch.int64))
    puts = bare = 0
    for n in range(counts.size(0)):
        if n == me_node:
            continue
        for c in counts[n].tolist():
            p, b = _chunks(int(c))
            puts, bare = puts + p, bare + b
    return puts, bare


def net_ops(rank, num_ranks):
    """Under the chaos variant's cost mode: the network operations one internode dispatch, cached dispatch and
    combine, and one LL dispatch and combine issue on this rank (counted by the kernels' module), with what the
    design says they must be, worked out here from the call's own routing."""
    from ep_rt import Buffer
    from ep_rt.transport import internode_layout

    G = int(__import__("os").environ["EP_RT_RANKS_PER_NODE"])
    N, me_node = num_ranks // G, rank // G
    T, H, K, E = 64, 512, 4, 8 * num_ranks
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    out = {"rank": rank}
    # ---- internode high-throughput (an HT-only Buffer: the rail world) ----
    buf = Buffer(
        dist.group.WORLD,
        internode_layout.nvl_size_hint(2 * H, num_ranks, G, T),
        internode_layout.rdma_size_hint(2 * H, num_ranks, G, T),
        explicitly_destroy=True,
    )
    stats = buf._ht.net_stats
    assert stats is not None, "the chaos variant counts"
    out["flavour"] = buf._ht.module.entry["flavour"]
    x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, device="cuda", generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, device="cuda", generator=g)
    layout = buf.get_dispatch_layout(idx, E)
    torch.cuda.synchronize()
    dist.barrier()
    stats.reset()
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(
        x,
        num_tokens_per_rank=layout[0],
        num_tokens_per_rdma_rank=layout[1],
        is_token_in_rank=layout[3],
        num_tokens_per_expert=layout[2],
        topk_idx=idx,
        topk_weights=w,
    )
    got = stats.read()
    puts, bare = _streams(handle[1], me_node)  # rdma_channel_prefix_matrix: my streams to each node
    out["dispatch"] = (got, {"put_signals": (N - 1) + puts, "signals": bare})
    dist.barrier()
    stats.reset()
    buf.dispatch(x, handle=handle)
    got = stats.read()
    out["cached"] = (got, {"put_signals": puts, "signals": (N - 1) + bare})
    dist.barrier()
    stats.reset()
    buf.combine(recv_x, handle, recv_w)
    got = stats.read()
    cputs, cbare = _streams(handle[3], me_node)  # recv_rdma_channel_prefix_matrix: what I forward back per node
    out["combine"] = (got, {"put_signals": cputs, "signals": (N - 1) + cbare})
    torch.cuda.synchronize()
    buf.destroy()
    return out


def net_ops_ll(rank, num_ranks):
    """As net_ops, for one LL dispatch and combine (a low_latency_mode Buffer: the world of all ranks)."""
    from ep_rt import Buffer

    G = int(__import__("os").environ["EP_RT_RANKS_PER_NODE"])
    T, H, K, E = 32, 1024, 4, 4 * num_ranks
    L = E // num_ranks
    g = torch.Generator(device="cuda").manual_seed(99 + rank)
    buf = Buffer(
        dist.group.WORLD,
        0,
        Buffer.get_low_latency_rdma_size_hint(T, H, num_ranks, E),
        low_latency_mode=True,
        num_qps_per_rank=L,
        explicitly_destroy=True,
    )
    stats = buf._ll.net_stats
    assert stats is not None, "the chaos variant counts"
    x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, device="cuda", generator=g)[:K] for _ in range(T)])
    idx[0, 0] = -1  # a hole: no message
    w = torch.rand(T, K, device="cuda", generator=g)
    torch.cuda.synchronize()
    dist.barrier()
    stats.reset()
    recv, counts, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
    torch.cuda.synchronize()
    got = stats.read()
    remote = lambda r: r // G != rank // G  # noqa: E731  (a rank of another node)
    valid = idx[idx >= 0]
    messages = int(sum(int(remote(int(e) // L)) for e in valid.tolist()))
    other = sum(1 for r in range(num_ranks) if remote(r))
    out = {
        "rank": rank,
        "flavour": buf._ll.module.entry["flavour"],
        "dispatch": (got, {"put_signals": messages, "signals": L * other + other}),
    }
    dist.barrier()
    stats.reset()
    buf.low_latency_combine(recv, idx, w, handle)
    torch.cuda.synchronize()
    got = stats.read()
    # rows I send back to other nodes: every row I received from one (the dispatch layout of my experts)
    layout_range = handle[1]
    rows_back = int(
        sum(int(v) & 0xFFFFFFFF for i, v in enumerate(layout_range.flatten().tolist()) if remote(i % num_ranks))
    )
    out["combine"] = (got, {"put_signals": rows_back, "signals": L * other + other})
    buf.destroy()
    return out
