"""Multi-rank GPU tests: Buffer, peer mapping, barrier, create/destroy cycles, timeouts, capacity errors, calls in
rounds, and more ranks than GPUs. (The dispatch/combine suite against the reference, both cubin variants, is
test_intranode_cases_gpu.py: one test per case.)"""

import pytest

from ep_rt.testing.spawn import run_ranks
from torch.cuda import device_count

from . import workers
from .conftest import gpus


def _report(results):
    lines = []
    for rank, res in enumerate(results):
        for name, checks, failures in res["cases"]:
            for f in failures:
                lines.append(f"rank {rank} [{res['variant']}] {name}: {f}")
    return lines


@pytest.mark.smoke
@gpus(1)
def test_buffer_construction_peer_mapping_and_barrier():
    results = run_ranks(workers.buffer_basics, 2, timeout_s=300)
    assert all(all(r) for r in results)


@gpus(1)
def test_twenty_create_destroy_cycles_do_not_grow_memory():
    growth = run_ranks(workers.create_destroy, 2, timeout_s=600)
    assert all(g < 32 * (1 << 20) for g in growth), f"free memory shrank by {growth} bytes"


@gpus(1)
def test_missing_peer_raises_instead_of_hanging():
    results = run_ranks(workers.timeout, 2, timeout_s=300)
    messages = results[0]
    assert len(messages) == 3
    first, elapsed = messages[0]
    assert "rank 0" in first and "rank 1" in first and "notify" in first, first
    assert elapsed < 30, f"took {elapsed:.1f} s with a 3 s timeout"
    assert "rank 1" in messages[2][0]


@gpus(1)
def test_buffer_too_small_raises_on_every_rank_and_buffer_stays_usable():
    results = run_ranks(workers.too_small, 2, timeout_s=300)
    for message, rows in results:
        assert message is not None and "less than one round" in message and "num_nvl_bytes" in message, message
        assert rows > 0


@gpus(1)
@pytest.mark.parametrize("num_ranks", [2, 4])
def test_calls_larger_than_the_buffer_go_in_rounds(num_ranks):
    """Issue 22 item 1: calls of about 2, 4 and 10 times what the NVL buffer holds, skewed routing, cached dispatch,
    combine and a CUDA graph from such a call: bit-exact, each in more than one round."""
    results = run_ranks(workers.rounds_suite, num_ranks, timeout_s=600)
    for r in results:
        for name, rounds, checks, failures in r["cases"]:
            assert not failures, (r["seed"], name, failures[:5])
            assert checks > 0 and rounds > 1, (name, rounds, checks)
    print("rounds:", [(name, rounds) for name, rounds, _, _ in results[0]["cases"]])


@gpus(1)
def test_megatron_get_buffer_sizes_take_8192_and_16384_tokens_per_rank():
    """Issue 22 item 5: Megatron-Core's get_buffer sizes (DeepEP's, from the two-argument hints) and calls of 8192
    and 16384 tokens per rank: bit-exact, in rounds (2 ranks)."""
    results = run_ranks(workers.megatron_sizes, 2, timeout_s=600)
    for r in results:
        for name, rounds, checks, failures in r["cases"]:
            assert not failures, (r["seed"], name, failures[:5])
            assert checks > 0 and rounds > 1, (name, rounds, checks, r["num_nvl_bytes"])


SHARED_GPU_CASES = (*workers.ROUND_CASES, workers.GRAPH_CASE)  # (the rounds test's cases, and the graph case)


@pytest.mark.more_ranks
@gpus(1)
@pytest.mark.parametrize("num_ranks", [4, 8])
def test_more_ranks_than_gpus(num_ranks):
    results = run_ranks(
        workers.suite, num_ranks, args=(SHARED_GPU_CASES, False), num_gpus=min(2, device_count()), timeout_s=900
    )
    problems = _report(results)
    assert not problems, "\n".join(problems[:40]) + f"\n(seed {results[0]['seed']})"
