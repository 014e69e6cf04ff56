"""EP8 on an 8-GPU node (issue 5): the high-throughput and low-latency suites with 8 ranks, one per GPU, against
ep_rt.reference on fresh random inputs. Skipped with fewer than 8 GPUs; the EP8 / EP4 benchmark tables come from
`python -m ep_rt` and `python -m ep_rt --ranks 4` (tools/gpu_run.sh steps ep8 and ep4)."""

import pytest

from ep_rt.testing.spawn import run_ranks

from . import workers
from .conftest import gpus


def _problems(results):
    return [
        f"rank {rank} {name}: {f}"
        for rank, res in enumerate(results)
        for name, _, failures in res["cases"]
        for f in failures
    ]


@gpus(8)
@pytest.mark.parametrize("aggressive", [False, True], ids=["safe", "aggressive"])
def test_high_throughput_suite_8_ranks_one_per_gpu(aggressive):
    results = run_ranks(workers.suite, 8, args=(None, aggressive), num_gpus=8, timeout_s=1500)
    names = [name for name, _, _ in results[0]["cases"]]
    assert workers.GRAPH_CASE in names and len(names) > 20, names
    assert all(checks > 0 for _, checks, _ in results[0]["cases"])
    problems = _problems(results)
    assert not problems, "\n".join(problems[:40]) + f"\n(seed {results[0]['seed']})"


@gpus(8)
def test_low_latency_suite_8_ranks_one_per_gpu():
    results = run_ranks(workers.ll_suite, 8, num_gpus=8, timeout_s=1500)
    assert len(results[0]["cases"]) >= 20
    assert all(checks > 0 for _, checks, _ in results[0]["cases"])
    problems = _problems(results)
    assert not problems, "\n".join(problems[:40]) + f"\n(seed {results[0]['seed']})"


@gpus(8)
def test_shrink_mode_masks_seven_silent_ranks():
    res = run_ranks(workers.ll_shrink, 8, num_gpus=8, timeout_s=300)[0]
    assert res["mask"] == [0] + [1] * 7, res
    assert res["count_ok"] and res["range_ok"] and res["combine_ok"], res
    assert res["dispatch_s"] < 30, res
