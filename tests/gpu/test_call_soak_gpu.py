"""Days of calls (issue 25 item 1, ep_rt/testing/soak_calls.py): 1,000,000 LL calls and 100,000 HT calls on one
Buffer each (one rank by default, as a server runs one per GPU: EP_RT_SOAK_RANKS; on one GPU, 2 ranks time-slice it
and a round took 4.5 ms, so a million calls would take ~40 minutes, attempt 20261202T182315Z), modes and CUDA-graph replays cycling, every round bit-exact with the first
(which is checked against the reference), and host RSS, torch's and ep_rt's memory, open file descriptors and live
CUDA events flat after the warm-up (soak_calls.BOUNDS). Marked `soak`; step `soak_calls` of tools/gpu_run.sh.
EP_RT_SOAK_LL_CALLS / EP_RT_SOAK_HT_CALLS change the counts."""

import os

import pytest

from ep_rt.testing import soak_calls
from ep_rt.testing.spawn import run_ranks

from .conftest import gpus

RANKS = int(os.environ.get("EP_RT_SOAK_RANKS", "1"))


def _check(results, calls):
    for rank, res in enumerate(results):
        assert res["first_round"]["checks"] > 0 and not res["first_round"]["failures"], (rank, res["first_round"])
        assert not res["problems"], (rank, res["problems"], res["growth"])
        assert res["calls"] >= calls, (rank, res["calls"])
    print({k: results[0][k] for k in ("calls", "seconds", "growth")})


@pytest.mark.soak
@gpus(1)
def test_a_hundred_thousand_high_throughput_calls_leave_memory_fds_and_events_flat():
    calls = int(os.environ.get("EP_RT_SOAK_HT_CALLS", "100000"))
    seed = int.from_bytes(os.urandom(4), "little")
    _check(run_ranks(soak_calls.ht_call_soak, RANKS, args=(calls, seed), timeout_s=1800), calls)


@pytest.mark.soak
@gpus(1)
def test_a_million_low_latency_calls_leave_memory_fds_and_events_flat():
    calls = int(os.environ.get("EP_RT_SOAK_LL_CALLS", "1000000"))
    seed = int.from_bytes(os.urandom(4), "little")
    _check(run_ranks(soak_calls.ll_call_soak, RANKS, args=(calls, seed), timeout_s=1800), calls)
