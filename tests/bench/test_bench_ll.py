"""pytest-benchmark cases for the LL reference workload (128 tokens, hidden 7168, top-8, 288 experts) on 2 GPUs.

The test process is rank 0 and times whole calls (Python + GPU, non-hook) with pytest-benchmark; a spawned peer
process is rank 1 and makes the same calls, told which case comes next over the process group. The GPU-side
numbers of ep_rt.bench.bench_ll (kernel time, send and receive halves; the profiler's kernel durations when it
sees the kernels), measured by both ranks together once per module, go into each benchmark's extra_info with
DeepEP-formula bandwidth.
Run with: python -m pytest -m bench tests/bench
"""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ep_rt import Buffer
from ep_rt.bench import bench_ll, ll_inputs
from ep_rt.spawn import free_port

pytestmark = [pytest.mark.bench,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs 2 GPUs")]

TOKENS, HIDDEN, TOPK, EXPERTS = 128, 7168, 8, 288
WARMUP, ROUNDS = 10, 50
ROW_NAMES = {"ll_dispatch_fp8": "LL dispatch FP8", "ll_combine_bf16": "LL combine BF16",
             "ll_combine_logfmt": "LL combine LogFMT"}


def _buffer():
    hint = Buffer.get_low_latency_rdma_size_hint(TOKENS, HIDDEN, 2, EXPERTS)
    return Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=EXPERTS // 2,
                  explicitly_destroy=True)


def _call(buf, case, inputs):
    """The per-call closure for a case, identical on both ranks."""
    x, idx, w, y, y_castable = inputs
    _, _, handle, _, _ = buf.low_latency_dispatch(x, idx, TOKENS, EXPERTS)
    if case == "ll_dispatch_fp8":
        return lambda: buf.low_latency_dispatch(x, idx, TOKENS, EXPERTS)
    logfmt = case == "ll_combine_logfmt"
    return lambda: buf.low_latency_combine(y_castable if logfmt else y, idx, w, handle, use_logfmt=logfmt)


def _peer(port):
    torch.cuda.set_device(1)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    buf = _buffer()
    bench_ll(buf, TOKENS, HIDDEN, TOPK, EXPERTS)
    inputs = ll_inputs(TOKENS, HIDDEN, TOPK, EXPERTS, 2, buf.device, seed=1)
    while True:
        msg = [None]
        dist.broadcast_object_list(msg, src=0)
        if msg[0] == "done":
            break
        fn = _call(buf, msg[0], inputs)
        for _ in range(WARMUP + ROUNDS):
            fn()
            torch.cuda.synchronize()
    buf.destroy()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def pair():
    port = free_port()
    peer = mp.get_context("spawn").Process(target=_peer, args=(port,), daemon=True)
    peer.start()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    buf = _buffer()
    gpu_rows = {row["name"]: row for row in bench_ll(buf, TOKENS, HIDDEN, TOPK, EXPERTS)}
    inputs = ll_inputs(TOKENS, HIDDEN, TOPK, EXPERTS, 2, buf.device, seed=0)
    yield buf, inputs, gpu_rows
    dist.broadcast_object_list(["done"], src=0)
    buf.destroy()
    dist.destroy_process_group()
    peer.join(timeout=60)


@pytest.mark.parametrize("case", list(ROW_NAMES))
def test_ll(benchmark, pair, case):
    buf, inputs, gpu_rows = pair
    dist.broadcast_object_list([case], src=0)
    fn = _call(buf, case, inputs)

    def call():
        fn()
        torch.cuda.synchronize()

    benchmark.pedantic(call, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    row = gpu_rows[ROW_NAMES[case]]
    gpu = row["profiler"] or row["events"]  # the profiler's kernel times when it saw the kernels
    benchmark.extra_info.update(kernel_us_median=round(gpu["kernel"], 1), gbps_deepep_formula=round(row["gbps"], 1),
                                send_half_us=round(gpu["send"], 1), recv_half_us=round(gpu["recv"], 1),
                                timed_by="profiler" if row["profiler"] else "cuda events",
                                events_kernel_us=round(row["events"]["kernel"], 1))
    assert gpu["kernel"] > 0 and gpu["send"] > 0 and gpu["recv"] > 0
