"""The intranode dispatch/combine suite against ep_rt.reference on 2 ranks, every cubin variant (safe, aggressive, and
tma: the bulk copies of issue 23 item 5), each case its own test: ep_rt.testing.selfcheck_ht.standard_cases and the
CUDA-graph case (workers.GRAPH_CASE).

The ranks are spawned once per variant (a module-scoped RankPool; the variant is the ranks' EP_RT_AGGRESSIVE_PTX
or EP_RT_TMA)
and each builds its Buffer at the variant's first case and keeps it; a case that raises makes every rank drop
its Buffer, so the next case starts on a fresh one. Node ids: test_dispatch_combine_match_reference_2_ranks[
<variant>-<case id>], e.g. [safe-bf16_uniform] or [aggressive-cuda_graph_replays_num_worst_tokens] (conftest's
case_ids). Marks: suite (every item), aggressive and tma (those variants'). EP_RT_CASE_SEED=<seed> re-runs a
case with the seed its failure printed."""

import pytest

from ep_rt.testing import selfcheck_ht

from . import workers
from .conftest import case_ids, case_pool, case_seed, case_timeout_s, gpus, run_case

NUM_RANKS = 2
CASES = [c.name for c in selfcheck_ht.standard_cases(NUM_RANKS)] + [workers.GRAPH_CASE]
VARIANTS = [
    "safe",
    pytest.param("aggressive", marks=pytest.mark.aggressive),
    pytest.param("tma", marks=pytest.mark.tma),
]

pytestmark = [pytest.mark.suite, gpus(1)]


@pytest.fixture(scope="module", params=VARIANTS)
def variant_pool(request):
    """(variant, a RankPool of NUM_RANKS ranks under it); pytest runs every case of one variant before the next."""
    env = {
        "EP_RT_AGGRESSIVE_PTX": "1" if request.param == "aggressive" else "0",
        "EP_RT_TMA": "1" if request.param == "tma" else "0",
    }
    with case_pool(NUM_RANKS, workers.HT_CASES_BUFFER, env=env) as pool:
        yield request.param, pool


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_dispatch_combine_match_reference_2_ranks(variant_pool, case):
    variant, pool = variant_pool
    seed = case_seed()
    results = run_case(pool, workers.ht_case, workers.HT_CASES_BUFFER, case, seed, timeout_s=case_timeout_s())
    assert [r["variant"] for r in results] == [variant] * NUM_RANKS, results  # the cubin variant that ran
    problems = [f"rank {rank} [{variant}] {case}: {f}" for rank, r in enumerate(results) for f in r["failures"]]
    assert not problems, "\n".join(problems[:40]) + f"\n(EP_RT_CASE_SEED={seed})"
    assert all(r["checks"] > 0 for r in results), [r["checks"] for r in results]
