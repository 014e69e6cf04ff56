"""ep_rt.testing.rank_pool on the CPU (gloo, no GPU): the same ranks serve call after call and answer in rank
order; a rank's exception comes back with its traceback and leaves the pool usable; a hang, a rank stuck after a
peer's error and a dead rank are reported, end the ranks and break the pool, whose later calls raise at once;
close(), the context manager and the finalizer leave no rank behind. (The GPU case tests, tests/gpu/*_cases_gpu.py,
run on this pool.)"""

import gc
import multiprocessing
import os
import pickle
import signal
import time

import pytest
import torch
import torch.distributed as dist

from ep_rt.testing import rank_pool
from ep_rt.testing.rank_pool import PoolBrokenError, RankError, RankPool

# Each test's deadline is short; a rank start on a loaded 2-core machine still gets its time.
START_S = 120


def _whoami(rank, num_ranks, tag):
    return rank, num_ranks, os.getpid(), tag, dist.get_rank(), dist.get_world_size()


def _all_reduce(rank, num_ranks):
    t = torch.tensor([rank + 1])
    dist.all_reduce(t)
    return int(t)


def _refuse_on(rank, num_ranks, bad):
    if rank == bad:
        raise ValueError(f"rank {rank} refuses this call")
    return rank


def _stuck_in_a_loop_on(rank, num_ranks, bad):
    while rank == bad:
        time.sleep(0.05)
    return rank


def _refuse_on_0_while_1_is_stuck(rank, num_ranks):
    if rank == 0:
        raise KeyError("rank 0's own mistake")
    _stuck_in_a_loop_on(rank, num_ranks, rank)


def _exit_on(rank, num_ranks, bad):
    if rank == bad:
        os._exit(7)
    return rank


def _unpicklable_result(rank, num_ranks):
    return (lambda: None) if rank == 1 else rank


def _env(rank, num_ranks, name):
    return os.environ.get(name)


class _Made:
    count = 0

    def __init__(self):
        type(self).count += 1


def _cached(rank, num_ranks):
    made = rank_pool.rank_cache("made", _Made)
    return id(made), _Made.count


def _forget(rank, num_ranks):
    return rank_pool.rank_forget("made") is not None


def _gone(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def pool():
    with RankPool(3, device="cpu", env={"EP_RT_POOL_TEST": "yes"}, timeout_s=START_S) as p:
        yield p


def test_results_come_in_rank_order_from_the_same_ranks_call_after_call(pool):
    first = pool.run(_whoami, "a")
    assert [r[:2] for r in first] == [(0, 3), (1, 3), (2, 3)]
    assert [r[4:] for r in first] == [(0, 3), (1, 3), (2, 3)]  # each rank's process group
    pids = [r[2] for r in first]
    assert pids == pool.pids and len(set(pids)) == 3 and os.getpid() not in pids
    for tag in ("b", "c"):
        again = pool.run(_whoami, tag)
        assert [r[2] for r in again] == pids and {r[3] for r in again} == {tag}  # the same processes
    assert pool.run(_all_reduce) == [6, 6, 6]  # the ranks still talk to each other
    assert pool.run(_env, "EP_RT_POOL_TEST") == ["yes"] * 3


def test_an_exception_on_one_rank_comes_back_with_its_traceback_and_the_pool_stays_usable(pool):
    with pytest.raises(RankError) as info:
        pool.run(_refuse_on, 1)
    assert list(info.value.errors) == [1]
    text = str(info.value)
    assert "--- rank 1 ---" in text and "ValueError: rank 1 refuses this call" in text, text
    assert "_refuse_on" in text and "Traceback" in text, text  # where it was raised
    assert "stays usable" in text and pool.broken is None
    assert pool.run(_refuse_on, -1) == [0, 1, 2]
    assert pool.run(_all_reduce) == [6, 6, 6]


def test_what_cannot_be_pickled_fails_without_breaking_the_pool(pool):
    with pytest.raises(Exception, match="(?i)pickle"):  # a lambda reaches no rank
        pool.run(lambda rank, num_ranks: rank)
    with pytest.raises(RankError, match="could not be sent back") as info:
        pool.run(_unpicklable_result)
    assert list(info.value.errors) == [1]
    assert pool.run(_refuse_on, -1) == [0, 1, 2]


def test_rank_cache_keeps_an_object_between_calls_until_forgotten(pool):
    first = pool.run(_cached)
    assert pool.run(_cached) == first  # the same object, made once per rank
    assert pool.run(_forget) == [True] * 3 and pool.run(_forget) == [False] * 3
    remade = pool.run(_cached)
    assert [count for _, count in remade] == [count + 1 for _, count in first]


def test_a_hang_is_reported_with_the_stacks_then_the_pool_is_broken(capfd):
    pool = RankPool(2, device="cpu", timeout_s=START_S)
    procs = pool.processes()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        pool.run(_stuck_in_a_loop_on, 1, timeout_s=2)
    assert time.monotonic() - t0 < 30
    text = str(info.value)
    assert "within 2 s" in text and "results from [0]" in text and "still running [1]" in text, text
    assert "run(_stuck_in_a_loop_on)" in text and "broken" in text, text
    assert "_stuck_in_a_loop_on" in capfd.readouterr().err  # rank 1's stack, dumped before it was ended
    assert not any(p.is_alive() for p in procs)  # ended at once, not at close()
    t0 = time.monotonic()
    with pytest.raises(PoolBrokenError, match="within 2 s"):
        pool.run(_whoami, "x")
    assert time.monotonic() - t0 < 1
    pool.close()


def test_a_rank_stuck_after_a_peers_exception_breaks_the_pool_after_the_grace():
    with RankPool(2, device="cpu", timeout_s=START_S, error_grace_s=1.0) as pool:
        t0 = time.monotonic()
        with pytest.raises(RankError) as info:
            pool.run(_refuse_on_0_while_1_is_stuck, timeout_s=60)
        assert time.monotonic() - t0 < 20  # the grace, not the deadline
        text = str(info.value)
        assert "KeyError" in text and "rank 0's own mistake" in text and "ranks [1] had not returned" in text, text
        assert pool.broken and not any(p.is_alive() for p in pool.processes())
        with pytest.raises(PoolBrokenError, match="had not returned"):
            pool.run(_whoami, "x")


def test_a_rank_that_dies_during_a_call_is_reported_and_breaks_the_pool():
    with RankPool(2, device="cpu", timeout_s=START_S) as pool:
        t0 = time.monotonic()
        with pytest.raises(PoolBrokenError, match=r"ranks \[1\] exited without a reply \(exit codes \{1: 7\}\)"):
            pool.run(_exit_on, 1, timeout_s=60)
        assert time.monotonic() - t0 < 20
        assert not any(p.is_alive() for p in pool.processes())
        with pytest.raises(PoolBrokenError, match="exited without a reply"):
            pool.run(_whoami, "x")


def test_a_rank_killed_between_calls_is_reported_at_the_next_call():
    with RankPool(2, device="cpu", timeout_s=START_S) as pool:
        os.kill(pool.pids[0], signal.SIGKILL)
        pool.processes()[0].join(30)
        with pytest.raises(PoolBrokenError, match=r"ranks \[0\] exited between calls \(exit codes \{0: -9\}\)"):
            pool.run(_whoami, "x")
        assert not pool.processes()[1].is_alive()


def test_close_leaves_no_rank_and_later_calls_raise():
    pool = RankPool(2, device="cpu", timeout_s=START_S)
    procs, pids = pool.processes(), pool.pids
    pool.run(_whoami, "x")
    pool.close()
    assert [p.exitcode for p in procs] == [0, 0]  # they stopped on their own (asked to), not killed
    assert all(_gone(pid) for pid in pids)
    assert not set(pids) & {c.pid for c in multiprocessing.active_children()}
    pool.close()  # idempotent
    with pytest.raises(PoolBrokenError, match="closed"):
        pool.run(_whoami, "x")


def test_close_terminates_a_rank_busy_with_a_call():
    pool = RankPool(2, device="cpu", timeout_s=START_S, stop_grace_s=1.0)
    procs = pool.processes()
    # Both ranks up first: on a loaded 2-core machine a rank still importing torch would miss the 1 s grace
    # (rank 0 was terminated that way in a local CI run beside a cubin build).
    pool.run(_whoami, "x")
    pool._commands[1].put((99, pickle.dumps((_stuck_in_a_loop_on, (1,)))))  # busy: never reads its stop
    time.sleep(0.5)
    pool.close()
    assert procs[0].exitcode == 0 and procs[1].exitcode == -signal.SIGTERM


def test_a_pool_nobody_closed_ends_its_ranks_when_dropped():
    dropped = RankPool(2, device="cpu", timeout_s=START_S)
    procs = dropped.processes()
    del dropped
    gc.collect()
    for p in procs:
        p.join(30)
    assert not any(p.is_alive() for p in procs)  # the finalizer stopped them


def test_a_failed_start_is_reported_and_leaves_no_rank():
    before = set(multiprocessing.active_children())
    with pytest.raises(RankError, match=r"the ranks' start failed") as info:
        RankPool(2, device="cpu", backend="no-such-backend", timeout_s=START_S)
    assert sorted(info.value.errors) == [0, 1] and "no-such-backend" in str(info.value)
    assert set(multiprocessing.active_children()) <= before


def test_device_choices():
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        RankPool(2, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU visible"):
            RankPool(2)
