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


@gpus(1)
def test_the_fast_current_stream_is_torchs_current_stream():
    """ep_rt.events.current_stream (the hot calls' way to the current stream) names the stream torch names: the
    default one, a side stream entered with torch.cuda.stream, and back; through torch's C calls, not the fallback."""
    import torch

    from ep_rt import events

    assert events._stream_of_device is not None  # a CUDA build of torch has the fast way
    side = torch.cuda.Stream()
    for ctx in (None, side, None):
        with torch.cuda.stream(ctx) if ctx is not None else torch.cuda.stream(torch.cuda.current_stream()):
            got, want = events.current_stream(), torch.cuda.current_stream()
            assert got == want and got.cuda_stream == want.cuda_stream and got.device == want.device
    assert events.current_stream() is events.current_stream()
