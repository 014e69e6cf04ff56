"""The LL soak's cheap per-round expectation (ep_rt.testing.soak_ll) against the independent reference_ll, on the CPU:
with the received rows as expert outputs, the combined output is a weighted sum of each token's own row."""

import random

import pytest
import torch

from ep_rt import reference_ll
from ep_rt.testing import soak_ll
from ep_rt.testing.checker import expert_recv_counts


@pytest.mark.parametrize(
    "use_fp8,round_scale,use_ue8m0",
    [(False, False, False), (True, False, False), (True, True, False), (True, True, True)],
)
@pytest.mark.parametrize("own_only", [False, True])
def test_expected_combined_matches_reference(use_fp8, round_scale, use_ue8m0, own_only):
    R, T, E, H, K = 2, 16, 32, 1024, 6
    cpu = torch.device("cpu")
    tokens = [0, 13] if own_only else [11, 16]
    idxs = [soak_ll._routing(5, r, tokens[r], E, K, R, own_only, cpu) for r in range(R)]
    inputs = [soak_ll._inputs(5, r, tokens[r], H, K, cpu) for r in range(R)]
    xs, ws = [x for x, _ in inputs], [w for _, w in inputs]
    want = reference_ll.low_latency_dispatch(
        xs, idxs, T, E, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0
    )
    rows = []
    for r in range(R):
        recv = (want[r]["packed_recv_x"], want[r]["packed_recv_x_scales"]) if use_fp8 else want[r]["packed_recv_x"]
        rows.append(soak_ll._as_rows(recv, use_fp8))
    ref = reference_ll.low_latency_combine(rows, idxs, ws, want)
    for r in range(R):
        got = soak_ll._expected_combined(xs[r], idxs[r], ws[r], use_fp8, round_scale, use_ue8m0)
        assert torch.equal(got.view(torch.int16), ref[r]["combined_x"].view(torch.int16))
        count = expert_recv_counts(idxs, r, E // R, cpu)
        assert torch.equal(count.to(torch.int32), want[r]["packed_recv_count"])


def test_own_experts_only_routing_stays_on_its_rank():
    idx = soak_ll._routing(3, 1, 50, 32, 8, 4, True, torch.device("cpu"))
    valid = idx[idx >= 0]
    assert valid.numel() > 0 and bool(((valid // 8) == 1).all())


def test_round_settings_cover_every_mode():
    rng = random.Random(1)
    seen = [soak_ll._round_settings(rng, 2, True) for _ in range(400)]
    for key in ("dispatch_mode", "combine_mode"):
        assert {s[key] for s in seen} == {"sync", "async", "hook"}
    assert any(s["graph"] for s in seen) and any(s["use_logfmt"] for s in seen)
    assert any(0 in s["tokens"] for s in seen) and any(s["use_ue8m0"] for s in seen)
    assert not any(s["use_logfmt"] and s["zero_copy"] for s in seen)
