"""ep_rt.testing.spawn's report when ranks run past the deadline: who finished, who exited, who still runs, and
the stacks of those still running (a hang must say where it hung: attempt 20261202T012159Z said nothing)."""

import multiprocessing as mp
import os
import sys
import time

from ep_rt.testing import spawn


def _blocked_rank(path, ready):
    sys.stderr = open(path, "w", buffering=1)  # (faulthandler writes to this file's descriptor)
    import faulthandler

    faulthandler.register(spawn.STACK_SIGNAL, file=sys.stderr, all_threads=True)
    ready.set()
    while True:
        _waiting_for_a_peer_that_is_gone()


def _waiting_for_a_peer_that_is_gone():
    time.sleep(0.05)


def _exits_at_once():
    os._exit(3)


def test_the_hang_report_names_each_rank_and_dumps_the_stacks_of_those_still_running(tmp_path):
    ctx = mp.get_context("spawn")
    stacks = tmp_path / "rank1.err"
    ready = ctx.Event()
    procs = [ctx.Process(target=_exits_at_once), ctx.Process(target=_blocked_rank, args=(str(stacks), ready))]
    for p in procs:
        p.start()
    try:
        procs[0].join(60)
        assert ready.wait(120)  # rank 1 has registered its handler (a spawned child may take long to start)
        time.sleep(0.5)  # ... and left ready.set() (a dump taken inside it showed only set's frames: 4 in 14 runs)
        text = spawn._hang_report(procs, 150, results={}, gone=set())
    finally:
        procs[1].terminate()
        procs[1].join(10)
    assert "within 150 s" in text and "exited without one {0: 3}" in text and "still running [1]" in text, text
    dump = stacks.read_text()
    assert "_waiting_for_a_peer_that_is_gone" in dump and "_blocked_rank" in dump, dump


def _ignores_sigterm(ready):
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    while True:
        time.sleep(0.05)


def test_ending_the_ranks_waits_until_every_one_has_exited_even_one_that_ignores_sigterm():
    """The next test's NVSHMEM start failed while the ranks of the test before were still exiting: run_ranks ends
    its ranks and returns only once all are gone."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    procs = [ctx.Process(target=_ignores_sigterm, args=(ready,)), ctx.Process(target=_waiting_for_a_peer_that_is_gone)]
    for p in procs:
        p.start()
    assert ready.wait(120)  # its SIGTERM handler is installed (a spawned child may take long to start)
    spawn._end(procs, grace_s=2.0)
    assert [p.is_alive() for p in procs] == [False, False]
    assert procs[0].exitcode == -9  # (it needed the SIGKILL)


def _exits_with(code):
    os._exit(code)


def test_a_rank_allowed_to_exit_may_end_with_any_code_and_any_other_rank_may_not():
    """A fault test lets a rank end on purpose (the NVSHMEM deadline ends one with 124); torch's join raised for it
    (attempt 20261206T042324Z). A rank outside may_exit that ends non-zero still fails the run."""
    import pytest

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_exits_with, args=(124,)), ctx.Process(target=_exits_with, args=(0,))]
    for p in procs:
        p.start()
    spawn._join_checked(procs, (0,), 60)
    with pytest.raises(RuntimeError, match="rank 0 exited with code 124"):
        spawn._join_checked(procs, (), 60)
    with pytest.raises(RuntimeError, match="rank 0 exited with code 124"):
        spawn._join_checked(procs, (1,), 60)
