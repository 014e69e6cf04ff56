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


@gpus(1)
def test_the_driver_fence_orders_a_stream_after_another_eagerly_and_in_a_graph():
    """ep_rt.events.wait_stream (every call's two fences: cuEventRecord + cuStreamWaitEvent on a torch-made event):
    work on the waiter runs after what the waitee had queued, the event reused; and inside a CUDA-graph capture the
    fences fork a side stream off the capturing one and join it back (torch refuses a capture whose side stream never
    rejoins), and the replay orders them too."""
    import torch

    from ep_rt import events

    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    for value in (1.0, 2.0):  # the second round reuses the first's fence event
        with torch.cuda.stream(a):
            torch.cuda._sleep(100_000_000)  # ~50 ms of GPU clock: b would overtake it without the fence
            x.fill_(value)
        events.wait_stream(b, a)
        with torch.cuda.stream(b):
            y = x.clone()
        b.synchronize()
        assert bool((y == value).all()), (value, y[:4])
    assert len([k for k in events._fences if k[1] == a.cuda_stream]) == 1

    side, src = torch.cuda.Stream(), torch.zeros(1 << 20, device="cuda")
    out = torch.zeros_like(src)
    graph = torch.cuda.CUDAGraph()
    capture = torch.cuda.Stream()
    with torch.cuda.stream(capture), torch.cuda.graph(graph, stream=capture):
        torch.cuda._sleep(100_000_000)
        src.add_(1.0)
        events.wait_stream(side, capture)  # fork
        with torch.cuda.stream(side):
            torch.mul(src, 2.0, out=out)  # (no allocation inside the capture)
        events.wait_stream(capture, side)  # join
    for replay in range(1, 4):
        graph.replay()
        torch.cuda.synchronize()
        assert bool((out == 2.0 * replay).all()), (replay, out[:4])
