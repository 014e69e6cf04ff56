"""Ranks spawned once, then given one function after another: the rank setup of ep_rt.testing.spawn.run_ranks (a
GPU each, a process group), kept alive between calls.

A test module of many cases spawns its ranks once (and builds its Buffer once, rank_cache) instead of once per case,
so that each case can be a test of its own. A call that fails on some ranks while every rank returned leaves the
pool usable; a call that leaves ranks behind (a deadline passed, a rank died, a rank stuck after a peer's error)
ends every rank and marks the pool broken, and every later call raises at once with the reason.

    with RankPool(2, env={"EP_RT_AGGRESSIVE_PTX": "1"}) as pool:
        pool.run(module_level_fn, "case name", 1234)   # fn(rank, num_ranks, "case name", 1234) on every rank
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
import weakref

import torch
import torch.multiprocessing as mp

from .spawn import (
    _end,
    _hang_report,
    capped,
    default_backend,
    dump_stacks,
    free_port,
    release_cached_gpu_memory,
    setup_rank,
)


class RankError(RuntimeError):
    """fn raised on some ranks (errors: rank -> its exception and traceback). The message has run_ranks' form."""

    def __init__(self, errors: dict, note: str = ""):
        self.errors = dict(errors)
        text = "\n".join(f"--- rank {r} ---\n{msg}" for r, msg in sorted(self.errors.items()))
        super().__init__(text + (f"\n{note}" if note else ""))


class PoolBrokenError(RuntimeError):
    """The pool's ranks were ended after a failure that left them unusable (or it was closed): no call can run."""


# What a rank keeps between calls (rank_cache): one dict per rank process.
_RANK_STATE: dict = {}


def rank_cache(key, make):
    """In a rank: the object make() returned the first time `key` was asked for in this process, kept for the
    pool's later calls (a Buffer built once per test module). Every rank must ask in the same calls: make() is
    usually collective."""
    if key not in _RANK_STATE:
        _RANK_STATE[key] = make()
    return _RANK_STATE[key]


def rank_forget(key):
    """In a rank: drop `key` from the cache and return what it held (None if nothing)."""
    return _RANK_STATE.pop(key, None)


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


def _pool_entry(rank, num_ranks, num_gpus, port, backend, env, commands, results):
    """A rank's life: set up as run_ranks' ranks are, say ready (with its pid), then run each command that comes
    until None comes. A command is (seq, pickled (fn, args)); each gets one (rank, seq, status, payload) back."""
    try:
        setup_rank(rank, num_ranks, num_gpus, port, backend, env)
    except BaseException as e:  # reported; the rank ends (torch's spawn wrapper would leave an error file behind)
        results.put((rank, 0, "error", _error_text(e)))
        return
    results.put((rank, 0, "ok", os.getpid()))
    while True:
        command = commands[rank].get()
        if command is None:
            break
        seq, blob = command
        try:
            fn, args = pickle.loads(blob)
            value = fn(rank, num_ranks, *args)
        except Exception as e:  # reported; the rank waits for the next command
            results.put((rank, seq, "error", _error_text(e)))
            continue
        except BaseException as e:  # SystemExit, KeyboardInterrupt: reported, and the rank ends (pool broken)
            results.put((rank, seq, "error", _error_text(e)))
            raise
        try:
            results.put((rank, seq, "ok", value))  # (SimpleQueue pickles here: an unpicklable result raises here)
        except Exception as e:
            results.put((rank, seq, "error", f"its result could not be sent back: {_error_text(e)}"))
    try:
        torch.distributed.destroy_process_group()
    except Exception:
        pass


def _shutdown(processes, commands, grace_s: float) -> None:
    """Ask every rank to stop, give them grace_s to exit on their own (a rank's GPU context is torn down as it
    exits), then terminate and kill what is left (spawn._end). Also the pool's finalizer, so no reference to it."""
    for p, q in zip(processes, commands):
        if p.is_alive():
            try:
                q.put(None)
            except Exception:
                pass
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(deadline - time.monotonic(), 0.05))
    _end(processes)


class RankPool:
    """num_ranks spawned ranks, each set up as run_ranks sets one up, that run one function after another.

    device "cuda": rank r uses GPU r % num_gpus (default: every visible GPU), backend NCCL if every rank has a GPU
    of its own, else gloo. device "cpu": no GPU is touched, backend gloo (the pool's own tests).
    env: environment variables the ranks set before anything else (read at import or Buffer build, say).
    timeout_s: the deadline of the start and the default of each run (capped by SPAWN_DEADLINE_S, as run_ranks').
    error_grace_s: after one rank's error, how long the others may take to return theirs before the pool counts
    them as stuck (a peer of a failed collective may wait for its own timeout, then raise too).
    """

    def __init__(
        self,
        num_ranks: int,
        *,
        device: str = "cuda",
        num_gpus: int | None = None,
        backend: str | None = None,
        env: dict | None = None,
        timeout_s: float = 600.0,
        error_grace_s: float = 10.0,
        stop_grace_s: float = 10.0,
    ):
        if device == "cpu":
            num_gpus = 0
        elif device == "cuda":
            num_gpus = num_gpus or torch.cuda.device_count()
            if num_gpus == 0:
                raise RuntimeError("no CUDA GPU visible (RankPool(device='cpu') runs without one)")
        else:
            raise ValueError(f"device must be 'cuda' or 'cpu', not {device!r}")
        self.num_ranks, self.num_gpus = num_ranks, num_gpus
        self.backend = backend or default_backend(num_ranks, num_gpus)
        self.timeout_s, self.error_grace_s = timeout_s, error_grace_s
        self._broken: str | None = None
        self._seq = 0
        if device == "cuda":
            release_cached_gpu_memory()
        ctx = mp.get_context("spawn")
        self._results = ctx.SimpleQueue()
        self._commands = [ctx.SimpleQueue() for _ in range(num_ranks)]
        self._processes = mp.start_processes(
            _pool_entry,
            args=(num_ranks, num_gpus, free_port(), self.backend, dict(env or {}), self._commands, self._results),
            nprocs=num_ranks,
            join=False,
            start_method="spawn",
        ).processes
        # Ranks must not outlive a pool nobody closed (a test that forgot, an interpreter at exit): their GPU
        # contexts would stay on the GPU into later tests. (Runs before multiprocessing's exit handler joins them.)
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._commands, stop_grace_s)
        try:
            self.pids = self._collect(0, "the ranks' start", timeout_s)
        except BaseException:
            self.close()
            raise

    # -- calls ------------------------------------------------------------------------------------------------

    def run(self, fn, *args, timeout_s: float | None = None) -> list:
        """Call fn(rank, num_ranks, *args) on every rank; return the ranks' results in rank order. fn must be
        picklable by reference (a module-level function the ranks can import), args and results picklable.

        Raises RankError if fn raised on some ranks (each one's traceback; the pool stays usable when every rank
        returned), TimeoutError past the deadline (run_ranks' hang report, the still-running ranks' stacks on
        stderr), PoolBrokenError if a rank died, and at once for a broken or closed pool."""
        self._check_usable()
        blob = pickle.dumps((fn, args))  # before any rank gets it: an unpicklable call reaches no rank
        self._seq += 1
        what = f"run({getattr(fn, '__qualname__', fn)})"
        try:
            for q in self._commands:
                q.put((self._seq, blob))
        except BaseException as e:  # (an interrupt between two ranks' commands: they would wait for each other)
            self._break(f"{what} was interrupted while sending ({type(e).__name__})")
            raise
        return self._collect(self._seq, what, timeout_s or self.timeout_s)

    @property
    def broken(self) -> str | None:
        """Why the pool cannot run calls any more (None while it can)."""
        return self._broken

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise PoolBrokenError(f"the rank pool cannot run calls: {self._broken}")
        dead = {r: p.exitcode for r, p in enumerate(self._processes) if not p.is_alive()}
        if dead:
            self._break(f"ranks {sorted(dead)} exited between calls (exit codes {dead})")
            raise PoolBrokenError(f"the rank pool cannot run calls: {self._broken}")

    def _collect(self, seq: int, what: str, timeout_s: float) -> list:
        """Every rank's reply to command seq, in rank order; breaks the pool where ranks are left behind."""
        timeout_s = capped(timeout_s)
        deadline = time.monotonic() + timeout_s
        results, errors = {}, {}
        first_error = None
        try:
            while True:
                self._drain(seq, results, errors)
                if len(results) + len(errors) == self.num_ranks:
                    break
                now = time.monotonic()
                if errors and first_error is None:
                    first_error = now
                dead = self._dead_without_reply(results, errors)
                if dead:
                    self._drain(seq, results, errors)  # (a reply may have come just before the exit)
                    dead = self._dead_without_reply(results, errors)
                if dead:
                    reason = f"{what}: ranks {sorted(dead)} exited without a reply (exit codes {dead})"
                    self._break(reason)
                    raise PoolBrokenError(self._with_errors(reason + "; the pool's ranks were ended", errors))
                if first_error is not None and now > first_error + self.error_grace_s:
                    stuck = dump_stacks(self._processes, self._waiting(results, errors))
                    reason = (
                        f"{what}: ranks {stuck} had not returned {self.error_grace_s:.0f} s after ranks "
                        f"{sorted(errors)} raised (their Python stacks are on stderr above)"
                    )
                    self._break(reason)
                    raise RankError(errors, reason + "; the pool is broken, its ranks were ended")
                if now > deadline:
                    replied = {**results, **errors}
                    report = _hang_report(self._processes, timeout_s, replied, set(), self._waiting(results, errors))
                    self._break(f"{what}: {report}")
                    raise TimeoutError(self._with_errors(f"{what}: {report}; the pool is broken", errors))
                time.sleep(0.02)
        except (RankError, PoolBrokenError, TimeoutError):
            raise
        except BaseException as e:  # an interrupt mid-call: what the ranks are doing is unknown
            self._break(f"{what} was interrupted ({type(e).__name__})")
            raise
        if errors and seq == 0:  # (__init__ closes the pool)
            raise RankError(errors, f"({what} failed)")
        if errors:
            gone = [r for r, p in enumerate(self._processes) if not p.is_alive()]  # (SystemExit in fn, say)
            raise RankError(
                errors,
                f"({what}; every rank returned, "
                + (f"ranks {gone} exited after theirs: the next call raises)" if gone else "the pool stays usable)"),
            )
        return [results[r] for r in range(self.num_ranks)]

    def _drain(self, seq: int, results: dict, errors: dict) -> None:
        while not self._results.empty():
            rank, s, status, payload = self._results.get()
            if s == seq:  # (a reply to an earlier command cannot come: such a command broke the pool)
                (results if status == "ok" else errors)[rank] = payload

    def _waiting(self, results: dict, errors: dict) -> set:
        """The ranks that have not replied yet."""
        return set(range(self.num_ranks)) - set(results) - set(errors)

    def _dead_without_reply(self, results: dict, errors: dict) -> dict:
        return {
            r: p.exitcode
            for r, p in enumerate(self._processes)
            if not p.is_alive() and r not in results and r not in errors
        }

    @staticmethod
    def _with_errors(text: str, errors: dict) -> str:
        return text + "".join(f"\n--- rank {r} ---\n{msg}" for r, msg in sorted(errors.items()))

    def _break(self, reason: str) -> None:
        """Mark the pool broken and end its ranks at once: ranks left in a collective would otherwise hold their
        GPU (and a peer's) into the next test."""
        if self._broken is None:
            self._broken = reason
        self._finalizer.detach()
        _end(self._processes)

    # -- the end ------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the ranks (a clean exit first, then terminate and kill after the grace); idempotent. Later calls
        raise PoolBrokenError."""
        if self._broken is None:
            self._broken = "the pool was closed"
        self._finalizer()  # (runs _shutdown once; nothing once detached by _break or run before)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def processes(self) -> list:
        """The ranks' processes (multiprocessing.Process), in rank order."""
        return list(self._processes)
