"""Per-rank bodies of the multi-GPU tests (module level so spawned processes can import them)."""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist

from ep_rt import Buffer, Config
from ep_rt.runtime import driver as _driver
from ep_rt.testing import checker, selfcheck_ht as selfcheck
from ep_rt.testing.rank_pool import rank_cache, rank_forget
from ep_rt.errors import BufferTooSmallError, CommTimeoutError, EpRtError

MB = 1 << 20


def buffer_basics(rank, num_ranks):
    buf = Buffer(dist.group.WORLD, 64 * MB, explicitly_destroy=True)
    assert (buf.rank, buf.group_size, buf.num_nvl_bytes) == (rank, num_ranks, 64 * MB)
    assert buf.low_latency_mode is False and buf.explicitly_destroy is True
    assert isinstance(buf.get_comm_stream(), torch.cuda.Stream)
    assert Buffer.is_sm90_compiled()
    # Peer mapping: each rank writes a pattern into its own buffer; every rank reads every peer's.
    local = buf.get_local_buffer_tensor(torch.int32, size=(1024,), offset=256)
    local.copy_(torch.arange(1024, dtype=torch.int32, device=buf.device) * (rank + 1) + 7)
    torch.cuda.synchronize()
    buf._nvl.barrier(buf.comm_stream)
    seen = []
    for peer in range(num_ranks):
        view = buf._nvl.data_tensor(peer)[256 : 256 + 4096].view(torch.int32)
        want = torch.arange(1024, dtype=torch.int32, device=buf.device) * (peer + 1) + 7
        seen.append(bool(torch.equal(view, want)))
    assert all(seen), f"rank {rank} read wrong bytes from peers: {seen}"
    # Device barrier several times in a row.
    for _ in range(5):
        buf._nvl.barrier(buf.comm_stream)
    # DeepEP's C++ runtime methods (buffer.runtime), one node.
    rt = buf.runtime
    assert rt.is_available() and not rt.is_internode_available()
    assert (rt.get_num_rdma_ranks(), rt.get_rdma_rank(), rt.get_root_rdma_rank(True)) == (1, 0, rank)
    assert rt.get_local_device_id() == torch.cuda.current_device()
    assert len(rt.get_local_ipc_handle()) == 64 and any(rt.get_local_ipc_handle())
    assert rt.get_comm_stream() is buf.comm_stream
    assert rt.get_local_buffer_tensor(torch.int32, 256).data_ptr() == local.data_ptr()
    ev = Buffer.capture()
    ev.current_stream_wait()
    buf.destroy()
    assert not rt.is_available()
    buf.destroy()  # idempotent
    try:
        buf.get_dispatch_layout(torch.zeros(1, 1, dtype=torch.int64, device=buf.device), 2)
        raise AssertionError("a destroyed Buffer accepted a call")
    except EpRtError as e:
        assert "destroyed" in str(e)
    implicit = Buffer(dist.group.WORLD, 1 * MB)
    try:
        implicit.destroy()
        raise AssertionError("destroy() on a Buffer without explicitly_destroy must raise")
    except EpRtError:
        pass
    return seen


GRAPH_CASE = "cuda graph replays (num_worst_tokens)"


def suite(rank, num_ranks, case_names=None, aggressive=False):
    os.environ["EP_RT_AGGRESSIVE_PTX"] = "1" if aggressive else "0"
    cases = checker.select(selfcheck.standard_cases(num_ranks), case_names, also=(GRAPH_CASE,))
    need = Config(24).get_nvl_buffer_size_hint(7168 * 2, num_ranks, 4096)
    buf = Buffer(dist.group.WORLD, need, explicitly_destroy=True)
    seed = checker.shared_seed(buf.group)
    out = []
    for i, case in enumerate(cases):
        chk = selfcheck.run_case(buf, case, seed + i)
        out.append((case.name, chk.checks, chk.failures))
    if case_names is None or GRAPH_CASE in case_names:
        chk = selfcheck.run_graph_case(buf, seed + 500)
        out.append((GRAPH_CASE, chk.checks, chk.failures))
    buf.destroy()
    return {"seed": seed, "cases": out, "variant": "aggressive" if aggressive else "safe"}


# The per-case GPU tests (tests/gpu/*_cases_gpu.py) run one case per call on a RankPool's ranks; each rank builds its
# Buffer at the pool's first case and keeps it (rank_cache) under these keys.
HT_CASES_BUFFER = "intranode cases"
LL_CASES_BUFFER = "low-latency cases"


def ht_case(rank, num_ranks, name, seed):
    """One case of `suite` by name (GRAPH_CASE: its CUDA-graph case) on this rank's kept Buffer, sized as suite's.
    Returns the case's checks and failures, and the variant the rank runs under (the pool's environment)."""
    from ep_rt import env

    need = Config(24).get_nvl_buffer_size_hint(7168 * 2, num_ranks, 4096)
    buf = rank_cache(HT_CASES_BUFFER, lambda: Buffer(dist.group.WORLD, need, explicitly_destroy=True))
    if name == GRAPH_CASE:
        chk = selfcheck.run_graph_case(buf, seed)
    else:
        (case,) = checker.select(selfcheck.standard_cases(num_ranks), [name])
        chk = selfcheck.run_case(buf, case, seed)
    return {
        "checks": chk.checks,
        "failures": chk.failures,
        "aggressive": env.aggressive_ptx(),
        "variant": _intranode_variant(),
    }


def _intranode_variant() -> str:
    """The intranode cubin variant this rank's Buffer loaded (the choice Buffer makes: runtime/modules.py)."""
    from ep_rt import env
    from ep_rt.runtime import modules

    return modules.choose_entry(modules.manifest(), "intranode", torch.cuda.current_device(), env.aggressive_ptx())[
        "variant"
    ]


LL_GRAPH_CASE = "cuda graph replays"
LL_AFTER_CLEAN_CASE = "after clean"
# The LL cases of the 8- and 16-rank pools on emulated nodes (test_low_latency_nodes_gpu.py and, packed,
# test_low_latency_packed_gpu.py). The reference costs each rank about R times as much as on 2 ranks and R ranks
# share the GPU: the cases that reach the put path's parts (both buffers, hooks, zero-copy, a rank that sends
# nothing, LogFMT, graph replays, clean), not the large shapes.
LL_EIGHT_RANK_CASES = (
    "bf16",
    "fp8",
    "int32 topk_idx, hooks, bf16",
    "zero_copy + out",
    "a rank with zero tokens",
    "LogFMT, hidden 1152",
    LL_GRAPH_CASE,
    LL_AFTER_CLEAN_CASE,
)
LL_SIXTEEN_RANK_CASES = ("bf16", "fp8", "int32 topk_idx, hooks, bf16", LL_GRAPH_CASE)


def share_cpu_threads(num_ranks: int, reference_device) -> None:
    """With the reference on the CPU, each of the num_ranks processes takes its share of the cores for torch's CPU
    ops: by default every process starts one thread per core, and 16 ranks' 16 threads each (256 on 16 cores)
    made a 2x8 case's CPU reference slower than the GPU one it replaced (283.7 s for bf16 against 68 s,
    attempt 20261206T222145Z)."""
    if reference_device is not None and torch.device(reference_device).type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // num_ranks))


def ll_case(rank, num_ranks, name, seed, sized_for=None, reference_device=None):
    """One case of `ll_suite` by name (LL_GRAPH_CASE, LL_AFTER_CLEAN_CASE: its graph replays, its round after
    clean_low_latency_buffer) on this rank's kept low-latency Buffer, sized for the cases named in sized_for (the
    pool's; None: every case), the reference on reference_device (None: the GPU): checks, failures and notes, and
    the transport the Buffer runs (the pool's environment: its cubin variant and how many of its peers are on other
    nodes)."""
    from ep_rt.testing import selfcheck_ll

    buf = rank_cache(LL_CASES_BUFFER, lambda: ll_buffer(num_ranks, case_names=sized_for))
    share_cpu_threads(num_ranks, reference_device)
    if name == LL_GRAPH_CASE:
        chk = selfcheck_ll.run_ll_graph(buf, seed, reference_device=reference_device)
    elif name == LL_AFTER_CLEAN_CASE:
        buf.clean_low_latency_buffer(128, 1024, 32)
        after_clean = selfcheck_ll.LLCase("after clean_low_latency_buffer")
        chk = selfcheck_ll.run_ll_case(buf, after_clean, seed, reference_device)
    else:
        (case,) = checker.select(selfcheck_ll.ll_cases(num_ranks), [name])
        chk = selfcheck_ll.run_ll_case(buf, case, seed, reference_device)
    return {"checks": chk.checks, "failures": chk.failures, "notes": list(chk.notes), **ll_transport(buf)}


def ll_transport(buf) -> dict:
    """How a low-latency Buffer reaches its peers: the LL cubin variant it loaded ("default"; "chaos" under
    EP_RT_CHAOS_TRANSPORT=1) and how many peers are on other nodes (NVSHMEM puts: emulated nodes, or a network).
    What a test on emulated nodes checks its environment took effect by."""
    return {
        "variant": buf._ll.module.entry["variant"],
        "remote_peers": buf.group_size - buf._ll.nvlink_peers,
        "two_kernels": buf._ll.two_kernels,  # EP_RT_LL_TWO_KERNELS: eager calls as a send and a receive kernel
    }


def drop_cached_buffer(rank, num_ranks, key):
    """Destroy the Buffer rank_cache keeps under `key`, if any (after a case that raised, whose Buffer may have
    failed, and at the end of a pool): the next case builds a fresh one. True if there was one."""
    buf = rank_forget(key)
    if buf is not None:
        _destroy_quietly(buf)
    return buf is not None


def create_destroy(rank, num_ranks, cycles=20):
    def free_bytes():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return _driver.mem_get_info()[0]

    def cycle():
        buf = Buffer(dist.group.WORLD, 256 * MB, explicitly_destroy=True)
        x = torch.randn(64, 256, device=buf.device).to(torch.bfloat16)
        idx = torch.randint(0, 16, (64, 2), device=buf.device)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, 16)
        buf.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=torch.rand(64, 2, device=buf.device),
        )
        buf.destroy()

    # One whole cycle first: the first launch of a kernel may grow the context's local-memory reserve for good (a
    # one-time cost of the driver, not a leak).
    cycle()
    dist.barrier()  # ranks may share a GPU: measure when no rank holds a Buffer
    before = free_bytes()
    dist.barrier()
    for _ in range(cycles):
        cycle()
    dist.barrier()
    after = free_bytes()
    return before - after


def timeout(rank, num_ranks):
    """Rank 0 dispatches alone; it must raise an error naming rank 1 and the phase, not hang."""
    buf = Buffer(dist.group.WORLD, 16 * MB, timeout_s=3.0)
    x = torch.randn(32, 128, device=buf.device).to(torch.bfloat16)
    idx = torch.randint(0, 8, (32, 2), device=buf.device)
    w = torch.rand(32, 2, device=buf.device)
    messages = []
    if rank == 0:
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, 8)
        t0 = time.monotonic()
        try:
            buf.dispatch(
                x,
                num_tokens_per_rank=per_rank,
                is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert,
                topk_idx=idx,
                topk_weights=w,
            )
            raise AssertionError("dispatch without peers returned")
        except CommTimeoutError as e:
            messages.append((str(e), time.monotonic() - t0))
        try:  # the Buffer stays failed
            buf.get_dispatch_layout(idx, 8)
            raise AssertionError("a failed Buffer accepted a call")
        except CommTimeoutError as e:
            messages.append((str(e), 0.0))
    dist.barrier()
    # Same for num_worst_tokens, where the host does not wait: the error surfaces at the next call.
    buf2 = Buffer(dist.group.WORLD, 16 * MB, timeout_s=3.0)
    if rank == 0:
        per_rank, _, per_expert, in_rank, _ = buf2.get_dispatch_layout(idx, 8)
        buf2.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
            num_worst_tokens=64,
        )
        torch.cuda.synchronize()
        try:
            buf2.get_dispatch_layout(idx, 8)
            raise AssertionError("the failed num_worst_tokens dispatch was not reported")
        except CommTimeoutError as e:
            messages.append((str(e), 0.0))
    dist.barrier()
    return messages


def too_small(rank, num_ranks):
    """A dispatch whose NVL buffer holds less than one round (a row from each rank: calls larger than the buffer go
    in rounds) raises on every rank, and the Buffer stays usable for rows that fit."""
    buf = Buffer(dist.group.WORLD, 8192, explicitly_destroy=True)  # one row of hidden 2048; 24 rows of hidden 128
    x = torch.randn(512, 2048, device=buf.device).to(torch.bfloat16)
    idx = torch.randint(0, 8, (512, 4), device=buf.device)
    w = torch.rand(512, 4, device=buf.device)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, 8)
    message = None
    try:
        buf.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
        )
    except BufferTooSmallError as e:
        message = str(e)
    small = x[:8, :128].contiguous()
    sidx = idx[:8].contiguous()
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(sidx, 8)
    recv, *_ = buf.dispatch(
        small,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=sidx,
        topk_weights=w[:8].contiguous(),
    )
    torch.cuda.synchronize()
    buf.destroy()
    return message, recv.size(0)


def ll_buffer(num_ranks, case_names=None, **kwargs):
    """A low-latency Buffer sized for the cases of ll_cases named in case_names (None: every one; fewer: a smaller
    buffer, for many ranks on one GPU) and for LLCase()'s shape (the round after clean_low_latency_buffer; the
    graph replays' shape is smaller)."""
    from ep_rt import Buffer
    from ep_rt.testing.selfcheck_ll import LLCase, ll_cases

    cases = checker.select(ll_cases(num_ranks), case_names, also=(LL_GRAPH_CASE, LL_AFTER_CLEAN_CASE))
    need = max(
        Buffer.get_low_latency_rdma_size_hint(c.max_tokens, c.hidden, num_ranks, c.num_experts)
        for c in cases + [LLCase("default shape")]
    )
    return Buffer(
        dist.group.WORLD, 0, need, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True, **kwargs
    )


def ll_suite(rank, num_ranks):
    from ep_rt.testing import selfcheck_ll

    buf = ll_buffer(num_ranks)
    seed = checker.shared_seed(buf.group)
    out, notes = [], []
    for i, case in enumerate(selfcheck_ll.ll_cases(num_ranks)):
        chk = selfcheck_ll.run_ll_case(buf, case, seed + i)
        out.append((case.name, chk.checks, chk.failures))
        notes += [f"{case.name}: {n}" for n in chk.notes]
    chk = selfcheck_ll.run_ll_graph(buf, seed + 100)
    out.append((LL_GRAPH_CASE, chk.checks, chk.failures))
    buf.clean_low_latency_buffer(128, 1024, 32)
    chk = selfcheck_ll.run_ll_case(buf, selfcheck_ll.LLCase("after clean_low_latency_buffer"), seed + 200)
    out.append((LL_AFTER_CLEAN_CASE, chk.checks, chk.failures))
    remote_peers = buf.group_size - buf._ll.nvlink_peers
    buf.destroy()
    return {"seed": seed, "cases": out, "notes": notes, "variant": "ll", "remote_peers": remote_peers}


def ll_shrink(rank, num_ranks):
    """Every rank but rank 0 stops answering; rank 0 masks them after the timeout and its results match the
    reference with them masked. Rank 0 also says how its Buffer reaches them (on emulated nodes: the put path)."""
    from ep_rt import reference_ll
    from ep_rt.testing.selfcheck_ll import LLCase, expert_outputs, ll_inputs, to_packed

    buf = ll_buffer(num_ranks, enable_shrink=True, timeout_s=2.0)
    seed = checker.shared_seed(buf.group)
    case = LLCase("shrink", num_tokens=64, max_tokens=64, hidden=1024, num_experts=16)
    T, H, E, L = case.max_tokens, case.hidden, case.num_experts, case.num_experts // num_ranks
    result = {}
    if rank == 0:
        result.update(ll_transport(buf))
        xs, idxs, ws = ll_inputs(case, seed, num_ranks, buf.device)
        t0 = time.monotonic()
        recv, count, handle, _, _ = buf.low_latency_dispatch(xs[0], idxs[0], T, E)
        torch.cuda.synchronize()
        result["dispatch_s"] = time.monotonic() - t0
        status = torch.zeros(num_ranks, dtype=torch.int32, device=buf.device)
        buf.low_latency_query_mask_buffer(status)
        result["mask"] = status.tolist()
        masked = tuple(range(1, num_ranks))
        want = reference_ll.low_latency_dispatch(xs, idxs, T, E, masked_ranks=masked)
        result["count_ok"] = bool(torch.equal(count, want[0]["packed_recv_count"]))
        result["range_ok"] = bool(torch.equal(handle[1], want[0]["packed_recv_layout_range"]))
        n = int(count.sum())
        ys = [expert_outputs(seed, r, L, num_ranks, T, H, buf.device) for r in range(num_ranks)]
        x = to_packed(ys[0], handle[0], handle[1], T)
        combined, _, _ = buf.low_latency_combine(x, idxs[0], ws[0], handle)
        ref_in = [
            to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T)
            for r in range(num_ranks)
        ]
        ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want, masked_ranks=masked, ranks=(0,))[0]["combined_x"]
        torch.cuda.synchronize()
        result["combine_ok"] = bool(torch.equal(combined.view(torch.int16), ref.view(torch.int16)))
        result["rows"] = n
        buf.low_latency_clean_mask_buffer()
        buf.low_latency_query_mask_buffer(status)
        result["after_clean"] = status.tolist()
        buf.low_latency_update_mask_buffer(1, True)
        buf.low_latency_query_mask_buffer(status)
        result["after_update"] = status.tolist()
    dist.barrier()
    buf.destroy()
    return result


TOPK_BITS_HT_CASES = (
    "bf16 uniform",
    "int32 topk_idx",
    "int32 topk_idx, num_worst_tokens",
    "num_worst_tokens",
    "holes (-1 in topk_idx)",
    "no top-k",
)
TOPK_BITS_LL_CASES = ("fp8", "int32 topk_idx", "int32 topk_idx, hooks, bf16", "hooks")


def topk_bits(rank, num_ranks):
    """HT and LL rounds with int64 and int32 topk_idx, under whatever EP_RT_TOPK_IDX_BITS the parent set (read at
    import: the spawned process inherits it). Returns ep_rt.topk_idx_t and every case's failures."""
    import ep_rt
    from ep_rt.testing import selfcheck_ll

    out = suite(rank, num_ranks, TOPK_BITS_HT_CASES + (GRAPH_CASE,))["cases"]
    buf = ll_buffer(num_ranks)
    seed = checker.shared_seed(buf.group)
    for i, case in enumerate(checker.select(selfcheck_ll.ll_cases(num_ranks), TOPK_BITS_LL_CASES)):
        chk = selfcheck_ll.run_ll_case(buf, case, seed + i)
        out.append(("LL " + case.name, chk.checks, chk.failures))
    buf.destroy()
    return {"topk_idx_t": str(ep_rt.topk_idx_t), "cases": out}


def internode_buffer(rank, num_ranks, ranks_per_node, max_shape=(7168 * 2, 4096)):
    """An internode Buffer on emulated nodes (EP_RT_RANKS_PER_NODE set by the test) sized for max_shape = (hidden
    bytes, tokens), its topology and DeepEP runtime facts checked."""
    from ep_rt.transport import internode_layout

    G = ranks_per_node
    nvl = internode_layout.nvl_size_hint(max_shape[0], num_ranks, G, max_shape[1])
    rdma = internode_layout.rdma_size_hint(max_shape[0], num_ranks, G, max_shape[1])
    buf = Buffer(dist.group.WORLD, nvl, rdma, explicitly_destroy=True)
    assert buf.topology.num_nodes == num_ranks // G, buf.topology.describe()
    rt = buf.runtime  # DeepEP's "RDMA rank" is ep_rt's node, with Topology's node size
    assert rt.is_internode_available() and rt.get_num_rdma_ranks() == num_ranks // G
    assert (rt.get_rdma_rank(), rt.get_root_rdma_rank(True), rt.get_root_rdma_rank(False)) == (rank // G, rank % G, 0)
    return buf


def internode_suite(
    rank, num_ranks, ranks_per_node, case_names=None, aggressive=False, graph=True, max_shape=(7168 * 2, 4096)
):
    """The internode suite on emulated nodes (EP_RT_RANKS_PER_NODE set by the test): every case bit-exact against
    ep_rt.reference.internode_*, then CUDA-graph replays. Buffers sized for max_shape = (hidden bytes, tokens)."""
    from ep_rt.testing import selfcheck_internode as sci

    os.environ["EP_RT_AGGRESSIVE_PTX"] = "1" if aggressive else "0"
    G = ranks_per_node
    cases = checker.select(sci.internode_cases(num_ranks, G), case_names)
    buf = internode_buffer(rank, num_ranks, G, max_shape)
    seed = checker.shared_seed(buf.group)
    out = []
    for i, case in enumerate(cases):
        chk = sci.run_case(buf, case, seed + i, G)
        out.append((case.name, chk.checks, chk.failures))
    if graph:
        chk = sci.run_graph_case(buf, seed + 500, G)
        out.append((GRAPH_CASE, chk.checks, chk.failures))
    buf.destroy()
    return {"seed": seed, "cases": out, "nodes": num_ranks // G}


INTERNODE_CASES_BUFFER = "internode cases"
# The cases of 2 nodes x 8 ranks (16 processes on one GPU), with buffers sized for INTERNODE_SIXTEEN_SHAPE, not the
# 4096 x 7168 shape, so that 16 of them fit.
INTERNODE_SIXTEEN_CASES = (
    "bf16 uniform",
    "fp8 row scales",
    "num_worst_tokens",
    "every token spans every node",
    "a node receives nothing",
    "bias pair",
)
INTERNODE_SIXTEEN_SHAPE = (4096, 2048)


def internode_case(rank, num_ranks, ranks_per_node, name, seed, max_shape=None, reference_device=None):
    """One case of `internode_suite` by name (GRAPH_CASE: its CUDA-graph replays) on this rank's kept internode
    Buffer, sized as internode_suite's for max_shape (None: its default), the reference on reference_device (None:
    the GPU). Returns the checks, failures, the number of nodes and the variant the rank runs under (the pool's
    environment)."""
    from ep_rt import env
    from ep_rt.testing import selfcheck_internode as sci

    G = ranks_per_node
    shape = () if max_shape is None else (max_shape,)
    buf = rank_cache(INTERNODE_CASES_BUFFER, lambda: internode_buffer(rank, num_ranks, G, *shape))
    share_cpu_threads(num_ranks, reference_device)
    if name == GRAPH_CASE:
        chk = sci.run_graph_case(buf, seed, G, reference_device=reference_device)
    else:
        (case,) = checker.select(sci.internode_cases(num_ranks, G), [name])
        chk = sci.run_case(buf, case, seed, G, reference_device)
    return {
        "checks": chk.checks,
        "failures": chk.failures,
        "nodes": buf.topology.num_nodes,
        "aggressive": env.aggressive_ptx(),
        "chaos": env.chaos_transport(),
    }


def internode_missing_peer(rank, num_ranks, ranks_per_node):
    """The last rank never calls dispatch: every other rank raises CommTimeoutError naming a rank and its node
    within the network deadline, and can destroy its Buffer."""
    from ep_rt.transport import internode_layout

    G = ranks_per_node
    buf = Buffer(
        dist.group.WORLD,
        internode_layout.nvl_size_hint(2048, num_ranks, G, 256),
        internode_layout.rdma_size_hint(2048, num_ranks, G, 256),
        explicitly_destroy=True,
    )
    x = torch.randn(256, 1024, device=buf.device).to(torch.bfloat16)
    idx = torch.randint(0, 16 * num_ranks, (256, 4), device=buf.device)
    w = torch.rand(256, 4, device=buf.device)
    per_rank, per_node, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, 16 * num_ranks)
    res = {"error": None}
    start = time.monotonic()
    if rank != num_ranks - 1:
        try:
            buf.dispatch(
                x,
                num_tokens_per_rank=per_rank,
                num_tokens_per_rdma_rank=per_node,
                is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert,
                topk_idx=idx,
                topk_weights=w,
            )
            torch.cuda.synchronize()
            buf.raise_if_failed()
        except CommTimeoutError as e:
            res["error"] = str(e)
    res["seconds"] = time.monotonic() - start
    dist.barrier()
    _destroy_quietly(buf)  # the survivors' Buffers failed; the silent rank's teardown barrier times out
    return res


def _destroy_quietly(buf):
    try:
        buf.destroy()
    except EpRtError:
        pass


INTERNODE_LL_COMPAT_CASES = ("bf16 uniform", "fp8 row scales")
# LL cases on either side of the HT calls: eager, with receive hooks, async (the mode switch's three stream paths)
INTERNODE_LL_COMPAT_LL_CASES = ("bf16", "int32 topk_idx, hooks, bf16", "async")


def internode_with_low_latency(rank, num_ranks, ranks_per_node):
    """DeepEP's LL-compatibility case: one Buffer with low_latency_mode=True and an NVL buffer across nodes serves
    internode high-throughput and low-latency calls, interleaved, each bit-exact. Both modes share one symmetric
    buffer (issue 22 item 2): every switch of mode puts a barrier on the comm stream (ops/mode_switch.py), with LL
    calls eager, hooked and async on either side of the HT calls, and no clean_low_latency_buffer between."""
    from ep_rt.testing import selfcheck_internode as sci, selfcheck_ll
    from ep_rt.transport import internode_layout

    G = ranks_per_node
    ll = [c for c in selfcheck_ll.ll_cases(num_ranks) if c.name in INTERNODE_LL_COMPAT_LL_CASES]
    assert [c.name for c in ll] == list(INTERNODE_LL_COMPAT_LL_CASES), [c.name for c in ll]
    ll_need = max(Buffer.get_low_latency_rdma_size_hint(c.max_tokens, c.hidden, num_ranks, c.num_experts) for c in ll)
    rdma = max(ll_need, internode_layout.rdma_size_hint(2048 * 2, num_ranks, G, 1024))
    buf = Buffer(
        dist.group.WORLD,
        internode_layout.nvl_size_hint(2048 * 2, num_ranks, G, 1024),
        rdma,
        low_latency_mode=True,
        num_qps_per_rank=4,
        explicitly_destroy=True,
    )
    shared = buf._ll.sym == buf._ht.sym_base and buf._modes is not None
    seed = checker.shared_seed(buf.group)
    ht_cases = checker.select(sci.internode_cases(num_ranks, G), INTERNODE_LL_COMPAT_CASES)
    out = [("one symmetric buffer for both modes", 1, [] if shared else ["two symmetric buffers, or no mode switch"])]
    for i in range(2):
        for j, case in enumerate(ht_cases):
            chk = sci.run_case(buf, case, seed + 10 * i + j, G)
            out.append((f"HT {case.name} #{i}", chk.checks, chk.failures))
        for j, case in enumerate(ll):
            chk = selfcheck_ll.run_ll_case(buf, case, seed + 100 + 10 * i + j)
            out.append((f"LL {case.name} #{i}", chk.checks, chk.failures))
    switches = buf._modes.switches if buf._modes is not None else 0
    # HT -> LL and LL -> HT once per round of the loop, less the first HT (nothing ran before it)
    out.append(("mode switches", 1, [] if switches == 3 else [f"{switches} barriers, 3 expected"]))
    buf.destroy()
    return {"seed": seed, "cases": out, "nodes": num_ranks // G}


def internode_too_small(rank, num_ranks, ranks_per_node):
    """An RDMA buffer below one round of a call in rounds: every rank raises before the data moves, and the same
    Buffer then serves a dispatch that fits."""
    from ep_rt.testing import selfcheck_internode as sci
    from ep_rt.transport import internode_layout

    G = ranks_per_node
    # Streams of no record at all: below one round (a token from each rank), which no call in rounds can use.
    record = internode_layout.dispatch_record_bytes(2048, 0, 4)
    buf = Buffer(
        dist.group.WORLD,
        internode_layout.nvl_size_hint(2048, num_ranks, G, 1024),
        2 * (num_ranks // G) * record // 128 * 128 - 256,
        explicitly_destroy=True,
    )
    E = 16 * num_ranks
    x = torch.randn(1024, 1024, device=buf.device).to(torch.bfloat16)
    idx = torch.randint(0, E, (1024, 4), device=buf.device)
    w = torch.rand(1024, 4, device=buf.device)
    per_rank, per_node, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    args = dict(
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_node,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    res = {}
    try:
        buf.dispatch(x, **args)
        res["rdma"] = None
    except BufferTooSmallError as e:
        res["rdma"] = str(e)
    small = [c for c in sci.internode_cases(num_ranks, G) if c.name == "one token"][0]
    chk = sci.run_case(buf, small, 7, G)
    res["after"] = (chk.checks, chk.failures)
    buf.destroy()
    return res


INTERNODE_ROUND_CASES = (
    "bf16 uniform",
    "fp8 row scales",
    "num_worst_tokens",
    "holes (-1 in topk_idx)",
    "all tokens to one node",
    "a rank receives nothing",
    "one hot expert",
    "bias pair",
)
INTERNODE_ROUND_SHAPE = (2048, 64)  # (hidden bytes, tokens per rank) the rounds test's Buffers are sized for


@contextlib.contextmanager
def rounds_counted():
    """Yields a list that gets, for each internode dispatch in rounds made inside the block, its number of rounds
    (this rank process only); restores ep_rt.ops.internode_rounds.dispatch however the block ends."""
    from ep_rt.ops import internode_rounds as rounds_mod

    in_rounds, seen = rounds_mod.dispatch, []

    def counted(*args, **kwargs):
        result = in_rounds(*args, **kwargs)
        seen.append(len(result.handle.rounds.starts))
        return result

    rounds_mod.dispatch = counted
    try:
        yield seen
    finally:
        rounds_mod.dispatch = in_rounds


def internode_rounds(rank, num_ranks, ranks_per_node, factors=(2, 4, 10)):
    """Issue 22 item 1 across nodes: a Buffer sized by internode_layout's hints for 64 tokens per rank of 2048 bytes
    takes calls of f times as many tokens (f = 2, 4, 10; then uneven token counts and every token to one rank), each
    in rounds: layout, dispatch (all ten handle entries), cached dispatch and combine bit-exact with the reference.
    Returns per case the rounds its dispatches took (counted as ep_rt.ops.internode_rounds.dispatch returns)."""
    from dataclasses import replace

    from ep_rt.testing import selfcheck_internode as sci

    G, T = ranks_per_node, INTERNODE_ROUND_SHAPE[1]
    buf = internode_buffer(rank, num_ranks, G, INTERNODE_ROUND_SHAPE)
    seed = checker.shared_seed(buf.group)
    cases = []
    for f in factors:  # every case's rows of 2048 bytes (bf16 hidden 1024, fp8 hidden 2048), f x 64 tokens
        for case in checker.select(sci.internode_cases(num_ranks, G), INTERNODE_ROUND_CASES):
            hidden = 2048 if case.dtype.startswith("fp8") else 1024
            cases.append(replace(case, name=f"{case.name}, {f}x", num_tokens=f * T, hidden=hidden))
    E = 16 * num_ranks
    cases.append(
        selfcheck.Case(
            "uneven token counts, up to 4x",
            tokens_by_rank=tuple(4 * T * (r + 1) // num_ranks for r in range(num_ranks)),
            num_experts=E,
        )
    )
    cases.append(selfcheck.Case("every token to one rank, 4x", routing="one_rank", num_tokens=4 * T, num_experts=E))
    cases.append(  # a round sized from the quiet half meets the busy half: it moves nothing and is tried again
        selfcheck.Case("quiet first half, then every node, 4x", routing="quiet_head", num_tokens=4 * T, num_experts=E)
    )
    out = []
    for i, case in enumerate(cases):
        with rounds_counted() as seen:
            chk = sci.run_case(buf, case, seed + i, G)
        out.append((case.name, max(seen, default=1), chk.checks, chk.failures))
    buf.destroy()
    return {"seed": seed, "cases": out}


def internode_megatron_sizes(rank, num_ranks, ranks_per_node, token_counts=(8192, 16384), hidden=2048):
    """Issue 22 item 5 across nodes: a Buffer sized as Megatron-Core's get_buffer sizes it (the two-argument hints,
    the larger of the dispatch and combine config's: DeepEP's sizes) takes calls of 8192 and 16384 tokens per rank,
    in rounds sized from the counts, bit-exact (layout, dispatch with all ten handle entries, cached dispatch,
    combine). Returns per case the rounds its dispatch took."""
    from ep_rt.testing import selfcheck_internode as sci

    G = ranks_per_node
    configs = (Buffer.get_dispatch_config(num_ranks), Buffer.get_combine_config(num_ranks))
    nvl = max(c.get_nvl_buffer_size_hint(hidden * 2, num_ranks) for c in configs)
    rdma = max(c.get_rdma_buffer_size_hint(hidden * 2, num_ranks) for c in configs)
    buf = Buffer(dist.group.WORLD, nvl, rdma, explicitly_destroy=True)
    assert buf.topology.num_nodes == num_ranks // G, buf.topology.describe()
    seed = checker.shared_seed(buf.group)
    out = []
    for i, n in enumerate(token_counts):
        case = selfcheck.Case(f"{n} tokens per rank in get_buffer's sizes", num_tokens=n, hidden=hidden)
        with rounds_counted() as seen:
            chk = sci.run_case(buf, case, seed + i, G)
        out.append((case.name, max(seen, default=1), chk.checks, chk.failures))
    buf.destroy()
    return {"seed": seed, "cases": out, "num_nvl_bytes": nvl, "num_rdma_bytes": rdma}


def _internode_counters(buf):
    """Per (other node, channel, chunk): the dispatch and combine signal words in my symmetric buffer and the counts
    my kernels consumed of them (int64 lists). In step after every call, failed or not, unless a peer timed out."""
    from ep_rt.runtime import abi
    from ep_rt.transport.device_view import device_tensor

    op = buf._ht
    K = abi.EP_RT_IN_STREAM_CHUNKS
    n = abi.EP_RT_IN_MAX_NODES * abi.EP_RT_MAX_CHANNELS * K
    words = {}
    for kind in ("dispatch_words", "combine_words"):
        words[kind] = device_tensor(
            op.sym_base + op.control[kind], (op.N * abi.EP_RT_MAX_CHANNELS * K,), buf.device, "<i8"
        ).clone()
    torch.cuda.synchronize()
    consumed = op.consumed.cpu()
    out = []
    for s in range(op.N):
        if s == buf.topology.node:
            continue
        for c in range(abi.EP_RT_MAX_CHANNELS):
            for k in range(K):
                i = (s * abi.EP_RT_MAX_CHANNELS + c) * K + k
                out.append(
                    (
                        s,
                        c,
                        k,
                        int(words["dispatch_words"][i]),
                        int(consumed[i]),
                        int(words["combine_words"][i]),
                        int(consumed[n + i]),
                    )
                )
    return [row for row in out if row[3] != row[4] or row[5] != row[6]]


def internode_recoverable_errors(rank, num_ranks, ranks_per_node):
    """Caller errors the internode kernels find mid-call (num_worst_tokens too small; with num_worst_tokens, a
    dispatch too large for the RDMA buffer; from a handle rebuilt without facts, a cached dispatch too large for the
    RDMA buffer and a combine too large for the NVL buffer): each raises on the ranks concerned after the call, the
    signal words stay in step with their consumed counts, and the next calls are bit-exact."""
    from ep_rt.errors import KernelError
    from ep_rt.testing import selfcheck_internode as sci
    from ep_rt.transport import internode_layout

    G, T, H, E = ranks_per_node, 256, 1024, 16 * num_ranks
    buf = Buffer(
        dist.group.WORLD,
        internode_layout.nvl_size_hint(2 * H, num_ranks, G, T),
        internode_layout.rdma_size_hint(2 * H, num_ranks, G, T),
        explicitly_destroy=True,
    )
    seed = checker.shared_seed(buf.group)
    # get_local_buffer_tensor(use_rdma_buffer=True): a view of this rank's RDMA area (written before any call)
    view = buf.get_local_buffer_tensor(torch.int32, size=(4096,), offset=512, use_rdma_buffer=True)
    view.copy_(torch.arange(4096, dtype=torch.int32, device=buf.device) + rank)
    again = buf.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)[512 : 512 + 4 * 4096].view(torch.int32)
    want = torch.arange(4096, dtype=torch.int32) + rank
    rdma_view_ok = again.numel() == 4096 and bool(torch.equal(again.cpu(), want))
    good = sci.selfcheck_ht.Case("good round", num_tokens=T, hidden=H, num_experts=E, num_sms=8)
    g = torch.Generator(device=buf.device).manual_seed(seed + rank)
    x = torch.randn(T, H, generator=g, device=buf.device).to(torch.bfloat16)
    idx = torch.topk(torch.rand(T, E, generator=g, device=buf.device), 4).indices
    w = torch.rand(T, 4, generator=g, device=buf.device)
    per_rank, per_node, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    kw = dict(
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_node,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
        config=Config(8),
    )
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, **kw)
    rebuilt = tuple(handle)  # a plain tuple: no facts, so the host cannot refuse what does not fit
    wide = 16 * H  # rows 16x wider: neither buffer holds this call's streams / combine rows
    wide_x = torch.zeros(T, wide, dtype=torch.bfloat16, device=buf.device)

    def wide_worst():
        return buf.dispatch(wide_x, num_worst_tokens=T * num_ranks, **kw)

    # Eager, a num_worst_tokens dispatch above the buffers' rows waits for its counts and goes in rounds (issue 22):
    # no error, and the protocol stays in step. Inside a CUDA-graph capture it cannot wait: one pass, and the
    # kernels report what does not fit (the path this test is for).
    res = {"cases": [], "calls": [], "rdma_view_ok": rdma_view_ok}
    try:
        wide_worst()
        torch.cuda.synchronize()
        buf.raise_if_failed()
        eager_error = None
    except (KernelError, BufferTooSmallError, ValueError) as e:
        eager_error = f"{type(e).__name__}: {e}"
    res["eager_in_rounds"] = (eager_error, _internode_counters(buf))

    def wide_worst_captured():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            wide_worst()
        graph.replay()

    calls = {
        "num_worst_tokens too small": lambda: buf.dispatch(x, num_worst_tokens=1, **kw),
        "num_worst dispatch too large for the RDMA buffer, captured": wide_worst_captured,
        "cached dispatch of a rebuilt handle, too large for the RDMA buffer": lambda: buf.dispatch(
            wide_x, handle=rebuilt, config=Config(8)
        ),
        "combine of a rebuilt handle, too large for the NVL buffer": lambda: buf.combine(
            torch.zeros(recv_x.size(0), wide, dtype=torch.bfloat16, device=buf.device), rebuilt, config=Config(8)
        ),
    }
    for i, (name, call) in enumerate(calls.items()):
        error = None
        try:
            call()
            torch.cuda.synchronize()
            buf.raise_if_failed()
        except (KernelError, BufferTooSmallError) as e:
            error = f"{type(e).__name__}: {e}"
        res["calls"].append((name, error, _internode_counters(buf)))
        chk = sci.run_case(buf, good, seed + i, G)
        res["cases"].append((f"good round after {name}", chk.checks, chk.failures))
    buf.destroy()
    return res


ROUND_FACTORS = (2, 4, 10)
ROUND_CASES = (
    "bf16 uniform",
    "fp8 row scales",
    "num_worst_tokens",
    "holes (-1 in topk_idx)",
    "a rank receives nothing",
    "bias pair",
    "uneven token counts",
)


def _rounds_of(buf, case, seed):
    """How many rounds the case's dispatch takes in `buf` (1: one pass)."""
    xs, idxs, ws = selfcheck.make_inputs(case, seed, buf.group_size, buf.device)
    x, idx, w = xs[buf.rank], idxs[buf.rank], ws[buf.rank]
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, case.num_experts)
    *_, handle, _ = buf.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
        config=Config(case.num_sms, 6, 256, 6, 128),
    )
    torch.cuda.synchronize()
    return handle.rounds.num_rounds if handle.rounds is not None else 1


def _rounds_graph(buf, case, seed, replays=3):
    """Cached dispatch and combine from a handle of a call in rounds, captured in a CUDA graph and replayed with new
    data (same routing), each replay bit-exact with the reference."""
    from ep_rt import reference

    R, me, dev = buf.group_size, buf.rank, buf.device
    chk = checker.Checker(case)
    config = Config(case.num_sms, 6, 256, 6, 128)
    xs, idxs, ws = selfcheck.make_inputs(case, seed, R, dev)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idxs[me], case.num_experts)
    _, _, recv_w, _, handle, _ = buf.dispatch(
        xs[me],
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idxs[me],
        topk_weights=ws[me],
        config=config,
    )
    rows = handle.recv_src_idx.size(0)
    x_in = xs[me].clone()
    y_in = torch.zeros(rows, case.hidden, dtype=torch.bfloat16, device=dev)

    def step():
        cached_x, *_ = buf.dispatch(x_in, handle=handle, config=config)
        combined, combined_w, _ = buf.combine(y_in, handle, topk_weights=recv_w, config=config)
        return cached_x, combined, combined_w

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cached_x, combined, combined_w = step()
    for rep in range(replays):
        s = seed * 31 + rep
        new_xs = [
            (torch.randn(x.shape, generator=torch.Generator().manual_seed(s * 100 + r)) * (1 + r))
            .to(torch.bfloat16)
            .to(dev)
            for r, x in enumerate(xs)
        ]
        ref = reference.intranode_dispatch(new_xs, idxs, ws, case.num_experts, case.num_sms, 1, 0)
        ys, _ = selfcheck.replay_inputs(s, R, x_in.size(0) * R, x_in.size(0), case.hidden, dev)  # (rows on any rank)
        ys = [ys[r][: ref[r]["recv_x"].size(0)] for r in range(R)]
        ref_c = reference.intranode_combine(ys, ref, [ref[r]["recv_topk_weights"] for r in range(R)], None)[me]
        x_in.copy_(new_xs[me])
        y_in.copy_(ys[me])
        graph.replay()
        torch.cuda.synchronize()
        chk.equal(f"replay {rep} cached recv_x", cached_x, ref[me]["recv_x"])
        chk.equal(f"replay {rep} combined_x", combined, ref_c["combined_x"])
        chk.equal(f"replay {rep} combined_topk_weights", combined_w, ref_c["combined_topk_weights"])
    del graph
    buf.raise_if_failed()
    return chk, handle.rounds.num_rounds if handle.rounds is not None else 1


def rounds_suite(rank, num_ranks, factors=ROUND_FACTORS):
    """Issue 22: each case in a Buffer whose NVL buffer holds about 1/f of the case's rows (f = 2, 4, 10), so the
    call goes in rounds: layout, dispatch, cached dispatch and combine bit-exact with the reference; then every token
    to one rank, and a CUDA graph of cached dispatch and combine from such a call."""
    from ep_rt.transport import nvl_layout

    cases = checker.select(selfcheck.standard_cases(num_ranks), ROUND_CASES) + [
        selfcheck.Case("every token to one rank", routing="one_rank", num_tokens=384, num_experts=32)
    ]
    seed = checker.shared_seed(dist.group.WORLD)
    out = []
    for f in factors:
        for i, case in enumerate(cases):
            rows = sum(case.tokens_by_rank) if case.tokens_by_rank else case.num_tokens * num_ranks
            nbytes = nvl_layout.nvl_bytes_for(2 * case.hidden, max(-(-rows // f), num_ranks))
            buf = Buffer(dist.group.WORLD, nbytes, explicitly_destroy=True)
            chk = selfcheck.run_case(buf, case, seed + 100 * f + i)
            n = _rounds_of(buf, case, seed + 100 * f + i)
            out.append((f"{case.name}, 1/{f} of its rows", n, chk.checks, chk.failures))
            buf.destroy()
    case = selfcheck.Case("graph of a call in rounds", num_tokens=256, hidden=1024, num_experts=32)
    buf = Buffer(dist.group.WORLD, nvl_layout.nvl_bytes_for(2048, 256 * num_ranks // 4), explicitly_destroy=True)
    chk, n = _rounds_graph(buf, case, seed + 7)
    out.append((case.name, n, chk.checks, chk.failures))
    buf.destroy()
    return {"seed": seed, "cases": out}


def megatron_sizes(rank, num_ranks, token_counts=(8192, 16384), hidden=2048):
    """Issue 22 item 5: a Buffer sized as Megatron-Core's get_buffer sizes it (the two-argument NVL hint, the larger
    of the dispatch and combine config's: DeepEP's size since 2026-12-05) takes calls of 8192 and 16384 tokens per
    rank, in rounds, bit-exact."""
    configs = (Buffer.get_dispatch_config(num_ranks), Buffer.get_combine_config(num_ranks))
    nbytes = max(c.get_nvl_buffer_size_hint(hidden * 2, num_ranks) for c in configs)
    buf = Buffer(dist.group.WORLD, nbytes, explicitly_destroy=True)
    seed = checker.shared_seed(buf.group)
    out = []
    for i, n in enumerate(token_counts):
        case = selfcheck.Case(f"{n} tokens per rank in get_buffer's size", num_tokens=n, hidden=hidden)
        chk = selfcheck.run_case(buf, case, seed + i)
        out.append((case.name, _rounds_of(buf, case, seed + i), chk.checks, chk.failures))
    buf.destroy()
    return {"seed": seed, "cases": out, "num_nvl_bytes": nbytes}


def peer_gone_during_nvshmem_start(rank, num_ranks, err_dir):
    """Rank 1 ends inside NVSHMEM's start (after the unique ids were exchanged, before its bootstrap connects): rank 0
    then waits in NVSHMEM's bootstrap, which has no deadline, until ep_rt's watchdog (EP_RT_NVSHMEM_TIMEOUT_S) ends
    the process with its message (exit code 124). stderr goes to err_dir/rank<r>.err for the test to read."""
    from ep_rt.transport import nvshmem

    fd = os.open(os.path.join(err_dir, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    if rank == 1:
        nvshmem._lib().nvshmemx_hostlib_init_attr = lambda *args: os._exit(0)
    start = time.monotonic()
    buf = Buffer(
        dist.group.WORLD,
        0,
        Buffer.get_low_latency_rdma_size_hint(8, 1024, num_ranks, 8),
        low_latency_mode=True,
        num_qps_per_rank=4,
        explicitly_destroy=True,
    )
    return {"buffer made after s": time.monotonic() - start, "buffer": repr(buf)}  # (not expected)
