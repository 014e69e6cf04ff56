"""Days of calls in minutes (issue 25 item 1): a million low-latency calls and a hundred thousand high-throughput
calls on one Buffer each, as a serving loop makes them: one shape, the same inputs every round, the modes cycling
(LL: plain, async_finish, receive hook, a CUDA-graph replay; HT: dispatch + combine, cached dispatch, a graph replay
of cached dispatch + combine). The first round is checked against ep_rt.reference (selfcheck_ll / selfcheck_ht on
the same shape); every later round's outputs are compared bit for bit with the first round's on the GPU (the count
of differing words accumulates there, read once per sample). Host RSS, torch's and ep_rt's memory, open file
descriptors and live CUDA events are sampled about 100 times; after the first fifth of the rounds none may grow past
BOUNDS (memory.leaks). A call is a dispatch (cached or not) or a combine: a round is two calls.

The soak measures no speed (ranks share the GPU); `seconds` says how long it took."""

from __future__ import annotations

import time

import torch

from . import memory, selfcheck_ht, selfcheck_ll

LL_CASE = selfcheck_ll.LLCase("call soak", max_tokens=64, num_tokens=64, hidden=2048, num_experts=48, holes=False)
HT_CASE = selfcheck_ht.Case("call soak", num_tokens=128, hidden=1024, num_topk=8, num_experts=48)
LL_MODES = ("plain", "async", "hook", "graph")
HT_MODES = ("dispatch+combine", "cached", "graph")

# Growth allowed after the warm-up, over the whole soak: nothing that is counted, no device memory ep_rt holds, and
# host memory within allocator noise (1 MiB would be one byte per call of a million).
BOUNDS = {
    "open_fds": 0,
    "cuda_events": 0,
    "ep_rt_device": 0,
    "ep_rt_host": 0,
    "torch_allocated": 1 << 20,
    "host_rss": 16 << 20,
}


def _differs(a, b) -> torch.Tensor:
    """How many 16-bit words of a and b differ (tensors of any dtype and equal shape), on the GPU."""
    return (a.contiguous().view(torch.int16) != b.contiguous().view(torch.int16)).sum()


def _samples_problems(samples, bad, rounds_done, rounds) -> list[str]:
    problems = memory.leaks(samples, limits=BOUNDS)
    if bad:
        problems.append(f"{bad} output words differed from the first round's")
    if rounds_done != rounds:
        problems.append(f"stopped after {rounds_done} of {rounds} rounds")
    return problems


def ll_call_soak(rank: int, num_ranks: int, calls: int, seed: int) -> dict:
    import torch.distributed as dist

    from .. import Buffer

    c = LL_CASE
    rdma = Buffer.get_low_latency_rdma_size_hint(c.max_tokens, c.hidden, num_ranks, c.num_experts)
    buf = Buffer(dist.group.WORLD, 0, rdma, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
    first = selfcheck_ll.run_ll_case(buf, c, seed)  # the shape against the reference
    dev = buf.device
    g = torch.Generator(device=dev).manual_seed(seed * 7 + rank)
    x = torch.randn(c.num_tokens, c.hidden, generator=g, device=dev).to(torch.bfloat16)
    idx = torch.topk(torch.rand(c.num_tokens, c.num_experts, generator=g, device=dev), c.num_topk).indices
    w = torch.rand(c.num_tokens, c.num_topk, generator=g, device=dev)

    def one_round(mode):
        recv, count, handle, event, hook = buf.low_latency_dispatch(
            x,
            idx,
            c.max_tokens,
            c.num_experts,
            use_fp8=False,
            async_finish=mode == "async",
            return_recv_hook=mode == "hook",
        )
        if hook is not None:
            hook()
        if event is not None and mode == "async":
            event.current_stream_wait()
        combined, event, hook = buf.low_latency_combine(
            recv, idx, w, handle, async_finish=mode == "async", return_recv_hook=mode == "hook"
        )
        if hook is not None:
            hook()
        if mode == "async":
            event.current_stream_wait()
        return count, combined

    return _loop(buf, calls // 2, LL_MODES, one_round, "plain", first, 2)


def ht_call_soak(rank: int, num_ranks: int, calls: int, seed: int) -> dict:
    import torch.distributed as dist

    from .. import Buffer, Config

    c = HT_CASE
    buf = Buffer(dist.group.WORLD, 64 << 20, explicitly_destroy=True)
    first = selfcheck_ht.run_case(buf, c, seed)  # the shape against the reference
    xs, idxs, ws = selfcheck_ht.make_inputs(c, seed + 1, num_ranks, buf.device)
    x, idx, w = xs[rank], idxs[rank], ws[rank]
    config = Config(c.num_sms, 6, 256, 6, 128)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, c.num_experts)
    layout = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, config=config, **layout)

    def one_round(mode):
        if mode == "dispatch+combine":
            rx, _, rw, _, h, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, config=config, **layout)
            combined, _, _ = buf.combine(rx, h, topk_weights=rw, config=config)
            return rx, combined
        cached, *_ = buf.dispatch(x, handle=handle, config=config)
        combined, _, _ = buf.combine(cached, handle, topk_weights=recv_w, config=config)
        return cached, combined

    return _loop(buf, calls // 2, HT_MODES, one_round, "cached", first, 2)


def _loop(buf, rounds, modes, one_round, graph_mode, first, calls_per_round) -> dict:
    """`rounds` rounds cycling `modes` ("graph": a replay of one_round(graph_mode) captured once), each round's
    outputs compared on the GPU with those of an eager one_round(graph_mode) before them."""
    want = one_round(graph_mode)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = one_round(graph_mode)
    bad = torch.zeros((), dtype=torch.int64, device=buf.device)
    every = max(rounds // 100, 1)
    samples, done, t0 = [], 0, time.monotonic()
    for rnd in range(rounds):
        mode = modes[rnd % len(modes)]
        if mode == "graph":
            graph.replay()
            got = graph_out
        else:
            got = one_round(mode)
        for a, b in zip(got, want):
            bad += _differs(a, b)
        done = rnd + 1
        if rnd % every == 0 or done == rounds:
            samples.append(memory.sample(rnd, counts=True))
            buf.raise_if_failed()
            if len(samples) % 10 == 1:  # progress, so a soak cut short by its limit still shows its rate
                print(f"[soak] {done}/{rounds} rounds after {time.monotonic() - t0:.1f} s", flush=True)
    torch.cuda.synchronize()
    seconds = time.monotonic() - t0
    buf.raise_if_failed()
    del graph
    buf.destroy()
    return {
        "calls": done * calls_per_round,
        "rounds": done,
        "first_round": {"checks": first.checks, "failures": first.failures[:5]},
        "problems": _samples_problems(samples, int(bad), done, rounds),
        "growth": memory.growth(samples),
        "seconds": seconds,
        "samples": [vars(s) for s in samples[:: max(1, len(samples) // 8)]],
    }
