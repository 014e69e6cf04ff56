"""Megatron-Core as a client, unchanged: its fused_dispatch / fused_combine (megatron/core/transformer/moe/
fused_a2a.py, which imports deep_ep) run forward and backward on ep_rt through the deep_ep alias, on 2 ranks (which
may share one GPU), with and without async_finish + allocate_on_comm_stream. Outputs and gradients are compared
with an expectation computed here in plain torch from the inputs alone (no ep_rt, no reference module): the
received rows in DeepEP's order, the per-expert counts, the combined sum, and the gradients of the loss
sum(combined * g) with respect to x and the routing probabilities.

Needs megatron-core (pip install '.[megatron]'; wheels for an offline machine: see the README)."""

import importlib.util
import random

import pytest
import torch

from ep_rt.testing.spawn import run_ranks

from . import megatron_worker as mw
from .conftest import gpus

R = 2
L = mw.E // R

needs_megatron = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core is not installed (pip install '.[megatron]')",
)


def tensor(p):
    return torch.tensor(p["values"], dtype=getattr(torch, p["dtype"].split(".")[1]))


def expectation(seed):
    """What every rank should return, from the inputs alone (plain torch, CPU, f32 sums in rank order)."""
    inputs = [mw.make_inputs(seed, r) for r in range(R)]
    want = [{} for _ in range(R)]
    rows = []  # rows[me] = [(source rank, token)] in DeepEP's order: by source rank, then by token
    for me in range(R):
        order, rx, ri, rp = [], [], [], []
        for s, (x, idx, probs, _) in enumerate(inputs):
            local = (idx >= me * L) & (idx < (me + 1) * L)
            for t in range(mw.N):
                if local[t].any():
                    order.append((s, t))
                    rx.append(x[t])
                    ri.append(torch.where(local[t], idx[t] - me * L, torch.full_like(idx[t], -1)))
                    rp.append(torch.where(local[t], probs[t], torch.zeros_like(probs[t])))
        rows.append(order)
        w = want[me]
        w["recv_x"], w["recv_idx"], w["recv_probs"] = torch.stack(rx), torch.stack(ri), torch.stack(rp)
        counts = torch.zeros(L, dtype=torch.int64)
        for _, idx, _, _ in inputs:
            for l in range(L):
                counts[l] += int((idx == me * L + l).sum())
        w["tokens_per_expert"] = counts
        w["y"] = mw.expert(w["recv_x"], w["recv_idx"], w["recv_probs"])
    for s, (x, idx, probs, g) in enumerate(inputs):
        gb = g.to(torch.bfloat16).float()  # combined.float()'s backward hands combine a bf16 gradient
        combined = torch.zeros(mw.N, mw.H)
        grad_x = torch.zeros(mw.N, mw.H)
        grad_probs = torch.zeros(mw.N, mw.K)
        for r in range(R):  # ranks in ascending order, as the combine sums
            for j, (src, t) in enumerate(rows[r]):
                if src != s:
                    continue
                w = want[r]
                combined[t] += w["y"][j].float()
                share = (w["recv_probs"][j] * (w["recv_idx"][j] >= 0)).sum()
                grad_x[t] += (gb[t] * (1.0 + share)).to(torch.bfloat16).float()
                local = w["recv_idx"][j] >= 0
                grad_probs[t] += torch.where(local, (gb[t] * w["recv_x"][j].float()).sum(), torch.zeros(()))
        want[s]["combined"] = combined.to(torch.bfloat16)
        want[s]["grad_x"] = grad_x.to(torch.bfloat16)
        want[s]["grad_probs"] = grad_probs
    return want


@needs_megatron
@gpus(1)
def test_megatron_fused_dispatch_combine_forward_backward():
    seed = random.randrange(1 << 20)
    results = run_ranks(mw.megatron_rank, R, args=(seed, (False, True)), timeout_s=900)
    want = expectation(seed)
    for me, res in enumerate(results):
        for async_finish, got in res.items():
            where = f"rank {me}, async_finish={async_finish}, seed {seed}"
            g = {k: tensor(v) for k, v in got.items()}
            w = want[me]
            for key in ("recv_x", "recv_idx", "recv_probs", "tokens_per_expert"):  # copies: exact
                assert g[key].dtype == w[key].dtype and torch.equal(g[key], w[key]), f"{key} ({where})"
            # Sums: the f32 order across ranks is fixed, but the share's sum over top-k and the gradient's sum over
            # hidden may add in another order on the GPU, so within bf16 / f32 rounding.
            torch.testing.assert_close(g["combined"], w["combined"], msg=f"combined ({where})")
            torch.testing.assert_close(g["grad_x"], w["grad_x"], msg=f"grad_x ({where})")
            torch.testing.assert_close(
                g["grad_probs"], w["grad_probs"], rtol=1e-4, atol=1e-3, msg=f"grad_probs ({where})"
            )
