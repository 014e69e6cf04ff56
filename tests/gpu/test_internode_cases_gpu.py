"""The internode high-throughput suite on emulated nodes (issue 11; EP_RT_RANKS_PER_NODE splits the ranks sharing
one GPU into nodes), each (layout, case) its own test, bit-exact against ep_rt.reference.internode_* on fresh random
inputs: every case of ep_rt.testing.selfcheck_internode.internode_cases and the CUDA-graph replays on 2x2 and 4x1
(nodes x ranks), the same list under the aggressive variant and under the chaos transport (2x2), and 8 ranks as
2x4 and 4x2. Nothing here has run on a real network.

The ranks of one pool (layout and environment) are spawned once, at the pool's first case, and each keeps its
Buffer between cases (workers.internode_case); a case that raises makes every rank drop its Buffer. Node ids:
test_internode_case[<pool>-<case id>], e.g. [2x2-bf16_uniform] or [2x2-chaos-2_SMs]. Marks: internode (every
item); aggressive, chaos, eight_ranks (those pools' items). EP_RT_CASE_SEED=<seed> re-runs a case with the seed its
failure printed.
(The fault tests and the 16-process layout: test_internode_gpu.py.)"""

from dataclasses import dataclass

import pytest

from ep_rt.testing import selfcheck_internode as sci

from . import workers
from .conftest import case_ids, case_pool, case_seed, case_timeout_s, gpus, run_case


@dataclass(frozen=True)
class Pool:
    num_ranks: int
    ranks_per_node: int
    cases: tuple
    timeout_s: int = 20  # EP_RT_TIMEOUT_S in the ranks
    net_timeout_s: int = 40  # EP_RT_NET_TIMEOUT_S
    aggressive: bool = False
    chaos: bool = False

    def env(self) -> dict:
        return {
            "EP_RT_RANKS_PER_NODE": str(self.ranks_per_node),
            "EP_RT_TIMEOUT_S": str(self.timeout_s),
            "EP_RT_NET_TIMEOUT_S": str(self.net_timeout_s),
            "EP_RT_AGGRESSIVE_PTX": "1" if self.aggressive else "0",
            "EP_RT_CHAOS_TRANSPORT": "1" if self.chaos else "0",
        }


def _all(num_ranks, G):
    return tuple(c.name for c in sci.internode_cases(num_ranks, G)) + (workers.GRAPH_CASE,)


EIGHT = (
    "bf16 uniform",
    "fp8 row scales",
    "num_worst_tokens",
    "every token spans every node",
    "a node receives nothing",
    "bias pair",
    "many channels (64 SMs)",
)

# In the order they run: one pool's ranks at a time (the chaos transport waits longer for each put).
POOLS = {
    "2x2": Pool(4, 2, _all(4, 2)),
    "4x1": Pool(4, 1, _all(4, 1)),
    "2x2-aggressive": Pool(4, 2, _all(4, 2), aggressive=True),  # issue 21: the whole list under both
    "2x2-chaos": Pool(4, 2, _all(4, 2), timeout_s=30, net_timeout_s=90, chaos=True),
    "2x4": Pool(8, 4, EIGHT, timeout_s=60, net_timeout_s=120),
    "4x2": Pool(8, 2, EIGHT, timeout_s=60, net_timeout_s=120),
}
_MARKS = {
    "2x2-aggressive": [pytest.mark.aggressive],
    "2x2-chaos": [pytest.mark.chaos],
    "2x4": [pytest.mark.eight_ranks],
    "4x2": [pytest.mark.eight_ranks],
}
ITEMS = [
    pytest.param(name, case, id=f"{name}-{cid}", marks=_MARKS.get(name, []))
    for name, pool in POOLS.items()
    for case, cid in zip(pool.cases, case_ids(pool.cases))
]

pytestmark = [pytest.mark.internode, gpus(1)]


class _OnePoolAtATime:
    """The pool of the current item's name, started at its first item; the one before is closed first (the items
    come pool by pool, ITEMS' order), so one pool's ranks hold the GPU at a time."""

    def __init__(self):
        self.name, self.pool, self._cm = None, None, None

    def get(self, name):
        if name != self.name:
            self.close()
            spec = POOLS[name]
            self._cm = case_pool(
                spec.num_ranks, workers.INTERNODE_CASES_BUFFER, env=spec.env(), peer_timeout_s=spec.net_timeout_s
            )
            self.pool, self.name = self._cm.__enter__(), name
        return self.pool

    def close(self):
        cm, self._cm, self.name, self.pool = self._cm, None, None, None
        if cm is not None:
            cm.__exit__(None, None, None)


@pytest.fixture(scope="module")
def internode_pools():
    pools = _OnePoolAtATime()
    try:
        yield pools
    finally:
        pools.close()


@pytest.mark.parametrize("pool_name,case", ITEMS)
def test_internode_case(internode_pools, pool_name, case):
    spec = POOLS[pool_name]
    pool = internode_pools.get(pool_name)
    seed = case_seed()
    args = (spec.ranks_per_node, case, seed)
    timeout_s = case_timeout_s(spec.net_timeout_s)
    results = run_case(pool, workers.internode_case, workers.INTERNODE_CASES_BUFFER, *args, timeout_s=timeout_s)
    want = {"nodes": spec.num_ranks // spec.ranks_per_node, "aggressive": spec.aggressive, "chaos": spec.chaos}
    assert [{k: r[k] for k in want} for r in results] == [want] * spec.num_ranks, results
    problems = [f"rank {rank} [{pool_name}] {case}: {f}" for rank, r in enumerate(results) for f in r["failures"]]
    assert not problems, "\n".join(problems[:40]) + f"\n(EP_RT_CASE_SEED={seed})"
    assert all(r["checks"] > 0 for r in results), [r["checks"] for r in results]
