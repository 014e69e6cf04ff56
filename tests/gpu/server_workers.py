"""Per-rank bodies of tests/gpu/test_server_gpu.py (issue 25 items 3 and 4: threads and interrupts in a serving
process). Module level so spawned ranks can import them. Every rank makes the same Buffer calls in the same order;
the last rank is the late peer that keeps the others in the dispatch's host wait."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from ep_rt import Buffer
from ep_rt.errors import EpRtError
from ep_rt.testing import selfcheck_ht

SHAPE = dict(tokens=128, hidden=512, topk=4, experts=48)  # (48: divisible by 2 and 3 ranks)
LATE_S = 2.0  # how late the last rank comes to the watched dispatch


def _buffer(timeout_s: float):
    return Buffer(dist.group.WORLD, 32 << 20, explicitly_destroy=True, timeout_s=timeout_s)


def _inputs(buf, seed: int):
    g = torch.Generator(device=buf.device).manual_seed(seed + buf.rank)
    s = SHAPE
    x = torch.randn(s["tokens"], s["hidden"], generator=g, device=buf.device).to(torch.bfloat16)
    idx = torch.topk(torch.rand(s["tokens"], s["experts"], generator=g, device=buf.device), s["topk"]).indices
    w = torch.rand(s["tokens"], s["topk"], generator=g, device=buf.device)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, s["experts"])
    return x, idx, w, dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)


def _round(buf, seed: int):
    """Layout, dispatch, combine, synchronised; the error the kernels recorded is raised."""
    x, idx, w, common = _inputs(buf, seed)
    recv_x, _, recv_w, counts, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
    buf.combine(recv_x, handle, topk_weights=recv_w)
    torch.cuda.synchronize()
    buf.raise_if_failed()
    return counts


def _checked_round(timeout_s: float, seed: int) -> dict:
    """A fresh Buffer's full round against the reference, then its destroy."""
    buf = _buffer(timeout_s)
    chk = selfcheck_ht.run_case(buf, selfcheck_ht.Case("fresh Buffer", num_tokens=128, num_experts=48), seed)
    buf.destroy()
    return {"checks": chk.checks, "failures": chk.failures[:5]}


def _in_host_wait(thread: threading.Thread, timeout_s: float = 20.0) -> float:
    """Seconds until `thread` is inside the host's wait for the notify kernel's token."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        frame = sys._current_frames().get(thread.ident)
        while frame is not None:
            if frame.f_code.co_name == "wait_for_token":
                return time.monotonic() - t0
            frame = frame.f_back
        time.sleep(0.005)
    raise AssertionError("the dispatch never reached the host wait")


def _busy_counter():
    box = {"n": 0, "run": True, "ticks": []}

    def busy():
        while box["run"]:
            box["n"] += 1
            if box["n"] % 4096 == 0:
                box["ticks"].append(time.monotonic())

    return box, threading.Thread(target=busy, name="busy", daemon=True)


def thread_progress_while_waiting(rank: int, num_ranks: int, timeout_s: float, seed: int) -> dict:
    """Rank 0 dispatches while the last rank is LATE_S late; a busy Python thread beside rank 0's host wait must
    keep about the rate it has while the main thread sleeps (a wait holding the GIL would halve it)."""
    buf = _buffer(timeout_s)
    _round(buf, seed)  # warm-up: cubins loaded, first launches done
    out = {}
    if rank == 0:
        box, t = _busy_counter()
        t.start()
        n0 = box["n"]
        time.sleep(1.0)
        out["alone_rate"] = (box["n"] - n0) / 1.0
    dist.barrier()
    x, idx, w, common = _inputs(buf, seed + 1)
    if rank == num_ranks - 1:
        time.sleep(LATE_S)
    n0, t0 = (box["n"], time.monotonic()) if rank == 0 else (0, time.monotonic())
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
    out["dispatch_s"] = time.monotonic() - t0
    if rank == 0:
        out["waiting_rate"] = (box["n"] - n0) / out["dispatch_s"]
        ticks = [u for u in box["ticks"] if t0 <= u]
        out["max_gap_s"] = max((b - a for a, b in zip(ticks, ticks[1:])), default=out["dispatch_s"])
        box["run"] = False
        t.join()
    buf.combine(recv_x, handle, topk_weights=recv_w)
    torch.cuda.synchronize()
    buf.raise_if_failed()
    buf.destroy()
    return out


def two_threads_one_buffer(rank: int, num_ranks: int, timeout_s: float, seed: int) -> dict:
    """On rank 0 a 'scheduler' thread dispatches (the last rank is late, so it waits in the host wait) while the
    main thread calls the same Buffer: refused with EpRtError naming both threads, nothing launched. The scheduler's
    call then completes, the main thread's calls go through (the threads took turns), and a checked round works."""
    buf = _buffer(timeout_s)
    _round(buf, seed)
    dist.barrier()
    out = {}
    x, idx, w, common = _inputs(buf, seed + 1)
    if rank == 0:
        box = {}

        def scheduler():
            try:
                box["result"] = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
            except BaseException as e:  # noqa: BLE001 (reported)
                box["error"] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=scheduler, name="scheduler")
        t.start()
        _in_host_wait(t)
        try:
            buf.get_dispatch_layout(idx, SHAPE["experts"])
            out["refused"] = None
        except EpRtError as e:
            out["refused"] = str(e)
        t.join(3 * timeout_s + 10)
        out["scheduler_error"] = box.get("error")
        recv_x, _, recv_w, _, handle, _ = box["result"]
    else:
        if rank == num_ranks - 1:
            time.sleep(LATE_S)
        recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
    buf.combine(recv_x, handle, topk_weights=recv_w)  # rank 0: from the main thread, after the scheduler's call
    torch.cuda.synchronize()
    buf.raise_if_failed()
    out["after"] = _round(buf, seed + 2) is not None
    buf.destroy()
    dist.barrier()
    out["fresh"] = _checked_round(timeout_s, seed + 3)
    return out


def sigint_during_host_wait(rank: int, num_ranks: int, timeout_s: float, seed: int) -> dict:
    """Rank 0 gets SIGINT (a real signal, from a timer thread of its own) while its dispatch waits in the host wait
    for the late last rank. Rank 0: KeyboardInterrupt; later calls raise 'interrupted'. The peers: their dispatch
    raises within the timeout (rank 0 never launches its dispatch kernel). Every rank: destroy() returns within the
    timeout, and after a barrier a fresh Buffer runs a checked round."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a spawned child may inherit SIG_IGN)
    buf = _buffer(timeout_s)
    _round(buf, seed)
    dist.barrier()
    out = {}
    t0 = time.monotonic()
    if rank == 0:
        main = threading.main_thread()

        def interrupt():
            _in_host_wait(main)
            out["signal_after_s"] = time.monotonic() - t0
            signal.pthread_kill(main.ident, signal.SIGINT)

        timer = threading.Thread(target=interrupt, daemon=True)
        timer.start()
        try:
            _round(buf, seed + 1)
            out["interrupted"] = False
        except KeyboardInterrupt as e:
            out["interrupted"] = True
            out["notes"] = list(getattr(e, "__notes__", []))
        out["call_s"] = time.monotonic() - t0
        timer.join()
        try:
            _round(buf, seed + 2)
            out["later"] = None
        except EpRtError as e:
            out["later"] = str(e)
    else:
        if rank == num_ranks - 1:
            time.sleep(LATE_S)
        try:
            _round(buf, seed + 1)
            out["error"] = None
        except EpRtError as e:
            out["error"] = f"{type(e).__name__}: {e}"
        out["call_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    try:
        buf.destroy()
        out["destroy_error"] = None
    except EpRtError as e:
        out["destroy_error"] = f"{type(e).__name__}: {e}"
    out["destroy_s"] = time.monotonic() - t1
    dist.barrier()
    out["fresh"] = _checked_round(timeout_s, seed + 3)
    return out


def two_buffers(rank, num_ranks, seed: int):
    """Issue 25 item 2, SGLang's prefill and decode in one process: a high-throughput Buffer and a low-latency Buffer
    on one group, checked rounds of each in alternation, with CUDA-graph replays of an LL dispatch + combine between
    the HT rounds; then Buffers on subgroups (4 ranks: {0, 1} and {2, 3}): a high-throughput one works beside the
    world's, a low-latency one is refused (one NVSHMEM world per process), and after the world's LL Buffer is
    destroyed a new one works."""
    from ep_rt.testing import selfcheck_ll, soak_ll

    ht = Buffer(dist.group.WORLD, 64 << 20, explicitly_destroy=True)
    ll_case = selfcheck_ll.LLCase("two buffers, LL", max_tokens=64, num_tokens=48, hidden=1024, num_experts=48)
    rdma = Buffer.get_low_latency_rdma_size_hint(soak_ll.MAX_TOKENS, 2048, num_ranks, 64)
    ll = Buffer(dist.group.WORLD, 0, rdma, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
    ht_case = selfcheck_ht.Case("two buffers, HT", num_tokens=128, num_experts=48)
    checks, failures = 0, []
    graph = soak_ll._GraphRound(ll, rank, num_ranks, ll.device, **soak_ll.GRAPH_SHAPE)
    tally = soak_ll._Tally(4, ll.device)
    for i in range(4):
        for chk in (
            selfcheck_ht.run_case(ht, ht_case, seed + i),
            selfcheck_ll.run_ll_case(ll, ll_case, seed + 100 + i),
        ):
            checks += chk.checks
            failures += chk.failures
        tally.round = i
        graph.replay_checked(seed * 31 + i, tally)  # between eager rounds of both Buffers
    torch.cuda.synchronize()
    out = {"checks": checks + tally.checks, "failures": failures[:5], "graph_bad": tally.bad.tolist()}
    if num_ranks == 4:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # (every rank makes both groups, in order)
        mine = pairs[rank // 2]
        sub = Buffer(mine, 32 << 20, explicitly_destroy=True)
        chk = selfcheck_ht.run_case(sub, selfcheck_ht.Case("subgroup HT", num_tokens=128, num_experts=16), seed + 7)
        out["subgroup_checks"], out["subgroup_failures"] = chk.checks, chk.failures[:5]
        try:
            Buffer(mine, 0, rdma, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
            out["subgroup_ll"] = None
        except EpRtError as e:
            out["subgroup_ll"] = str(e)
        sub.destroy()
    del graph
    ll.destroy()
    ht.destroy()
    again = Buffer(dist.group.WORLD, 0, rdma, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
    chk = selfcheck_ll.run_ll_case(again, ll_case, seed + 9)
    out["again_checks"], out["again_failures"] = chk.checks, chk.failures[:5]
    again.destroy()
    return out


# ---- issue 25 item 5: a rank that dies and a replacement that joins a new process group of the same ranks ----------
RESTART_TIMEOUT_S = 5.0


def _restart_join(port: int, rank: int):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)


def _restart_buffers():
    from ep_rt.testing import selfcheck_ll

    case = selfcheck_ll.LLCase("restart, LL", max_tokens=32, num_tokens=32, hidden=1024, num_experts=16)
    rdma = Buffer.get_low_latency_rdma_size_hint(case.max_tokens, case.hidden, 2, case.num_experts)
    return case, rdma


def _restart_new_buffers(seed: int) -> dict:
    """In the new group: a checked round on a new high-throughput Buffer, then a low-latency Buffer (which the
    survivor's left-over NVSHMEM world refuses on every rank, naming the cause)."""
    from ep_rt.errors import RankMismatchError

    out = {}
    ht = Buffer(dist.group.WORLD, 32 << 20, explicitly_destroy=True, timeout_s=RESTART_TIMEOUT_S)
    chk = selfcheck_ht.run_case(ht, selfcheck_ht.Case("after a restart", num_tokens=128, num_experts=16), seed)
    out["ht_checks"], out["ht_failures"] = chk.checks, chk.failures[:5]
    ht.destroy()
    _, rdma = _restart_buffers()
    try:
        Buffer(dist.group.WORLD, 0, rdma, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
        out["ll"] = "made"
    except RankMismatchError as e:
        out["ll"] = str(e)
    return out


def restart_first_group(rank: int, ports, queue, seed: int) -> None:
    """Both ranks: a Buffer with both modes and a checked round of each; then rank 1 dies. Rank 0 (the survivor):
    its next call raises within the timeout, destroy() completes, and it joins the second group (ports[1])."""
    from ep_rt.errors import EpRtError as Error

    from ep_rt.testing import selfcheck_ll

    torch.cuda.set_device(0)
    _restart_join(ports[0], rank)
    case, rdma = _restart_buffers()
    old = Buffer(
        dist.group.WORLD,
        32 << 20,
        rdma,
        low_latency_mode=True,
        num_qps_per_rank=4,
        explicitly_destroy=True,
        timeout_s=RESTART_TIMEOUT_S,
    )
    first = selfcheck_ht.run_case(old, selfcheck_ht.Case("before the restart", num_tokens=128, num_experts=16), seed)
    first_ll = selfcheck_ll.run_ll_case(old, case, seed + 1)
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 1:
        os._exit(17)  # the process dies between calls
    out = {"first": first.checks + first_ll.checks, "first_failures": (first.failures + first_ll.failures)[:5]}
    t0 = time.monotonic()
    try:
        _round(old, seed + 2)
        out["call"] = None
    except Error as e:
        out["call"] = f"{type(e).__name__}: {e}"
    out["call_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    try:
        old.destroy()
        out["destroy"] = None
    except Exception as e:  # noqa: BLE001 (reported)
        out["destroy"] = f"{type(e).__name__}: {e}"
    out["destroy_s"] = time.monotonic() - t0
    dist.destroy_process_group()
    _restart_join(ports[1], 0)
    out.update(_restart_new_buffers(seed + 3))
    queue.put(("survivor", out))


def restart_replacement(ports, queue, seed: int) -> None:
    """The replacement of rank 1: a fresh process joining the second group as rank 1."""
    torch.cuda.set_device(0)
    _restart_join(ports[1], 1)
    queue.put(("replacement", _restart_new_buffers(seed + 3)))
