"""Issue 23 item 1 on a GPU: no device sync in any hot call, and bad expert ids reported by the kernels."""

from ep_rt.testing.spawn import run_ranks

from . import nosync_workers
from .conftest import gpus


@gpus(1)
def test_every_hot_call_runs_under_sync_debug_mode_error():
    """get_dispatch_layout, dispatch, cached dispatch, combine, a num_worst_tokens dispatch, LL dispatch and combine
    with torch.cuda.set_sync_debug_mode("error"), after a checked round of each mode (fresh random inputs)."""
    results = run_ranks(nosync_workers.hot_calls_without_a_sync, 2, timeout_s=600)
    for rank, res in enumerate(results):
        assert res["checks"] > 0 and not res["failures"], (rank, res["failures"][:5], res["seed"])
        assert not res["synced"], (rank, res["synced"])


@gpus(1)
def test_a_bad_id_on_one_rank_raises_there_and_every_rank_goes_on():
    results = run_ranks(nosync_workers.one_rank_with_a_bad_id, 2, timeout_s=600)
    assert results[0]["error"] and "dispatch (checking topk_idx): topk_idx holds expert id 32" in results[0]["error"]
    assert results[1]["error"] is None, results[1]
    for rank, res in enumerate(results):
        assert res["checks"] > 0 and not res["failures"], (rank, res)
