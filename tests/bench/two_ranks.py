"""The two-process harness of the pytest-benchmark cases: the test process is rank 0 (GPU 0) and times calls;
a spawned peer is rank 1 (GPU 1) and makes the same calls, told which case comes next over the process group."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ep_rt.testing.spawn import free_port


def _init(rank, port):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)


def _peer(port, setup, make_call, calls_per_case):
    _init(1, port)
    buf, state = setup(1)
    while True:
        msg = [None]
        dist.broadcast_object_list(msg, src=0)
        if msg[0] == "done":
            break
        fn = make_call(buf, msg[0], state)
        for _ in range(calls_per_case):
            fn()
            torch.cuda.synchronize()
    buf.destroy()
    dist.destroy_process_group()


def pair(setup, make_call, calls_per_case):
    """Generator for a module fixture: yields rank 0's (buffer, state) from setup(rank), with the peer running
    make_call(buffer, case, state) calls_per_case times per case that rank 0 announces with announce(case).
    setup and make_call must be module-level functions (the peer is spawned)."""
    port = free_port()
    peer = mp.get_context("spawn").Process(target=_peer, args=(port, setup, make_call, calls_per_case), daemon=True)
    peer.start()
    _init(0, port)
    buf, state = setup(0)
    yield buf, state
    dist.broadcast_object_list(["done"], src=0)
    buf.destroy()
    dist.destroy_process_group()
    peer.join(timeout=60)


def announce(case: str) -> None:
    dist.broadcast_object_list([case], src=0)


def timed_ht_kernels(benchmark, buf, fn, rounds: int, warmup: int) -> dict:
    """pytest-benchmark rounds of fn() on rank 0 (L2 flushed before each, synchronised after), with the HT op's
    kernels timed by CUDA events (ep_rt.testing.bench.KernelTimer): {kernel name: [us per round, warm-up first]}."""
    from ep_rt.testing.bench import KernelTimer

    flush = torch.empty(256 << 20, dtype=torch.uint8, device=buf.device)
    timer = KernelTimer()

    def setup():
        flush.zero_()
        torch.cuda.synchronize()

    def call():
        fn()
        torch.cuda.synchronize()

    buf._ht.timer = timer
    try:
        benchmark.pedantic(call, setup=setup, rounds=rounds, warmup_rounds=warmup, iterations=1)
    finally:
        buf._ht.timer = None
    return timer.collect()
