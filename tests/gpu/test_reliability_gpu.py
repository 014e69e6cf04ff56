"""Reliability suite (issue 15) on GPUs, ranks sharing one GPU where there is only one: the bad-input catalogue,
fault tests (late, skipping and killed peers, with and without shrink mode; the LL killed peer also on emulated
nodes, over P2P puts and through the chaos transport) and, marked `soak`, 3,000 HT and 3,000 LL rounds
(test_ll_soak_gpu.py) with memory sampled."""

import os

import pytest

from ep_rt.testing import bad_inputs, faults, soak_ht
from ep_rt.testing.spawn import run_ranks

from .conftest import NODE_FAULT_LAYOUTS, ONE_NODE, gpus, node_fault_marks

TIMEOUT = 4.0  # seconds a kernel waits for a peer in the fault tests


def _seed():
    return int.from_bytes(os.urandom(4), "little")


@pytest.mark.catalogue
@gpus(1)
def test_bad_input_catalogue():
    """All 147 cases on 2 ranks: each raises its error before any ep_rt kernel launched (the launch counter did not
    move between the call and its error; the cases that launch by design must have launched), then good rounds."""
    results = run_ranks(bad_inputs.run_catalogue, 2, args=(_seed(),), timeout_s=900)
    assert [res["num_cases"] for res in results] == [147, 147]
    problems = bad_inputs.catalogue_problems(results)
    assert not problems, "\n".join(problems)


@gpus(1)
@pytest.mark.parametrize("kind", ["ht", "ll"])
@pytest.mark.parametrize("fault", ["late", "skip"])
def test_late_or_skipping_peer(kind, fault):
    results = run_ranks(faults.late_or_skipping_peer, 2, args=(kind, fault, TIMEOUT, _seed()), timeout_s=600)
    for rank, res in enumerate(results):
        call = res.get("call")
        if not res["faulty"]:  # the survivor: a clear timeout within the deadline
            assert call["error"] and call["timeout"], res
            assert f"rank {rank}" in call["error"] and "waiting for" in call["error"], call
            assert call["seconds"] < 3 * TIMEOUT + 10, call
        assert res["destroy"]["seconds"] < 3 * TIMEOUT + 10, res  # teardown completes (with or without an error)
        assert res["fresh"]["checks"] > 0 and not res["fresh"]["failures"], res


# On one node: HT, LL, LL in shrink mode. Issue 21 (marked ll_nodes: step ll_nodes): LL and LL in shrink mode with
# the dead rank on another node, over P2P puts and through the chaos transport; issue 22 (marked ll_packed too: step
# ll_packed_faults) the same under the packed layout.
ONE_NODE_KILLED = (("ht", False), ("ll", False), ("ll", True))
KILLED = [pytest.param(kind, shrink, ONE_NODE, id=f"{kind}-{shrink}") for kind, shrink in ONE_NODE_KILLED] + [
    pytest.param("ll", shrink, layout, id=f"ll-{shrink}-{name}", marks=node_fault_marks(layout))
    for name, layout in NODE_FAULT_LAYOUTS.items()
    for shrink in (False, True)
]


@gpus(1)
@pytest.mark.parametrize("kind,shrink,layout", KILLED)
def test_killed_peer(kind, shrink, layout):
    R = layout.num_ranks
    args = (kind, shrink, TIMEOUT, _seed())
    results = run_ranks(faults.killed_peer, R, args=args, env=layout.env(), timeout_s=600, may_exit=(R - 1,))
    assert results[-1] is None
    for rank, res in enumerate(results[:-1]):  # the survivors
        assert res["remote_peers"] == layout.remote_peers and res["chaos"] == layout.chaos, (rank, res)
        assert res["variant"] == (layout.variant if kind == "ll" else None), (rank, res)
        if shrink:
            assert res["mask"] == [0] * (R - 1) + [1] and res["count_ok"] and res["combine_ok"], (rank, res)
            assert res["seconds"] < 3 * TIMEOUT + 10, (rank, res)
        else:
            assert res["call"]["error"] and res["call"]["timeout"], (rank, res)
            assert res["call"]["seconds"] < 3 * TIMEOUT + 10, (rank, res)
        assert res["destroy"]["seconds"] < 3 * TIMEOUT + 10, (rank, res)


@gpus(1)
def test_a_peer_gone_during_nvshmem_start_ends_the_survivor_with_a_message(tmp_path):
    """NVSHMEM's start has no deadline: a peer that ends inside it (after the unique ids were exchanged) would leave
    the survivor waiting forever. ep_rt's watchdog ends it after EP_RT_NVSHMEM_TIMEOUT_S with a message naming the
    call and exit code 124 (ep_rt/transport/nvshmem_deadline.py)."""
    import time

    from . import workers

    env = {"EP_RT_NVSHMEM_TIMEOUT_S": "20"}
    start = time.monotonic()
    results = run_ranks(
        workers.peer_gone_during_nvshmem_start, 2, args=(str(tmp_path),), env=env, timeout_s=240, may_exit=(0, 1)
    )
    took = time.monotonic() - start
    err = (tmp_path / "rank0.err").read_text()
    assert results == [None, None], (results, err[-3000:])
    assert "rank 0: NVSHMEM's start" in err and "exit code 124" in err, err[-3000:]
    assert took < 200, took


@pytest.mark.soak
@gpus(1)
def test_ht_soak_3000_rounds_without_growth():
    rounds = int(os.environ.get("EP_RT_SOAK_ROUNDS", "3000"))
    results = run_ranks(soak_ht.ht_soak, 2, args=(rounds, _seed()), timeout_s=1800)
    problems = soak_ht.problems(results, rounds)
    assert not problems, "\n".join(problems)
    for res in results:
        assert res["counts"]["cached"] > 0 and res["counts"]["num_worst"] > 0 and res["counts"]["fp8"] > 0, res
