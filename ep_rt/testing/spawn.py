"""Run a function on N local ranks (one process each, spawned), with a hard deadline.

Rank r uses GPU r % num_gpus, so more ranks than GPUs share GPUs (the tests use that to cover 4 and
8 ranks on a 2-GPU machine). Results come back through a queue; a rank that raises or the deadline
passing fails the whole run with the ranks' messages.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import time
import traceback

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A rank still running at the deadline is sent this signal first: it writes every thread's Python stack to stderr
# (faulthandler, safe inside a blocked C call), so a hang says where it hung.
STACK_SIGNAL = signal.SIGUSR1


def default_backend(num_ranks: int, num_gpus: int) -> str:
    """NCCL when every rank has a GPU of its own (NCCL refuses two ranks on one GPU), gloo otherwise (or none)."""
    return "nccl" if num_gpus and num_ranks <= num_gpus else "gloo"


def capped(timeout_s: float) -> float:
    """timeout_s, capped by SPAWN_DEADLINE_S: a runner with a time limit per test (tools/gpu_run.sh) sets it below
    its limit, so a hang is reported with the ranks' stacks before the runner kills pytest."""
    cap = os.environ.get("SPAWN_DEADLINE_S")
    return min(timeout_s, float(cap)) if cap else timeout_s


def release_cached_gpu_memory() -> None:
    """Give the caching allocator's free blocks back to the driver before ranks start on the same GPU: tests that
    ran in this process earlier can hold GiBs that the ranks (several on one GPU) then lack."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def setup_rank(rank, num_ranks, num_gpus, port, backend, env) -> None:
    """What a spawned rank does before any work: its environment, stack dumps on STACK_SIGNAL, its GPU (rank %
    num_gpus; none with num_gpus 0, a CPU rank) and the process group."""
    os.environ.update(env)
    faulthandler.register(STACK_SIGNAL, all_threads=True)
    if num_gpus:
        torch.cuda.set_device(rank % num_gpus)
    torch.distributed.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks
    )


def _entry(rank, fn, num_ranks, num_gpus, port, backend, env, queue, args):
    try:
        setup_rank(rank, num_ranks, num_gpus, port, backend, env)
        result = fn(rank, num_ranks, *args)
    except BaseException as e:  # report, then let spawn see the failure too
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise
    queue.put((rank, "ok", result))
    try:  # the result is in; a peer that is gone (a fault test) only makes this fail
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    except Exception:
        pass


def run_ranks(
    fn,
    num_ranks: int,
    args=(),
    num_gpus: int | None = None,
    backend: str | None = None,
    timeout_s: float = 600.0,
    env: dict | None = None,
    may_exit: tuple = (),
) -> list:
    """Call fn(rank, num_ranks, *args) on every rank; return the ranks' results in rank order. Ranks in `may_exit`
    may end without a result (fault tests kill them); their result is None."""
    num_gpus = num_gpus or torch.cuda.device_count()
    if num_gpus == 0:
        raise RuntimeError("no CUDA GPU visible")
    backend = backend or default_backend(num_ranks, num_gpus)
    release_cached_gpu_memory()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = mp.start_processes(
        _entry,
        args=(fn, num_ranks, num_gpus, free_port(), backend, dict(env or {}), queue, tuple(args)),
        nprocs=num_ranks,
        join=False,
        start_method="spawn",
    )
    timeout_s = capped(timeout_s)
    deadline = time.monotonic() + timeout_s
    results, errors = {}, {}

    def drain():
        while not queue.empty():
            rank, status, payload = queue.get()
            (results if status == "ok" else errors)[rank] = payload

    def gone():  # ranks allowed to exit that did, without a word
        return {r for r in may_exit if not procs.processes[r].is_alive() and r not in results and r not in errors}

    try:
        while True:
            drain()
            if errors:  # give the other ranks a moment to report theirs too (often the cause)
                grace = time.monotonic() + 5.0
                while len(results) + len(errors) < num_ranks and time.monotonic() < grace:
                    drain()
                    time.sleep(0.05)
                break
            if len(results) + len(gone()) >= num_ranks:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(_hang_report(procs.processes, timeout_s, results, gone()))
            if all(not p.is_alive() for p in procs.processes):
                drain()
                break
            time.sleep(0.05)
        if not errors:
            _join_checked(procs.processes, may_exit, 5 if may_exit else max(deadline - time.monotonic(), 1))
    finally:
        _end(procs.processes)
    if errors:
        raise RuntimeError("\n".join(f"--- rank {r} ---\n{msg}" for r, msg in sorted(errors.items())))
    missing = [r for r in range(num_ranks) if r not in results and r not in may_exit]
    if missing:
        raise RuntimeError(f"ranks {missing} exited without a result")
    return [results.get(r) for r in range(num_ranks)]


def _join_checked(processes, may_exit: tuple, timeout_s: float) -> None:
    """Wait for the ranks to exit; a rank outside `may_exit` that ends with a non-zero code fails the run. (torch's
    ProcessContext.join raises for any such code, also for a rank a fault test lets end on purpose, e.g. with the
    NVSHMEM deadline's 124: attempt 20261206T042324Z.)"""
    deadline = time.monotonic() + timeout_s
    for p in processes:
        p.join(max(deadline - time.monotonic(), 0.1))
    bad = [(r, p.exitcode) for r, p in enumerate(processes) if r not in may_exit and p.exitcode not in (0, None)]
    if bad:
        raise RuntimeError(", ".join(f"rank {r} exited with code {code} after its result" for r, code in bad))


def _end(processes, grace_s: float = 10.0) -> None:
    """Terminate the ranks still running and wait until every one has exited: a rank's GPU context is torn down as
    it exits, and the next test's NVSHMEM start on the same GPU failed ("mapping of buffer object failed", attempt
    20261202T035128Z) while the ranks of the test before were still going."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(deadline - time.monotonic(), 0.1))
    for p in processes:
        if p.is_alive():  # ignored SIGTERM (blocked in a C call)
            p.kill()
            p.join(grace_s)


def dump_stacks(processes, ranks=None) -> list:
    """Send STACK_SIGNAL to the ranks still running (each writes every thread's Python stack to its stderr) and give
    them a moment to write before the caller ends them; returns those ranks. ranks: only these (default: all)."""
    alive = [r for r, p in enumerate(processes) if p.is_alive() and (ranks is None or r in ranks)]
    for r in alive:
        try:
            os.kill(processes[r].pid, STACK_SIGNAL)
        except ProcessLookupError:
            pass
    time.sleep(1.0)
    return alive


def _hang_report(processes, timeout_s: float, results: dict, gone: set, busy=None) -> str:
    """The deadline passed: which ranks finished, which exited, which still run (their stacks go to stderr).
    busy: the ranks that count as still running if alive (default: all; a rank pool's ranks that replied wait
    alive for the next call)."""
    alive = dump_stacks(processes, busy)
    exited = {r: p.exitcode for r, p in enumerate(processes) if not p.is_alive() and r not in results}
    return (
        f"ranks did not finish within {timeout_s:.0f} s: results from {sorted(results)}, exited without one "
        f"{exited} (allowed: {sorted(gone)}), still running {alive} (their Python stacks are on stderr above)"
    )
