"""Where a hot call's host time goes, on a GPU with one rank (issue 23 items 2 and 6; step `host_profile` of
tools/gpu_run.sh).

tools/host_path_stub.py times the host code with CUDA stubbed on the CPU machine (Python and ctypes only). On one
H200 the whole calls were far above that (2026-12-02: an eager LL dispatch 118 us for a 22 us kernel, where the
stub counted ~27 us of Python), so the CUDA-side operations cost the difference. This runs the real calls and
reports, per call:

* host us: perf_counter around the call, the GPU idle before it (a sync every call), median of --calls;
* its split at the launches: the Python until the call's first kernel is launched (what delays the GPU's work), and
  after its last launch (what runs under the kernels: an eager call's kernel overlaps it), medians;
* the functions that took the most of it, under cProfile (tottime per call, builtins such as torch.empty,
  cuLaunchKernel and Event.record included: cProfile sees C functions called from Python);
* the primitives alone, timed in a loop: torch.empty, an event record, a stream wait on an event, a new event,
  torch.cuda.current_stream(), a ctypes memmove of 512 bytes (ep_rt's kernel launches are in the cProfile rows),
  and beside them ways of the LL path (_candidates: the fence as ep_rt makes it, as it made it through torch, and
  raw; one allocation for three outputs).

cProfile's own cost inflates every figure under it; the shares are what to read there, not the sums.

    python tools/host_profile.py [--calls N] [--top K] [--json FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import os
import pstats
import statistics
import sys
import time

# EP_RT_SRC: profile another tree's ep_rt (an A/B: tools/gpu_run.sh step ll_ab) with this harness.
sys.path.insert(0, os.environ.get("EP_RT_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _median_us(fn, n: int) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(xs)


def _host_us(call, n: int) -> float:
    import torch

    xs = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        xs.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(xs)


def _launch_split(call, n: int, driver) -> dict:
    """Medians of the host time until `call`'s first kernel launch returned and after its last one, with
    driver.launch / driver.launch_ex (every ep_rt kernel launch goes through one of them) wrapped to stamp the time
    as each returns; also the launches per call. The GPU idle before each call, as _host_us."""
    import torch

    stamps: list = []
    real = {name: getattr(driver, name) for name in ("launch", "launch_ex")}

    def stamped(fn):
        def launch(*args, **kwargs):
            out = fn(*args, **kwargs)
            stamps.append(time.perf_counter())
            return out

        return launch

    before, between, after, launches = [], [], [], []
    try:
        for name, fn in real.items():
            setattr(driver, name, stamped(fn))
        for _ in range(n):
            torch.cuda.synchronize()
            stamps.clear()
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            launches.append(len(stamps))
            if stamps:
                before.append((stamps[0] - t0) * 1e6)
                between.append((stamps[-1] - stamps[0]) * 1e6)
                after.append((t1 - stamps[-1]) * 1e6)
    finally:
        for name, fn in real.items():
            setattr(driver, name, fn)
    torch.cuda.synchronize()
    if not before:
        return {"launches": 0}
    return {
        "launches": statistics.median(launches),
        "to_first_launch_us": statistics.median(before),
        # an HT dispatch's host wait for the notify's counts and its allocations lie here
        "first_to_last_launch_us": statistics.median(between),
        "after_last_launch_us": statistics.median(after),
    }


def _top(call, n: int, k: int) -> list[dict]:
    """The k functions with the most own time per call under cProfile."""
    import torch

    prof = cProfile.Profile()
    for _ in range(n):
        torch.cuda.synchronize()
        prof.enable()
        call()
        prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        where = (
            name if file == "~" else f"{os.path.relpath(file) if file.startswith(os.getcwd()) else file}:{line}({name})"
        )
        rows.append({"function": where, "calls_per_call": nc / n, "own_us_per_call": tt / n * 1e6})
    rows.sort(key=lambda r: -r["own_us_per_call"])
    return rows[:k]


def _primitives(device, n: int) -> dict:
    import torch

    side = torch.cuda.Stream(device)
    ev = torch.cuda.Event()
    src, dst = ctypes.create_string_buffer(512), ctypes.create_string_buffer(512)
    out = {
        "torch.empty (128 x 7168 bf16)": _median_us(
            lambda: torch.empty(128, 7168, dtype=torch.bfloat16, device=device), n
        ),
        "torch.empty (int32, 16)": _median_us(lambda: torch.empty(16, dtype=torch.int32, device=device), n),
        "Event.record": _median_us(ev.record, n),
        "Stream.wait_event": _median_us(lambda: side.wait_event(ev), n),
        "torch.cuda.Event() (new)": _median_us(torch.cuda.Event, n),
        "torch.cuda.current_stream()": _median_us(torch.cuda.current_stream, n),
        "ctypes.memmove 512 B": _median_us(lambda: ctypes.memmove(dst, src, 512), n),
    }
    out.update(_candidates(device, side, n))
    torch.cuda.synchronize()
    return out


def _candidates(device, side, n: int) -> dict:
    """Ways of the LL host path timed beside each other: the stream-to-stream fence as ep_rt makes it
    (events.wait_stream: cuEventRecord + cuStreamWaitEvent on a reused torch-made event, since the twenty-fifth
    session), as it made it before (torch's Event.record + Stream.wait_event on a reused event) and through raw
    driver calls with no Python around them; the LL dispatch's three handle outputs as three torch.empty against one
    torch.empty and three typed views of it; the FP8 scales as one torch.empty_strided against an empty and a
    transpose."""
    import torch
    from cuda.bindings import driver as cu

    from ep_rt import events
    from ep_rt.runtime.driver import check

    cur = torch.cuda.current_stream(device)
    raw = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    s_cur, s_side = cu.CUstream(cur.cuda_stream), cu.CUstream(side.cuda_stream)
    torch_event = torch.cuda.Event()

    def driver_fence():
        cu.cuEventRecord(raw, s_cur)
        cu.cuStreamWaitEvent(s_side, raw, 0)

    def torch_fence():
        torch_event.record(cur)
        side.wait_event(torch_event)

    L, RT, R = 288, 128, 1

    def three_empty():
        torch.empty(L, RT, dtype=torch.int32, device=device)
        torch.empty(L, R, dtype=torch.int64, device=device)
        torch.empty(L, dtype=torch.int32, device=device)

    a, b = L * R * 8, L * R * 8 + L * RT * 4

    def one_empty_three_views():
        base = torch.empty(b + L * 4, dtype=torch.uint8, device=device)
        base[:a].view(torch.int64).view(L, R)
        base[a:b].view(torch.int32).view(L, RT)
        base[b:].view(torch.int32)

    cols = 7168 // 128

    def scales_transposed():  # the LL dispatch's FP8 scales until the twenty-sixth session
        torch.empty(L, cols, RT, dtype=torch.float32, device=device).transpose(1, 2)

    def scales_strided():  # since then: the same shape and strides in one call
        torch.empty_strided((L, RT, cols), (cols * RT, 1, RT), dtype=torch.float32, device=device)

    out = {
        "fence: events.wait_stream (ep_rt's, through the driver)": _median_us(lambda: events.wait_stream(side, cur), n),
        "fence: torch Event.record + Stream.wait_event (ep_rt's before)": _median_us(torch_fence, n),
        "fence: cuEventRecord + cuStreamWaitEvent (raw)": _median_us(driver_fence, n),
        "3 x torch.empty (LL handle outputs)": _median_us(three_empty, n),
        "1 x torch.empty + 3 typed views": _median_us(one_empty_three_views, n),
        "scales: torch.empty + transpose (ep_rt's before)": _median_us(scales_transposed, n),
        "scales: torch.empty_strided (ep_rt's)": _median_us(scales_strided, n),
    }
    torch.cuda.synchronize()
    check(cu.cuEventDestroy(raw), "cuEventDestroy")
    return out


def profile_rank(rank: int, num_ranks: int, calls: int, top: int) -> dict:
    import torch

    from ep_rt import Config
    from ep_rt.runtime import driver
    from ep_rt.testing import bench, bench_main

    dev = torch.device("cuda", torch.cuda.current_device())
    T, hidden, experts = bench_main.LL_SHAPE
    ll = bench_main.ll_buffer(num_ranks)  # the bench's Buffers and inputs: the same workloads as its tables
    x, idx, w, y, _ = bench.ll_inputs(T, hidden, 8, experts, num_ranks, dev, 1234 + rank)
    state = {}

    def ll_dispatch():
        state["h"] = ll.low_latency_dispatch(x, idx, T, experts)[2]

    def ll_combine():
        ll.low_latency_combine(y, idx, w, state["h"])

    # The benchmark's other LL shape (256 experts), whose host times in `python -m ep_rt bench` were 1.5-2x the
    # 288-expert ones (2026-12-06, not explained); then 288 again: if only 256 is slower, the shape is the cause,
    # if 288 is slower again too, the order is.
    E2 = 256
    x2, idx2, w2, y2, _ = bench.ll_inputs(T, hidden, 8, E2, num_ranks, dev, 4321 + rank)

    def ll_dispatch_256():
        state["h2"] = ll.low_latency_dispatch(x2, idx2, T, E2)[2]

    def ll_combine_256():
        ll.low_latency_combine(y2, idx2, w2, state["h2"])

    ll_dispatch()
    ll_dispatch_256()
    ht = bench_main.ht_buffer(num_ranks, 24)
    hx, hx_fp8, hidx, hw = bench.ht_inputs(4096, 7168, 8, 256, dev)[0]
    config = Config(24, 6, 256, 6, 128)
    per_rank, _, per_expert, in_rank, _ = ht.get_dispatch_layout(hidx, 256)
    args = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, config=config)

    def ht_layout():
        ht.get_dispatch_layout(hidx, 256)

    def ht_dispatch():
        out = ht.dispatch(hx, topk_idx=hidx, topk_weights=hw, **args)
        state["recv"], state["recv_w"], state["ht"] = out[0], out[2], out[4]

    def ht_dispatch_fp8():
        # issue 23: this call's host time was 256 us against 143 for BF16 (bench_cli, 20261206T204301Z), with only
        # ~3 us more Python under the CPU stub; the launch split says whether the rest is before the notify, in the
        # wait for its counts and the allocations, or after the dispatch's launch
        ht.dispatch(hx_fp8, topk_idx=hidx, topk_weights=hw, **args)

    def ht_cached():
        ht.dispatch(hx, handle=state["ht"], config=config)

    def ht_combine():
        ht.combine(state["recv"], state["ht"], topk_weights=state["recv_w"], config=config)

    ht_dispatch()
    result = {"calls": calls, "primitives": _primitives(dev, 2000), "ops": {}}
    for name, call in (
        ("LL dispatch FP8", ll_dispatch),
        ("LL combine BF16", ll_combine),
        ("LL dispatch FP8, 256 experts", ll_dispatch_256),
        ("LL combine BF16, 256 experts", ll_combine_256),
        ("LL dispatch FP8, again after 256", ll_dispatch),
        ("HT get_dispatch_layout", ht_layout),
        ("HT dispatch BF16", ht_dispatch),
        ("HT dispatch FP8", ht_dispatch_fp8),
        ("HT cached dispatch", ht_cached),
        ("HT combine BF16", ht_combine),
    ):
        for _ in range(20):
            call()
        result["ops"][name] = {
            "host_us": _host_us(call, calls),
            **_launch_split(call, calls, driver),
            "top": _top(call, max(calls // 4, 10), top),
        }
    torch.cuda.synchronize()
    ll.destroy()
    ht.destroy()
    return result


def format_result(res: dict) -> str:
    lines = ["primitives (median us):"]
    lines += [f"  {k:<34} {v:8.2f}" for k, v in res["primitives"].items()]
    for name, op in res["ops"].items():
        lines.append(f"{name}: host {op['host_us']:.1f} us (GPU idle before each call, median of {res['calls']})")
        if op.get("launches"):
            lines.append(
                f"  until the first launch {op['to_first_launch_us']:.1f} us, from it to the last "
                f"{op.get('first_to_last_launch_us', 0.0):.1f} us, after the last "
                f"{op['after_last_launch_us']:.1f} us ({op['launches']:g} launches a call)"
            )
        for r in op["top"]:
            lines.append(f"  {r['own_us_per_call']:8.2f} us  x{r['calls_per_call']:<5.1f} {r['function']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from ep_rt.testing.spawn import run_ranks

    res = run_ranks(profile_rank, 1, args=(args.calls, args.top), timeout_s=500)[0]
    print(format_result(res))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
