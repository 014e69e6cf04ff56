"""Low-latency soak: thousands of LL rounds whose settings change every round, checked on the GPU without
host syncs between checks (so a fast rank can run calls ahead of a slow one, which is what exposed the
buffer-reuse race of issue 15).

Every round draws, from a seed shared by all ranks: dispatch and combine modes (sync / async / hook, or a
replay of a captured CUDA graph), bf16 or fp8 (round_scale, UE8M0), hidden 1024-7168, top-k 4-8, 32-288
experts, 0-128 tokens per rank (some rounds give a rank no tokens, some route every token of a rank to its own
experts only), LogFMT and zero-copy combines. Checks, accumulated on the GPU and read every `check_every`
rounds:
- the receive count of every local expert against a bincount of every rank's routing (regenerated here);
- the combined output against a local expectation: the expert outputs are the received rows themselves (cast
  back from fp8), so combined[t] = bf16(sum over valid k of w[t, k] * row(t)) in the kernels' order (f32
  multiply, then f32 add), which this rank computes from its own input alone. LogFMT combines are compared
  within DeepEP's calc_diff bound instead.
"""

from __future__ import annotations

import random
import time

import torch

from .. import reference
from . import memory
from .checker import expert_recv_counts

HIDDENS = (1024, 2048, 2560, 4096, 7168)
EXPERTS = (32, 64, 288)
MAX_TOKENS = 128
GRAPH_SHAPE = dict(n=96, hidden=2048, topk=8, experts=64)  # the captured graph's fixed shape


def soak_buffer_bytes(num_ranks: int) -> int:
    from .. import Buffer

    return max(
        Buffer.get_low_latency_rdma_size_hint(MAX_TOKENS, h, num_ranks, e)
        for h in HIDDENS
        for e in EXPERTS
        if e % num_ranks == 0
    )


FEATURES = ("modes", "graph", "zero_copy", "logfmt", "zero_tokens", "own_only", "fp8", "shapes")


def _round_settings(rng: random.Random, num_ranks: int, graph_ok: bool, features=FEATURES) -> dict:
    """One round's settings. The draws are the same whatever `features` holds (a feature left out is then
    overridden), so runs that differ only in features see the same sequence of shapes."""
    experts = [e for e in EXPERTS if e % num_ranks == 0]
    s = {
        "graph": graph_ok and rng.random() < 0.06,
        "dispatch_mode": rng.choice(("sync", "async", "hook")),
        "combine_mode": rng.choice(("sync", "async", "hook")),
        "use_fp8": rng.random() < 0.6,
        "round_scale": rng.random() < 0.4,
        "hidden": rng.choice(HIDDENS),
        "topk": rng.randint(4, 8),
        "experts": rng.choice(experts),
        "tokens": [rng.randint(0, MAX_TOKENS) for _ in range(num_ranks)],
        "own_experts_only": [rng.random() < 0.1 for _ in range(num_ranks)],
        "use_logfmt": rng.random() < 0.12,
        "zero_copy": rng.random() < 0.15,
    }
    if rng.random() < 0.3:  # a rank with no tokens at all
        s["tokens"][rng.randrange(num_ranks)] = 0
    s["use_ue8m0"] = s["use_fp8"] and s["round_scale"] and s["hidden"] % 512 == 0 and rng.random() < 0.5
    if s["use_logfmt"]:
        s["zero_copy"] = False
    if "modes" not in features:
        s["dispatch_mode"] = s["combine_mode"] = "sync"
    if "graph" not in features:
        s["graph"] = False
    if "zero_copy" not in features:
        s["zero_copy"] = False
    if "logfmt" not in features:
        s["use_logfmt"] = False
    if "zero_tokens" not in features:
        s["tokens"] = [max(t, 1) for t in s["tokens"]]
    if "own_only" not in features:
        s["own_experts_only"] = [False] * num_ranks
    if "fp8" not in features:
        s["use_fp8"] = s["use_ue8m0"] = False
    if "shapes" not in features:
        s["hidden"], s["experts"], s["topk"] = HIDDENS[0], experts[0], 8
    return s


def _routing(seed: int, rank: int, n: int, num_experts: int, topk: int, num_ranks: int, own_only: bool, device):
    if n == 0:
        return torch.empty(0, topk, dtype=torch.int64, device=device)
    g = torch.Generator(device=device).manual_seed(seed * 131 + rank)
    scores = torch.rand(n, num_experts, generator=g, device=device)
    if own_only:  # every token of this rank stays on this rank: its peers get nothing from it
        L = num_experts // num_ranks
        keep = torch.zeros(num_experts, dtype=torch.bool, device=device)
        keep[rank * L : (rank + 1) * L] = True
        scores = torch.where(keep, scores, torch.full_like(scores, -1.0))
    top = torch.topk(scores, topk, dim=1)
    holes = (torch.rand(top.indices.shape, generator=g, device=device) < 0.15) | (top.values < 0)
    return torch.where(holes, torch.full_like(top.indices, -1), top.indices)


def _calc_diff(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """selfcheck_ll.calc_diff as a GPU scalar (no host sync)."""
    x, y = x.double(), y.double()
    den = (x * x + y * y).sum()
    return torch.where(den > 0, 1 - 2 * (x * y).sum() / den.clamp(min=1e-300), torch.zeros_like(den))


def _inputs(seed: int, rank: int, n: int, hidden: int, topk: int, device):
    g = torch.Generator(device=device).manual_seed(seed * 131 + 7919 + rank)
    x = torch.randn(n, hidden, generator=g, device=device).to(torch.bfloat16)
    w = torch.rand(n, topk, generator=g, device=device)
    return x, w


def _as_rows(recv, use_fp8: bool) -> torch.Tensor:
    """The received rows as bf16 [L, R*T, H] (the soak's expert outputs)."""
    if not use_fp8:
        return recv
    x, scales = recv
    L, RT, H = x.shape
    return reference.per_token_cast_back(x.reshape(L * RT, H), scales.reshape(L * RT, -1)).reshape(L, RT, H)


def _expected_combined(x, idx, w, use_fp8, round_scale, use_ue8m0):
    """bf16(sum over valid k of w[:, k] * row), row = x as it arrives at the experts."""
    row = x
    if use_fp8 and x.size(0):
        row = reference.per_token_cast_back(*reference.per_token_cast_to_fp8(x, round_scale, use_ue8m0))
    row = row.float()
    acc = torch.zeros_like(row)
    for k in range(idx.size(1)):
        term = w[:, k : k + 1] * row
        acc = torch.where((idx[:, k : k + 1] >= 0), acc + term, acc)
    return acc.to(torch.bfloat16)


class _Tally:
    """Mismatch counts per round and kind (counts, combined, LogFMT combined), kept on the GPU: no sync per
    round; read every check_every rounds."""

    def __init__(self, rounds: int, device):
        self.per_round = torch.zeros(rounds, 3, dtype=torch.int64, device=device)
        self.round = 0
        self.checks = 0

    def add(self, i: int, mismatches: torch.Tensor) -> None:
        self.per_round[self.round, i] += mismatches.to(torch.int64)
        self.checks += 1

    @property
    def bad(self) -> torch.Tensor:
        return self.per_round.sum(0)


def problems(results: list, rounds: int, variant: str | None = None) -> list[str]:
    """What failed on any rank of ll_soak's results (empty: the soak passed): rounds not all run, mismatches, or
    memory that grew (memory.leaks); with `variant`, a rank that loaded another LL cubin variant."""
    out = []
    for rank, res in enumerate(results):
        if variant is not None and res["variant"] != variant:
            out.append(f"rank {rank}: ran the {res['variant']!r} LL cubin, not {variant!r}")
        if res["rounds"] != rounds:
            out.append(f"rank {rank}: {res['rounds']} of {rounds} rounds ran")
        if any(res["bad"]) or res["first_bad"] is not None:
            out.append(
                f"rank {rank}: mismatches {res['bad']} (counts, combined, LogFMT combined); first: {res['first_bad']}"
            )
        out += [f"rank {rank}: leak: {leak}" for leak in res["leaks"]]
    return out


def ll_soak(rank: int, num_ranks: int, rounds: int, seed: int, check_every: int = 50, features=FEATURES) -> dict:
    import torch.distributed as dist

    from .. import Buffer

    device = torch.device("cuda", torch.cuda.current_device())
    buf = Buffer(
        dist.group.WORLD,
        0,
        soak_buffer_bytes(num_ranks),
        low_latency_mode=True,
        num_qps_per_rank=4,
        explicitly_destroy=True,
    )
    tally = _Tally(rounds, device)
    graph = _capture_graph(buf, rank, num_ranks, seed, device) if "graph" in features else None
    rng = random.Random(seed)
    counts = {"graph": 0, "hook": 0, "async": 0, "sync": 0, "zero_tokens": 0, "logfmt": 0, "fp8": 0}
    settings, samples = [], []
    first_bad = None
    t0 = time.monotonic()
    for rnd in range(rounds):
        s = _round_settings(rng, num_ranks, graph is not None, features)
        settings.append(s)
        tally.round = rnd
        rs = seed * 100003 + rnd
        if s["graph"]:
            graph.replay_checked(rs, tally)
            counts["graph"] += 1
        else:
            _eager_round(buf, s, rs, rank, num_ranks, device, tally)
            counts[s["dispatch_mode"]] += 1
            counts["zero_tokens"] += s["tokens"][rank] == 0
            counts["logfmt"] += s["use_logfmt"]
            counts["fp8"] += s["use_fp8"]
        if rnd % 100 == 0 or rnd + 1 == rounds:
            samples.append(memory.sample(rnd))
        if (rnd + 1) % check_every == 0 or rnd + 1 == rounds:
            bad = tally.bad.tolist()  # the one sync of this batch of rounds
            buf.raise_if_failed()
            if any(bad):
                rows = tally.per_round[: rnd + 1].sum(1).nonzero().flatten().tolist()
                first_bad = {
                    "rounds": rows[:5],
                    "bad": [tally.per_round[r].tolist() for r in rows[:5]],
                    "settings": [settings[r] for r in rows[:5]],
                }
                break
    torch.cuda.synchronize()
    buf.raise_if_failed()
    elapsed = time.monotonic() - t0
    variant = buf.low_latency_variant
    buf.destroy()
    return {
        "variant": variant,
        "rounds": rnd + 1,
        "checks": tally.checks,
        "bad": tally.bad.tolist(),
        "first_bad": first_bad,
        "counts": counts,
        "seconds": elapsed,
        "leaks": memory.leaks(samples),
        "samples": [vars(x) for x in samples[:: max(1, len(samples) // 8)]],
    }


def _eager_round(buf, s, rs, rank, R, device, tally) -> None:
    E, H, K, T = s["experts"], s["hidden"], s["topk"], MAX_TOKENS
    L = E // R
    idxs = [_routing(rs, r, s["tokens"][r], E, K, R, s["own_experts_only"][r], device) for r in range(R)]
    idx = idxs[rank]
    x, w = _inputs(rs, rank, idx.size(0), H, idx.size(1), device)
    recv, count, handle, event, hook = buf.low_latency_dispatch(
        x,
        idx,
        T,
        E,
        use_fp8=s["use_fp8"],
        round_scale=s["round_scale"],
        use_ue8m0=s["use_ue8m0"],
        async_finish=s["dispatch_mode"] == "async",
        return_recv_hook=s["dispatch_mode"] == "hook",
    )
    if hook is not None:
        hook()
    if s["dispatch_mode"] == "async":
        event.current_stream_wait()
    tally.add(0, (count.to(torch.int64) != expert_recv_counts(idxs, rank, L, device)).sum())

    rows = _as_rows(recv, s["use_fp8"])
    if s["zero_copy"]:
        buf.get_next_low_latency_combine_buffer(handle).copy_(rows)
    combined, event, hook = buf.low_latency_combine(
        rows,
        idx,
        w,
        handle,
        use_logfmt=s["use_logfmt"],
        zero_copy=s["zero_copy"],
        async_finish=s["combine_mode"] == "async",
        return_recv_hook=s["combine_mode"] == "hook",
    )
    if hook is not None:
        hook()
    if s["combine_mode"] == "async":
        event.current_stream_wait()
    expect = _expected_combined(x, idx, w, s["use_fp8"], s["round_scale"], s["use_ue8m0"])
    if s["use_logfmt"]:
        # LogFMT is lossy by design: DeepEP's calc_diff bound for its LL combine test.
        tally.add(2, (_calc_diff(combined, expect) > 1e-5).to(torch.int64))
    else:
        tally.add(1, (combined.view(torch.int16) != expect.view(torch.int16)).sum())


def _capture_graph(buf, rank, R, seed, device):
    g = GRAPH_SHAPE
    if g["experts"] % R:
        return None
    return _GraphRound(buf, rank, R, device, **g)


class _GraphRound:
    """dispatch (fp8) + cast back + combine captured once; each replay takes new routing, data and weights."""

    def __init__(self, buf, rank, R, device, n, hidden, topk, experts):
        self.rank, self.R, self.device, self.E, self.K = rank, R, device, experts, topk
        self.x = torch.zeros(n, hidden, dtype=torch.bfloat16, device=device)
        self.idx = torch.full((n, topk), -1, dtype=torch.int64, device=device)
        self.w = torch.zeros(n, topk, dtype=torch.float32, device=device)
        self.n = n
        for _ in range(2):  # warm up both buffers
            self._body(buf)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.count, self.combined = self._body(buf)
        torch.cuda.synchronize()

    def _body(self, buf):
        recv, count, handle, _, _ = buf.low_latency_dispatch(self.x, self.idx, MAX_TOKENS, self.E)
        combined, _, _ = buf.low_latency_combine(_as_rows(recv, True), self.idx, self.w, handle)
        return count, combined

    def replay_checked(self, rs, tally) -> None:
        R, L = self.R, self.E // self.R
        idxs = [_routing(rs, r, self.n, self.E, self.K, R, False, self.device) for r in range(R)]
        x, w = _inputs(rs, self.rank, self.n, self.x.size(1), self.K, self.device)
        self.x.copy_(x)
        self.idx.copy_(idxs[self.rank])
        self.w.copy_(w)
        self.graph.replay()
        tally.add(0, (self.count.to(torch.int64) != expert_recv_counts(idxs, self.rank, L, self.device)).sum())
        expect = _expected_combined(x, idxs[self.rank], w, True, False, False)
        tally.add(1, (self.combined.view(torch.int16) != expect.view(torch.int16)).sum())
