"""High-throughput soak: thousands of intranode rounds whose shapes and options change every round, with memory
sampled (issue 15's reliability suite).

Every round draws, from a seed shared by the ranks: 0-512 tokens per rank (some rounds give a rank none), hidden
256-7168, top-k 1-8, 16-256 experts, bf16 or fp8, async / previous_event, num_worst_tokens, a cached dispatch,
a bias. Checked every round, cheaply and exactly:
- the per-expert receive counts against every rank's routing;
- the combine of the received rows themselves: each token's rows are its own row (cast back from fp8), so
  combined = bias first, then that row once per rank it reached, summed in f32 in rank order (the kernel's order);
- combined_topk_weights = the token's weights where its expert is valid (each is held by exactly one rank).
Every `full_every` rounds a whole selfcheck_ht case compares every output with the reference bit for bit.
"""

from __future__ import annotations

import random
import time

import torch

from .. import reference
from . import memory
from .checker import expert_recv_counts

HIDDENS = (256, 1024, 2048, 4096, 7168)
EXPERTS = (16, 64, 256)
MAX_TOKENS = 512


def _settings(rng: random.Random, R: int) -> dict:
    s = {
        "tokens": [rng.randint(0, MAX_TOKENS) for _ in range(R)],
        "hidden": rng.choice(HIDDENS),
        "topk": rng.randint(1, 8),
        "experts": rng.choice([e for e in EXPERTS if e % R == 0]),
        "fp8": rng.random() < 0.4,
        "async": rng.random() < 0.3,
        "previous_event": rng.random() < 0.3,
        "num_worst": rng.random() < 0.2,
        "cached": rng.random() < 0.3,
        "bias": rng.choice((None, "one", "pair")),
        "num_sms": rng.choice((8, 20, 24)),
    }
    if rng.random() < 0.2:
        s["tokens"][rng.randrange(R)] = 0
    return s


def _routing(seed: int, r: int, n: int, E: int, K: int, device):
    g = torch.Generator(device=device).manual_seed(seed * 977 + r)
    if n == 0:
        return torch.empty(0, K, dtype=torch.int64, device=device)
    idx = torch.topk(torch.rand(n, E, generator=g, device=device), K, dim=1).indices
    return torch.where(torch.rand(idx.shape, generator=g, device=device) < 0.1, torch.full_like(idx, -1), idx)


def _expected(row: torch.Tensor, reached: torch.Tensor, biases) -> torch.Tensor:
    """bias0, bias1, then the row once per rank reached (reached[t, r]), in f32 in that order, to bf16."""
    acc = torch.zeros_like(row, dtype=torch.float32)
    for b in biases:
        if b is not None:
            acc = acc + b.float()
    rf = row.float()
    for r in range(reached.size(1)):
        acc = torch.where(reached[:, r : r + 1], acc + rf, acc)
    return acc.to(torch.bfloat16)


def problems(results: list, rounds: int) -> list[str]:
    """What failed on any rank of ht_soak's results (empty: the soak passed): rounds not all run, mismatches in the
    cheap checks (counts, combined, weights), failures of the full reference cases (or none run), leaks."""
    out = []
    for rank, res in enumerate(results):
        if res["rounds"] != rounds:
            out.append(f"rank {rank}: {res['rounds']} of {rounds} rounds ran")
        if any(res["bad"]):
            out.append(f"rank {rank}: mismatches {res['bad']} (counts, combined, weights)")
        if res["full_failures"]:
            out.append(f"rank {rank}: full reference cases failed: {res['full_failures'][:3]}")
        if res["counts"]["full"] == 0:
            out.append(f"rank {rank}: no full reference case ran")
        out += [f"rank {rank}: leak: {leak}" for leak in res["leaks"]]
    return out


def ht_soak(rank: int, num_ranks: int, rounds: int, seed: int, full_every: int = 100, sample_every: int = 100) -> dict:
    import torch.distributed as dist

    from .. import Buffer, Config
    from . import selfcheck_ht

    dev = torch.device("cuda", torch.cuda.current_device())
    R = num_ranks
    nvl = Config(24).get_nvl_buffer_size_hint(max(HIDDENS) * 2, R, MAX_TOKENS)
    buf = Buffer(dist.group.WORLD, nvl, explicitly_destroy=True)
    rng = random.Random(seed)
    bad = torch.zeros(3, dtype=torch.int64, device=dev)  # counts, combined, weights
    full_failures, samples, counts = [], [], {"cached": 0, "num_worst": 0, "fp8": 0, "zero_tokens": 0, "full": 0}
    t0 = time.monotonic()
    for rnd in range(rounds):
        s = _settings(rng, R)
        rs = seed * 100019 + rnd
        E, H, K = s["experts"], s["hidden"], s["topk"]
        idxs = [_routing(rs, r, s["tokens"][r], E, K, dev) for r in range(R)]
        idx, n = idxs[rank], s["tokens"][rank]
        g = torch.Generator(device=dev).manual_seed(rs * 31 + rank)
        x = torch.randn(n, H, generator=g, device=dev).to(torch.bfloat16)
        w = torch.rand(n, K, generator=g, device=dev)
        row = x
        x_in = x
        if s["fp8"]:
            x_in = (
                reference.per_token_cast_to_fp8(x)
                if n
                else (x.to(torch.float8_e4m3fn), torch.empty(0, H // 128, device=dev))
            )
            row = reference.per_token_cast_back(*x_in) if n else x
        config = Config(s["num_sms"], 6, 256, 6, 128)
        prev = buf.capture() if s["previous_event"] else None
        per_rank, _, per_expert, in_rank, ev = buf.get_dispatch_layout(
            idx, E, previous_event=prev, async_finish=s["async"]
        )
        if s["async"]:
            ev.current_stream_wait()
        worst = sum(s["tokens"]) if s["num_worst"] else 0
        recv_x, recv_idx, recv_w, per_expert_list, handle, ev = buf.dispatch(
            x_in,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
            num_worst_tokens=worst,
            config=config,
            async_finish=s["async"],
        )
        if s["async"]:
            ev.current_stream_wait()
        if not worst:
            want = expert_recv_counts(idxs, rank, E // R, dev)
            bad[0] += (torch.tensor(per_expert_list, dtype=torch.int64, device=dev) != want).sum()
        if s["cached"]:
            recv_x, *_ = buf.dispatch(x_in, handle=handle, config=config)
        got_rows = reference.per_token_cast_back(*recv_x) if s["fp8"] and recv_x[0].size(0) else recv_x
        if s["fp8"] and not recv_x[0].size(0):
            got_rows = torch.empty(0, H, dtype=torch.bfloat16, device=dev)
        biases = [None, None]
        if s["bias"]:
            biases[0] = torch.randn(n, H, generator=g, device=dev).to(torch.bfloat16)
            if s["bias"] == "pair":
                biases[1] = torch.randn(n, H, generator=g, device=dev).to(torch.bfloat16)
        bias_arg = tuple(biases) if s["bias"] == "pair" else biases[0]
        combined, combined_w, ev = buf.combine(
            got_rows.contiguous(), handle, topk_weights=recv_w, bias=bias_arg, config=config, async_finish=s["async"]
        )
        if s["async"]:
            ev.current_stream_wait()
        bad[1] += (combined.view(torch.int16) != _expected(row, in_rank, biases).view(torch.int16)).sum()
        bad[2] += (
            combined_w.view(torch.int32) != torch.where(idx >= 0, w, torch.zeros_like(w)).view(torch.int32)
        ).sum()
        for key in ("cached", "num_worst", "fp8"):
            counts[key] += bool(s[key])
        counts["zero_tokens"] += n == 0
        if (rnd + 1) % full_every == 0:
            chk = selfcheck_ht.run_case(
                buf,
                selfcheck_ht.Case(
                    "soak sample",
                    num_tokens=256,
                    hidden=H,
                    num_experts=E,
                    num_topk=K,
                    dtype="fp8" if s["fp8"] else "bf16",
                ),
                rs,
            )
            full_failures += chk.failures
            counts["full"] += 1
        if rnd % sample_every == 0 or rnd + 1 == rounds:
            samples.append(memory.sample(rnd))
    torch.cuda.synchronize()
    buf.raise_if_failed()
    elapsed = time.monotonic() - t0
    buf.destroy()
    return {
        "rounds": rounds,
        "bad": bad.tolist(),
        "full_failures": full_failures[:10],
        "counts": counts,
        "leaks": memory.leaks(samples),
        "samples": [vars(x) for x in samples[:: max(1, len(samples) // 8)]],
        "seconds": elapsed,
    }
