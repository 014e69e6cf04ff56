"""Low-latency mode on 2 GPUs: shrink mode with a rank that stops answering, on one node and (issue 21, marked
ll_nodes: step ll_nodes) with the silent ranks on other nodes, over P2P puts and through the chaos transport; and
the whole LL suite on emulated nodes (the put path) as 2x1 and 2x2. (The LL suite against ep_rt.reference_ll on one
node, every option, both buffers, hooks, zero-copy, LogFMT combine, CUDA-graph replays, is
test_low_latency_cases_gpu.py: one test per case; on 4x1, 2x4, 4x2 and 2x8, test_low_latency_nodes_gpu.py.)"""

import pytest

from ep_rt.testing.spawn import run_ranks

from . import workers
from .conftest import NODE_FAULT_LAYOUTS, ONE_NODE, gpus, node_fault_marks


def log_notes(capsys, results):
    """Print every rank's measurements (how many LogFMT outputs differ, ...) into the run's log, pass or fail."""
    with capsys.disabled():
        for rank, res in enumerate(results):
            for note in res.get("notes", []):
                print(f"\n[rank {rank}] {note}", end="")
        print()


SHRINK_LAYOUTS = [pytest.param(ONE_NODE, id="one_node")] + [
    pytest.param(layout, id=name, marks=node_fault_marks(layout)) for name, layout in NODE_FAULT_LAYOUTS.items()
]


@gpus(1)
@pytest.mark.parametrize("layout", SHRINK_LAYOUTS)
def test_shrink_mode_masks_a_silent_rank(layout):
    """Every rank but rank 0 stays silent: rank 0 masks them after its timeout, and its results are the
    reference's without them (on emulated nodes: a silent rank over the put path, its puts late under chaos)."""
    R = layout.num_ranks
    res = run_ranks(workers.ll_shrink, R, env=layout.env(), timeout_s=300)[0]
    assert res["variant"] == layout.variant and res["remote_peers"] == layout.remote_peers, res
    assert res["mask"] == [0] + [1] * (R - 1), res
    assert res["count_ok"] and res["range_ok"] and res["combine_ok"], res
    assert res["dispatch_s"] < 30, res
    assert res["after_clean"] == [0] * R and res["after_update"] == [0, 1] + [0] * (R - 2), res


@gpus(1)
@pytest.mark.parametrize("num_ranks,ranks_per_node", [(2, 1), (4, 2)])
def test_low_latency_put_path_on_emulated_nodes(num_ranks, ranks_per_node, capsys):
    """EP_RT_RANKS_PER_NODE makes the ranks several nodes: peers on other nodes get NVSHMEM puts (staging, quiet,
    fence, NVSHMEM stores of the signals) instead of NVLink stores, and the whole LL suite must still match."""
    # (NVSHMEM_QP_DEPTH: DeepEP's rule for queue pairs, >= (T + 1) * 2, applies once peers are remote; T=1024 here)
    env = {"EP_RT_RANKS_PER_NODE": str(ranks_per_node), "NVSHMEM_QP_DEPTH": "4096"}
    results = run_ranks(workers.ll_suite, num_ranks, env=env, timeout_s=900)
    log_notes(capsys, results)
    problems = []
    for rank, res in enumerate(results):
        assert res["remote_peers"] == num_ranks - ranks_per_node, res["remote_peers"]
        assert len(res["cases"]) >= 20
        for name, checks, failures in res["cases"]:
            assert checks > 0, name
            problems += [f"rank {rank} {name}: {f}" for f in failures]
    assert not problems, "\n".join(problems[:40]) + f"\n(seed {results[0]['seed']})"
