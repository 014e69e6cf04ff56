"""Low-latency mode on 2 ranks against ep_rt.reference_ll, each case its own test: every case of
ep_rt.testing.selfcheck_ll.ll_cases (options, both buffers, hooks, zero-copy, LogFMT combine), the CUDA-graph
replays and a round after clean_low_latency_buffer.

The ranks are spawned once (a module-scoped RankPool) and each builds its low-latency Buffer at the first case and
keeps it; a case that raises makes every rank drop its Buffer, so the next case starts on a fresh one. Node ids:
test_low_latency_matches_reference[<case id>], e.g. [fp8] or [LogFMT_hidden_1152] (conftest's case_ids).
EP_RT_CASE_SEED=<seed> re-runs a case with the seed its failure printed. (Shrink mode and the put path on emulated
nodes: test_low_latency_gpu.py, test_low_latency_nodes_gpu.py.)

Eager calls are one kernel each (ep_rt_ll_dispatch / ep_rt_ll_combine); the hook cases run the split kernels. A
second pool runs a few cases with EP_RT_LL_TWO_KERNELS=1 (eager calls split too, the receive started early: the A/B
knob), and each case checks that every rank ran the form its pool asked for."""

import pytest

from ep_rt.testing import selfcheck_ll

from . import workers
from .conftest import case_ids, case_pool, case_seed, case_timeout_s, check_case_results, gpus, log_case_notes, run_case

NUM_RANKS = 2
CASES = [c.name for c in selfcheck_ll.ll_cases(NUM_RANKS)] + [workers.LL_GRAPH_CASE, workers.LL_AFTER_CLEAN_CASE]

pytestmark = gpus(1)


# The eager forms the knob gives, on a few cases that reach both buffers, FP8, LogFMT, zero-copy and graph replays.
TWO_KERNEL_CASES = ["bf16", "fp8", "async", "zero_copy + out", "LogFMT, hidden 1152", workers.LL_GRAPH_CASE]


@pytest.fixture(scope="module")
def ll_pool():
    with case_pool(NUM_RANKS, workers.LL_CASES_BUFFER) as pool:
        yield pool


@pytest.fixture(scope="module")
def ll_two_kernels_pool():
    with case_pool(NUM_RANKS, workers.LL_CASES_BUFFER, env={"EP_RT_LL_TWO_KERNELS": "1"}) as pool:
        yield pool


def _run(pool, case, capsys, two_kernels: bool):
    seed = case_seed()
    results = run_case(pool, workers.ll_case, workers.LL_CASES_BUFFER, case, seed, timeout_s=case_timeout_s())
    log_case_notes(capsys, results, case)
    check_case_results(results, case, seed)
    ran = [r["two_kernels"] for r in results]
    assert ran == [two_kernels] * NUM_RANKS, f"the ranks' two_kernels (EP_RT_LL_TWO_KERNELS) are {ran}"


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_low_latency_matches_reference(ll_pool, case, capsys):
    _run(ll_pool, case, capsys, two_kernels=False)


@pytest.mark.parametrize("case", TWO_KERNEL_CASES, ids=case_ids(TWO_KERNEL_CASES))
def test_low_latency_two_kernels_per_call_match_reference(ll_two_kernels_pool, case, capsys):
    _run(ll_two_kernels_pool, case, capsys, two_kernels=True)
