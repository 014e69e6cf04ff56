"""Per-rank bodies of the chaos-transport GPU tests (test_chaos_transport_gpu.py; module level for spawn).

The probe kernel ep_rt_ll_net_probe (kernels_src/low_latency.cu) lives in the LL family; PROBE mirrors its sizes
(tests/test_chaos_transport.py checks the mirror against the source)."""
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
    sizes = [("late", PROBE["late"]), ("order", PROBE["pairs"] * PROBE["row"]), ("overtake", PROBE["pairs"] * 8),
             ("own", PROBE["pairs"] * 8), ("flood", PROBE["flood"] * 16), ("sink", 8)]
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

    buf = Buffer(dist.group.WORLD, 0, PROBE_RDMA_BYTES, low_latency_mode=True, num_qps_per_rank=1,
                 explicitly_destroy=True)
    op = buf._ll
    rdma = op.rdma_tensor()
    rdma.zero_()
    torch.cuda.synchronize()
    dist.barrier()  # every destination is zero before anybody puts
    probe = Launcher(op.module, "ep_rt_ll_net_probe", abi.LowLatencyParams, block=256)
    probe.set(sym_base=op.sym, send_off=SEND_OFF, recv_off=RECV_OFF, rank=rank, num_ranks=num_ranks)
    probe(1, torch.cuda.current_stream())
    torch.cuda.synchronize()
    dist.barrier()  # every rank's probe (and so every put into us) is complete
    area = {name: rdma[RECV_OFF + off:RECV_OFF + off + size].cpu().clone() for name, off, size in probe_areas()}
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
        "late_old": int((late == old).sum()),             # the words as they were at the put
        "late_new": int((late == (old | (1 << 23))).sum()),  # the words rewritten before the flush
        "order_second_last": int((order == 2).all(dim=1).sum()),  # the pair arrived in issue order
        "order_first_last": int((order == 1).all(dim=1).sum()),   # reordered
        "overtake": counts(area["overtake"].view(torch.int64)),   # 101: signal after the data, 100: overtook it
        "own": counts(area["own"].view(torch.int64)),             # 101: a put_signal's signal after its own data
        "flood_ok": int((area["flood"].view(torch.int32).view(-1, 4) == flood_want).all(dim=1).sum()),
        "sink": int(area["sink"].view(torch.int64)[0]),  # one per put-with-signal of the probe
    }
