"""Fault tests (issue 15's reliability suite): a late peer, a skipping peer and a killed peer, for the
high-throughput and the low-latency calls, with and without shrink mode. Each survivor must raise a clear error
(or, in shrink mode, mask the peer) within the timeout, its teardown must complete, and where every process is
still alive a fresh Buffer must work."""

from __future__ import annotations

import os
import time

import torch

from ..errors import CommTimeoutError, EpRtError

HT_SHAPE = dict(tokens=128, hidden=512, topk=4, experts=16)
LL_SHAPE = dict(T=64, hidden=1024, experts=16)


def _buffer(kind: str, R: int, timeout_s: float, shrink: bool = False):
    import torch.distributed as dist

    from .. import Buffer

    if kind == "ht":
        return Buffer(dist.group.WORLD, 32 << 20, explicitly_destroy=True, timeout_s=timeout_s)
    need = Buffer.get_low_latency_rdma_size_hint(LL_SHAPE["T"], LL_SHAPE["hidden"], R, LL_SHAPE["experts"])
    return Buffer(
        dist.group.WORLD,
        0,
        need,
        low_latency_mode=True,
        explicitly_destroy=True,
        timeout_s=timeout_s,
        enable_shrink=shrink,
    )


def _ht_call(buf, seed: int):
    g = torch.Generator(device=buf.device).manual_seed(seed + buf.rank)
    s = HT_SHAPE
    x = torch.randn(s["tokens"], s["hidden"], generator=g, device=buf.device).to(torch.bfloat16)
    idx = torch.topk(torch.rand(s["tokens"], s["experts"], generator=g, device=buf.device), s["topk"]).indices
    w = torch.rand(s["tokens"], s["topk"], generator=g, device=buf.device)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, s["experts"])
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    buf.combine(recv_x, handle, topk_weights=recv_w)
    torch.cuda.synchronize()
    buf.raise_if_failed()


def _ll_call(buf, seed: int):
    from .selfcheck_ll import LLCase, ll_inputs

    R, s = buf.group_size, LL_SHAPE
    case = LLCase("fault", max_tokens=s["T"], num_tokens=s["T"], hidden=s["hidden"], num_experts=s["experts"])
    xs, idxs, ws = ll_inputs(case, seed, R, buf.device)
    recv, _, handle, _, _ = buf.low_latency_dispatch(xs[buf.rank], idxs[buf.rank], s["T"], s["experts"])
    L = s["experts"] // R
    y = torch.zeros(L, R * s["T"], s["hidden"], dtype=torch.bfloat16, device=buf.device)
    buf.low_latency_combine(y, idxs[buf.rank], ws[buf.rank], handle)
    torch.cuda.synchronize()
    buf.raise_if_failed()


def _call(kind, buf, seed):
    return (_ht_call if kind == "ht" else _ll_call)(buf, seed)


def _attempt(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
        return {"error": None, "seconds": time.monotonic() - t0}
    except EpRtError as e:
        return {
            "error": f"{type(e).__name__}: {e}",
            "timeout": isinstance(e, CommTimeoutError),
            "seconds": time.monotonic() - t0,
        }


def _fresh_round(kind, R, timeout_s, seed) -> dict:
    from . import selfcheck_ht, selfcheck_ll

    buf = _buffer(kind, R, timeout_s)
    if kind == "ht":
        chk = selfcheck_ht.run_case(buf, selfcheck_ht.Case("fresh Buffer after a fault", num_tokens=128), seed)
    else:
        s = LL_SHAPE
        chk = selfcheck_ll.run_ll_case(
            buf,
            selfcheck_ll.LLCase(
                "fresh Buffer after a fault",
                max_tokens=s["T"],
                num_tokens=s["T"],
                hidden=s["hidden"],
                num_experts=s["experts"],
            ),
            seed,
        )
    buf.destroy()
    return {"checks": chk.checks, "failures": chk.failures[:5]}


def late_or_skipping_peer(rank: int, num_ranks: int, kind: str, fault: str, timeout_s: float, seed: int) -> dict:
    """The last rank comes to a call after the others' timeout ("late") or never makes it ("skip"). Every process
    stays alive: after the fault each destroys its Buffer and a fresh one runs a checked round."""
    import torch.distributed as dist

    faulty = rank == num_ranks - 1
    buf = _buffer(kind, num_ranks, timeout_s)
    _call(kind, buf, seed)  # a good call first
    dist.barrier()
    out = {"faulty": faulty}
    if faulty and fault == "late":
        time.sleep(1.5 * timeout_s + 2)
    if not (faulty and fault == "skip"):
        out["call"] = _attempt(lambda: _call(kind, buf, seed + 1))
    out["destroy"] = _attempt(buf.destroy)
    dist.barrier()
    out["fresh"] = _fresh_round(kind, num_ranks, timeout_s, seed + 2)
    return out


def killed_peer(rank: int, num_ranks: int, kind: str, shrink: bool, timeout_s: float, seed: int):
    """The last rank's process dies between two calls. The survivors' next call raises within the timeout or, in
    shrink mode (LL), masks the dead rank and returns the reference's result without it; their teardown completes.
    No fresh Buffer: the process group itself lost a rank. Each survivor also says where it ran: how many peers
    are on other nodes (on emulated nodes, EP_RT_RANKS_PER_NODE, the dead rank's puts), whether under the chaos
    transport, and which LL cubin variant it loaded."""
    import torch.distributed as dist

    from .. import env, reference_ll
    from .selfcheck_ll import LLCase, expert_outputs, ll_inputs, to_packed

    buf = _buffer(kind, num_ranks, timeout_s, shrink=shrink)
    _call(kind, buf, seed)
    dist.barrier()
    if rank == num_ranks - 1:
        os._exit(0)  # as a crash would: no teardown, no goodbye
    time.sleep(2.0)  # the peer is gone before the next call starts
    out = {
        "remote_peers": num_ranks - buf.topology.node_size,
        "chaos": env.chaos_transport(),
        "variant": buf.low_latency_variant,  # the LL cubin it loaded (None for HT)
    }
    if shrink:
        R, s = num_ranks, LL_SHAPE
        T, H, E, L = s["T"], s["hidden"], s["experts"], s["experts"] // num_ranks
        case = LLCase("after a peer died", max_tokens=T, num_tokens=T, hidden=H, num_experts=E)
        xs, idxs, ws = ll_inputs(case, seed + 1, R, buf.device)
        t0 = time.monotonic()
        recv, count, handle, _, _ = buf.low_latency_dispatch(xs[rank], idxs[rank], T, E)
        ys = [expert_outputs(seed, r, L, R, T, H, buf.device) for r in range(R)]
        combined, _, _ = buf.low_latency_combine(
            to_packed(ys[rank], handle[0], handle[1], T), idxs[rank], ws[rank], handle
        )
        torch.cuda.synchronize()
        out["seconds"] = time.monotonic() - t0
        masked = (R - 1,)
        want = reference_ll.low_latency_dispatch(xs, idxs, T, E, masked_ranks=masked)
        ref_in = [
            to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T) for r in range(R)
        ]
        ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want, masked_ranks=masked, ranks=(rank,))[rank][
            "combined_x"
        ]
        status = torch.zeros(R, dtype=torch.int32, device=buf.device)
        buf.low_latency_query_mask_buffer(status)
        out["mask"] = status.tolist()
        out["count_ok"] = bool(torch.equal(count, want[rank]["packed_recv_count"]))
        out["combine_ok"] = bool(torch.equal(combined.view(torch.int16), ref.view(torch.int16)))
        out["error"] = None
        try:
            buf.raise_if_failed()
        except EpRtError as e:
            out["error"] = str(e)
    else:
        out["call"] = _attempt(lambda: _call(kind, buf, seed + 1))
    out["destroy"] = _attempt(buf.destroy)
    return out


def _internode_call(buf, seed: int, exit_after_dispatch: bool = False):
    """One internode dispatch + combine of small random inputs; with exit_after_dispatch the process dies as soon
    as dispatch has returned (its send, forward and receive kernels queued or running: mid-call for its peers)."""
    s = HT_SHAPE
    E = 4 * buf.group_size
    g = torch.Generator(device=buf.device).manual_seed(seed + buf.rank)
    x = torch.randn(s["tokens"], s["hidden"], generator=g, device=buf.device).to(torch.bfloat16)
    idx = torch.topk(torch.rand(s["tokens"], E, generator=g, device=buf.device), s["topk"]).indices
    w = torch.rand(s["tokens"], s["topk"], generator=g, device=buf.device)
    per_rank, per_node, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_node,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    if exit_after_dispatch:
        os._exit(0)  # as a crash would: no teardown, no goodbye, kernels in flight
    buf.combine(recv_x, handle, topk_weights=recv_w)
    torch.cuda.synchronize()
    buf.raise_if_failed()


def killed_node(rank: int, num_ranks: int, ranks_per_node: int, mid_call: bool, seed: int) -> dict:
    """Every rank of the last node dies, between two calls or in the middle of one (right after its dispatch
    launched, before its combine). Each survivor must raise CommTimeoutError naming a rank of that node within the
    network deadline, and its teardown must complete. The deadlines come from EP_RT_TIMEOUT_S / EP_RT_NET_TIMEOUT_S."""
    import torch.distributed as dist

    from .. import Buffer, env

    # Generous for HT_SHAPE (128 tokens of 512 bf16 to every rank would need under 4 MiB of either).
    buf = Buffer(dist.group.WORLD, 16 << 20, 32 << 20, explicitly_destroy=True)
    assert buf.topology.num_nodes > 1 and buf.topology.node_size == ranks_per_node, (
        f"killed_node needs nodes of {ranks_per_node} ranks (EP_RT_RANKS_PER_NODE), got {buf.topology.describe()}"
    )
    _internode_call(buf, seed)  # a good call first
    dist.barrier()
    dying = buf.topology.node == buf.topology.num_nodes - 1
    if dying and not mid_call:
        os._exit(0)
    if not mid_call:
        time.sleep(2.0)  # the node is gone before the next call starts
    out = {"node": buf.topology.node, "net_timeout_s": env.net_timeout_s(env.timeout_s())}
    out["call"] = _attempt(lambda: _internode_call(buf, seed + 1, exit_after_dispatch=dying))
    out["destroy"] = _attempt(buf.destroy)
    return out
