"""EP_RT_TOPK_IDX_BITS=32 and 64 end to end: layout, dispatch (recv_topk_idx in ep_rt.topk_idx_t, num_worst_tokens
padding), cached dispatch, combine, graph replays and LL dispatch / combine, with int64 and int32 topk_idx inputs,
all against the reference. Two ranks, which may share one GPU."""

import pytest

from ep_rt.testing.spawn import run_ranks

from . import workers
from .conftest import gpus


@gpus(1)
@pytest.mark.parametrize("bits", ["32", "64"])
def test_topk_idx_bits(monkeypatch, bits):
    monkeypatch.setenv("EP_RT_TOPK_IDX_BITS", bits)  # the spawned ranks inherit it and read it at import
    results = run_ranks(workers.topk_bits, 2, timeout_s=900)
    problems = []
    for rank, res in enumerate(results):
        assert res["topk_idx_t"] == f"torch.int{bits}", res["topk_idx_t"]
        names = [name for name, _, _ in res["cases"]]
        assert len(names) == len(workers.TOPK_BITS_HT_CASES) + 1 + len(workers.TOPK_BITS_LL_CASES), names
        for name, checks, failures in res["cases"]:
            assert checks > 0, name
            problems += [f"rank {rank} {name}: {f}" for f in failures]
    assert not problems, "\n".join(problems[:40])
