"""LL soak (issue 15): thousands of rounds with every LL mode and shape changing each round, ranks with no
tokens, checked on the GPU. Marked `soak` (not in CI, not in the default run): python -m pytest -m soak.
EP_RT_SOAK_ROUNDS sets the rounds (default 3000)."""

import os

import pytest

from ep_rt.testing import soak_ll
from ep_rt.testing.spawn import run_ranks

from .conftest import gpus


@pytest.mark.soak
@gpus(1)
@pytest.mark.parametrize("num_ranks", [2, 4])
def test_ll_soak_every_mode_and_zero_token_ranks(num_ranks):
    rounds = int(os.environ.get("EP_RT_SOAK_ROUNDS", "3000")) // (num_ranks // 2)
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_ranks(soak_ll.ll_soak, num_ranks, args=(rounds, seed), timeout_s=1500)
    for rank, res in enumerate(results):
        assert res["first_bad"] is None, f"rank {rank} (seed {seed}): {res}"
        assert res["rounds"] == rounds and res["checks"] >= 2 * rounds, res
        assert res["bad"] == [0, 0, 0], res
        assert not res["leaks"], res  # torch, device, NVML and host memory flat after the warm-up
        c = res["counts"]
        # The mix really happened (the settings come from the shared seed, so every rank saw the same mix).
        assert c["graph"] > 0 and c["hook"] > 0 and c["async"] > 0 and c["sync"] > 0, c
        assert c["logfmt"] > 0 and c["fp8"] > 0, c
    assert sum(r["counts"]["zero_tokens"] for r in results) > 0
