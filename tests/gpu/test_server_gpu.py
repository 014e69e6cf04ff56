"""Issue 25 items 3 and 4 on a GPU (step `server` of tools/gpu_run.sh; ranks share one GPU, gloo): a Python thread
keeps running while a dispatch waits for a late peer; a second thread calling a Buffer that one thread is inside is
refused; SIGINT during a dispatch's host wait leaves every rank raising within the timeout, destroy() completing and
a fresh Buffer working. The CPU side of the same rules: tests/buffer/test_buffer_threads.py,
test_buffer_interrupts.py, tests/transport/test_host_wait.py."""

import os

import pytest

from ep_rt.testing.spawn import run_ranks

from . import server_workers
from .conftest import gpus

TIMEOUT = 8.0  # a kernel's wait for a peer: longer than the late rank's delay (server_workers.LATE_S)
RANKS = [2, 3]


def _seed():
    return int.from_bytes(os.urandom(4), "little")


@pytest.mark.server
@gpus(1)
@pytest.mark.parametrize("num_ranks", RANKS)
def test_a_thread_keeps_running_while_a_dispatch_waits_for_a_late_peer(num_ranks):
    res = run_ranks(server_workers.thread_progress_while_waiting, num_ranks, args=(TIMEOUT, _seed()), timeout_s=300)[0]
    assert res["dispatch_s"] > 0.5 * server_workers.LATE_S, res  # the dispatch did wait for the late rank
    assert res["waiting_rate"] > 0.7 * res["alone_rate"], res  # a wait holding the GIL gives about 0.5
    assert res["max_gap_s"] < 0.2, res


@pytest.mark.server
@gpus(1)
@pytest.mark.parametrize("num_ranks", RANKS)
def test_two_threads_on_one_buffer_the_second_is_refused(num_ranks):
    results = run_ranks(server_workers.two_threads_one_buffer, num_ranks, args=(TIMEOUT, _seed()), timeout_s=300)
    first = results[0]
    msg = first["refused"]
    assert msg is not None, "the main thread's call was not refused while the scheduler thread was inside dispatch"
    assert "thread 'MainThread'" in msg and "thread 'scheduler'" in msg and "inside Buffer.dispatch" in msg, msg
    assert first["scheduler_error"] is None, first
    for res in results:
        assert res["after"] and res["fresh"]["checks"] > 0 and not res["fresh"]["failures"], res


@pytest.mark.server
@gpus(1)
@pytest.mark.parametrize("num_ranks", RANKS)
def test_sigint_during_a_dispatchs_host_wait(num_ranks):
    results = run_ranks(server_workers.sigint_during_host_wait, num_ranks, args=(TIMEOUT, _seed()), timeout_s=400)
    victim, peers = results[0], results[1:]
    assert victim["interrupted"], victim
    assert victim["call_s"] < victim["signal_after_s"] + 2.0, victim  # the interrupt ended the wait at once
    assert any("interrupted (KeyboardInterrupt) during dispatch notify" in n for n in victim["notes"]), victim
    assert "interrupted (KeyboardInterrupt) during dispatch notify" in (victim["later"] or ""), victim
    for res in peers:  # rank 0 never launched its dispatch kernel: theirs time out
        assert res["error"] and "CommTimeoutError" in res["error"], res
        assert res["call_s"] < server_workers.LATE_S + 3 * TIMEOUT + 10, res
    for res in results:
        assert res["destroy_s"] < 3 * TIMEOUT + 10, res
        assert res["fresh"]["checks"] > 0 and not res["fresh"]["failures"], res


@pytest.mark.server
@gpus(1)
@pytest.mark.parametrize("num_ranks", [2, 4])
def test_a_high_throughput_and_a_low_latency_buffer_in_one_process(num_ranks):
    """Issue 25 item 2 (server_workers.two_buffers): alternation and graph replays bit-exact; at 4 ranks a subgroup's
    HT Buffer works and its LL Buffer is refused naming the rule; a new LL Buffer works after both are destroyed."""
    results = run_ranks(server_workers.two_buffers, num_ranks, args=(_seed(),), timeout_s=400)
    for res in results:
        assert res["checks"] > 0 and not res["failures"] and res["graph_bad"] == [0, 0, 0], res
        assert res["again_checks"] > 0 and not res["again_failures"], res
        if num_ranks == 4:
            assert res["subgroup_checks"] > 0 and not res["subgroup_failures"], res
            assert "NVSHMEM is initialised once per process" in (res["subgroup_ll"] or ""), res


@pytest.mark.server
@gpus(1)
def test_a_rank_that_dies_and_a_replacement_in_a_new_group():
    """Issue 25 item 5: rank 1 dies between calls; the survivor's call raises within the timeout and its destroy()
    completes; a fresh process joins a new process group of the same two ranks, where a new high-throughput Buffer
    runs a checked round on both, and a low-latency Buffer is refused on both, naming why (the survivor still holds
    the NVSHMEM world of the dead peer, which NVSHMEM cannot tear down without it)."""
    import multiprocessing as mp
    import queue as queue_mod

    from ep_rt.testing.spawn import free_port

    ctx = mp.get_context("spawn")
    q, seed, ports = ctx.Queue(), _seed(), (free_port(), free_port())
    procs = [ctx.Process(target=server_workers.restart_first_group, args=(r, ports, q, seed)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        procs[1].join(120)
        assert procs[1].exitcode == 17, procs[1].exitcode  # it died where the test kills it
        procs.append(ctx.Process(target=server_workers.restart_replacement, args=(ports, q, seed)))
        procs[-1].start()
        got = {}
        while len(got) < 2:
            try:
                who, res = q.get(timeout=240)
            except queue_mod.Empty:
                raise AssertionError(f"no result from {sorted({'survivor', 'replacement'} - set(got))}") from None
            got[who] = res
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    survivor, replacement = got["survivor"], got["replacement"]
    print("survivor:", survivor, "\nreplacement:", replacement, flush=True)  # whole, where an assert truncates
    assert survivor["first"] > 0 and not survivor["first_failures"], survivor
    assert survivor["call"] and "rank 1" in survivor["call"], survivor  # names the dead peer
    assert survivor["call_s"] < 3 * server_workers.RESTART_TIMEOUT_S + 10, survivor
    assert survivor["destroy"] is None and survivor["destroy_s"] < 3 * server_workers.RESTART_TIMEOUT_S + 10, survivor
    for res in (survivor, replacement):
        assert res["ht_checks"] > 0 and not res["ht_failures"], res
        assert "Restart every process of the group" in res["ll"], res
