"""The internode high-throughput suite on emulated nodes (issue 11; EP_RT_RANKS_PER_NODE splits the ranks sharing
one GPU into nodes), each (layout, variant, case) its own test, bit-exact against ep_rt.reference.internode_* on
fresh random inputs: every case of ep_rt.testing.selfcheck_internode.internode_cases and the CUDA-graph replays on
2x2 and 4x1 (nodes x ranks), 8 ranks as 2x4 and 4x2 on a subset (EIGHT); each layout again under the aggressive
variant and under the chaos transport (issue 21: puts late, split and reordered, every operation counted); 16
ranks as 2x8 under both (INTERNODE_SIXTEEN_CASES, marked sixteen: the default steps leave them out). Nothing here
has run on a real network.

The ranks of one pool (layout and environment) are spawned once, at the pool's first case, and each keeps its
Buffer between cases (workers.internode_case); a case that raises makes every rank drop its Buffer. Node ids:
test_internode_case[<pool>-<case id>], e.g. [2x2-bf16_uniform] or [4x2-chaos-bias_pair]. Marks: internode (every
item); aggressive, chaos, eight_ranks, sixteen (those pools' items; tools/gpu_run.sh's steps internode_cases,
internode_variants, internode16_aggressive and internode16_chaos select by them). EP_RT_CASE_SEED=<seed> re-runs a
case with the seed its failure printed.
(The fault tests and the default variant on 2x8: test_internode_gpu.py.)"""

from dataclasses import dataclass

import pytest

from ep_rt.testing import selfcheck_internode as sci

from . import workers
from .conftest import (
    NodesPool,
    OnePoolAtATime,
    case_seed,
    case_timeout_s,
    check_case_results,
    gpus,
    pool_items,
    run_case,
    sixteen_rank_reference_device,
)


@dataclass(frozen=True)
class Pool(NodesPool):
    max_shape: tuple | None = None  # (hidden bytes, tokens) the Buffers are sized for; None: internode_buffer's


def _all(num_ranks, G):
    return tuple(c.name for c in sci.internode_cases(num_ranks, G)) + (workers.GRAPH_CASE,)


EIGHT = workers.INTERNODE_SIXTEEN_CASES + ("many channels (64 SMs)",)  # 2x8's cases and many channels
SIXTEEN = workers.INTERNODE_SIXTEEN_CASES + (workers.GRAPH_CASE,)
# Deadlines (EP_RT_TIMEOUT_S, EP_RT_NET_TIMEOUT_S) grow with the ranks sharing the GPU and under the chaos
# transport, which waits longer for each put.
FOUR, FOUR_CHAOS = dict(timeout_s=20, net_timeout_s=40), dict(timeout_s=30, net_timeout_s=90)
EIGHT_RANKS, EIGHT_CHAOS = dict(timeout_s=60, net_timeout_s=120), dict(timeout_s=60, net_timeout_s=180)
SIXTEEN_RANKS = dict(
    timeout_s=120,
    net_timeout_s=240,
    max_shape=workers.INTERNODE_SIXTEEN_SHAPE,
    reference_device=sixteen_rank_reference_device(),
)
SIXTEEN_CHAOS = dict(SIXTEEN_RANKS, net_timeout_s=360)

# In the order they run, one pool's ranks at a time: the default variant (step internode_cases), then the aggressive
# variant and the chaos transport on each layout (internode_variants; issue 21: every layout under both), then 2x8.
POOLS = {
    "2x2": Pool(4, 2, _all(4, 2), **FOUR),
    "4x1": Pool(4, 1, _all(4, 1), **FOUR),
    "2x4": Pool(8, 4, EIGHT, **EIGHT_RANKS),
    "4x2": Pool(8, 2, EIGHT, **EIGHT_RANKS),
    "2x2-aggressive": Pool(4, 2, _all(4, 2), **FOUR, aggressive=True),
    "2x2-chaos": Pool(4, 2, _all(4, 2), **FOUR_CHAOS, chaos=True),
    "4x1-aggressive": Pool(4, 1, _all(4, 1), **FOUR, aggressive=True),
    "4x1-chaos": Pool(4, 1, _all(4, 1), **FOUR_CHAOS, chaos=True),
    "2x4-aggressive": Pool(8, 4, EIGHT, **EIGHT_RANKS, aggressive=True),
    "2x4-chaos": Pool(8, 4, EIGHT, **EIGHT_CHAOS, chaos=True),
    "4x2-aggressive": Pool(8, 2, EIGHT, **EIGHT_RANKS, aggressive=True),
    "4x2-chaos": Pool(8, 2, EIGHT, **EIGHT_CHAOS, chaos=True),
    "2x8-aggressive": Pool(16, 8, SIXTEEN, **SIXTEEN_RANKS, aggressive=True),
    "2x8-chaos": Pool(16, 8, SIXTEEN, **SIXTEEN_CHAOS, chaos=True),
}
ITEMS = pool_items(POOLS)

pytestmark = [pytest.mark.internode, gpus(1)]


@pytest.fixture(scope="module")
def internode_pools():
    with OnePoolAtATime(POOLS, workers.INTERNODE_CASES_BUFFER) as pools:
        yield pools


@pytest.mark.parametrize("pool_name,case", ITEMS)
def test_internode_case(internode_pools, pool_name, case):
    spec = POOLS[pool_name]
    pool = internode_pools.get(pool_name)
    seed = case_seed()
    args = (spec.ranks_per_node, case, seed, spec.max_shape, spec.reference_device)
    timeout_s = case_timeout_s(spec.net_timeout_s)
    results = run_case(pool, workers.internode_case, workers.INTERNODE_CASES_BUFFER, *args, timeout_s=timeout_s)
    want = {"nodes": spec.num_ranks // spec.ranks_per_node, "aggressive": spec.aggressive, "chaos": spec.chaos}
    assert [{k: r[k] for k in want} for r in results] == [want] * spec.num_ranks, results
    check_case_results(results, f"[{pool_name}] {case}", seed)
