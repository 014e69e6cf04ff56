"""The low-latency suite on emulated nodes (issue 21; EP_RT_RANKS_PER_NODE splits the ranks sharing one GPU into
nodes, and a peer on another node gets NVSHMEM puts: staging, put-with-signals, count signals, credits), each
(layout, transport, case) its own test, against ep_rt.reference_ll as test_low_latency_cases_gpu.py (bit-exact;
LogFMT within its tolerance): every case of ep_rt.testing.selfcheck_ll.ll_cases with the CUDA-graph replays and a
round after clean_low_latency_buffer on 4x1 (nodes x ranks: every peer remote), 8 ranks as 2x4 and 4x2 on a subset
(EIGHT), 16 ranks as 2x8 on a smaller one (SIXTEEN, marked sixteen: the default steps leave them out); each over
P2P puts and through the chaos transport (EP_RT_CHAOS_TRANSPORT=1: puts late, split and reordered, every operation
counted). Nothing here has run on a real network. (2x1 and 2x2, the whole suite in one test each:
test_low_latency_gpu.py and test_chaos_transport_gpu.py; shrink mode and killed peers on emulated nodes:
test_low_latency_gpu.py and test_reliability_gpu.py.)

Pools as test_internode_cases_gpu.py's: the ranks of one pool (layout and transport) are spawned once, at the
pool's first case, and each keeps its Buffer, sized for the pool's cases, between cases (workers.ll_case); a case
that raises makes every rank drop its Buffer. Node ids: test_low_latency_on_nodes[<pool>-<case id>], e.g. [4x1-fp8]
or [2x4-chaos-cuda_graph_replays]. Marks: ll_nodes (every item); chaos, eight_ranks, sixteen (those pools' items;
tools/gpu_run.sh's steps ll_nodes, ll_nodes8, ll16 and ll16_chaos select by them). EP_RT_CASE_SEED=<seed> re-runs a
case with the seed its failure printed."""

import pytest

from ep_rt.testing import selfcheck_ll

from . import workers
from .conftest import LLNodesPool as Pool
from .conftest import OnePoolAtATime, gpus, pool_items, run_ll_nodes_case, sixteen_rank_reference_device

ALL = tuple(c.name for c in selfcheck_ll.ll_cases(4)) + (workers.LL_GRAPH_CASE, workers.LL_AFTER_CLEAN_CASE)
EIGHT, SIXTEEN = workers.LL_EIGHT_RANK_CASES, workers.LL_SIXTEEN_RANK_CASES
SIXTEEN_REFERENCE = sixteen_rank_reference_device()

# In the order they run, one pool's ranks at a time (EP_RT_TIMEOUT_S grows with the ranks sharing the GPU and under
# the chaos transport, which waits longer for each put).
POOLS = {
    "4x1": Pool(4, 1, ALL, timeout_s=30),
    "4x1-chaos": Pool(4, 1, ALL, timeout_s=60, chaos=True),
    "2x4": Pool(8, 4, EIGHT, timeout_s=60),
    "2x4-chaos": Pool(8, 4, EIGHT, timeout_s=90, chaos=True),
    "4x2": Pool(8, 2, EIGHT, timeout_s=60),
    "4x2-chaos": Pool(8, 2, EIGHT, timeout_s=90, chaos=True),
    "2x8": Pool(16, 8, SIXTEEN, timeout_s=120, case_deadline_s=420, reference_device=SIXTEEN_REFERENCE),
    "2x8-chaos": Pool(
        16, 8, SIXTEEN, timeout_s=180, chaos=True, case_deadline_s=420, reference_device=SIXTEEN_REFERENCE
    ),
}
# 2x8's case deadline is for the ranks' reference (each rank computes every rank's dispatch, per replay in the graph
# case), not for the kernels' waits, which keep timeout_s: on the GPU, before the combine reference was cut to the
# rank's own output, its graph case was still in the reference on every rank at the 180 s default (attempt
# 20261206T204437Z) and its fp8 case took 161 s.
ITEMS = pool_items(POOLS)

pytestmark = [pytest.mark.ll_nodes, gpus(1)]


@pytest.fixture(scope="module")
def ll_node_pools():
    with OnePoolAtATime(POOLS, workers.LL_CASES_BUFFER) as pools:
        yield pools


@pytest.mark.parametrize("pool_name,case", ITEMS)
def test_low_latency_on_nodes(ll_node_pools, pool_name, case, capsys):
    run_ll_nodes_case(ll_node_pools, pool_name, case, capsys)
