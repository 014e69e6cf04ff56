"""The LL suite under the packed layout (EP_RT_LL_PACKED=1: the LL cubins' packed and packed_chaos variants,
docs/LL_PACKED_DESIGN.md), each (layout, transport, case) its own test, against ep_rt.reference_ll as
test_low_latency_nodes_gpu.py (bit-exact; LogFMT within its tolerance), on Buffers sized by the packed
get_low_latency_rdma_size_hint (workers.ll_buffer asks the hint in the ranks' environment, so every case also
checks that the packed size holds it): 1x2 (one node: NVLink stores only), 2x2 (NVLink stores and NVSHMEM puts)
over P2P, every case with the CUDA-graph replays and a round after clean_low_latency_buffer; 4x1 through the chaos
transport (puts late, split and reordered) on the cases that reach the put path's parts; 8 ranks as 2x4 and 4x2
(P2P) and 4x2 through the chaos transport, 16 as 2x8, on the node suite's 8- and 16-rank cases. The 4096-expert
case takes the receive's per-message base (more cells than one shared-memory scan holds). Nothing here has run on a
real network. Marks: ll_packed and ll_nodes (every item; the other steps leave ll_nodes out or name their files);
chaos, eight_ranks, sixteen for those pools. tools/gpu_run.sh's steps: ll_packed (2 and 4 ranks), ll_packed8,
ll_packed16."""

import pytest

from ep_rt.testing import selfcheck_ll

from . import workers
from .conftest import LLNodesPool, OnePoolAtATime, gpus, pool_items, run_ll_nodes_case, sixteen_rank_reference_device

ALL = tuple(c.name for c in selfcheck_ll.ll_cases(4)) + (workers.LL_GRAPH_CASE, workers.LL_AFTER_CLEAN_CASE)
PUT_PATH = (
    "bf16",
    "fp8",
    "int32 topk_idx, hooks, bf16",
    "zero_copy + out",
    "a rank with zero tokens",
    "no -1 entries, top-16",
    "4096 experts, stats",
    "LogFMT + hooks",
    workers.LL_GRAPH_CASE,
    workers.LL_AFTER_CLEAN_CASE,
)
assert set(PUT_PATH) <= set(ALL)

EIGHT, SIXTEEN = workers.LL_EIGHT_RANK_CASES, workers.LL_SIXTEEN_RANK_CASES
SIXTEEN_REFERENCE = sixteen_rank_reference_device()

# Timeouts and deadlines as test_low_latency_nodes_gpu.py's pools of the same sizes.
POOLS = {
    "1x2-packed": LLNodesPool(2, 2, ALL, timeout_s=30, packed=True),
    "2x2-packed": LLNodesPool(4, 2, ALL, timeout_s=30, packed=True),
    "4x1-packed-chaos": LLNodesPool(4, 1, PUT_PATH, timeout_s=60, chaos=True, packed=True),
    "2x4-packed": LLNodesPool(8, 4, EIGHT, timeout_s=60, packed=True),
    "4x2-packed": LLNodesPool(8, 2, EIGHT, timeout_s=60, packed=True),
    "4x2-packed-chaos": LLNodesPool(8, 2, EIGHT, timeout_s=90, chaos=True, packed=True),
    "2x8-packed": LLNodesPool(
        16, 8, SIXTEEN, timeout_s=120, packed=True, case_deadline_s=420, reference_device=SIXTEEN_REFERENCE
    ),
}
ITEMS = pool_items(POOLS)

pytestmark = [pytest.mark.ll_packed, pytest.mark.ll_nodes, gpus(1)]


@pytest.fixture(scope="module")
def ll_packed_pools():
    with OnePoolAtATime(POOLS, workers.LL_CASES_BUFFER) as pools:
        yield pools


@pytest.mark.parametrize("pool_name,case", ITEMS)
def test_low_latency_packed(ll_packed_pools, pool_name, case, capsys):
    run_ll_nodes_case(ll_packed_pools, pool_name, case, capsys)
