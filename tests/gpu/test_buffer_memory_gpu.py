"""ep_rt.buffer_memory against what a Buffer really allocates (issue 22 item 2): per rank, the device memory ep_rt
takes through the driver (the NVL buffer), torch's allocator (the ops' state) and NVSHMEM (the symmetric buffer)
while a Buffer is built, compared with the accounting that README's table of memory against DeepEP's rests on.
Two ranks sharing one GPU: one node in the low-latency mode; two emulated nodes with both modes in one Buffer."""

import pytest
import torch
import torch.distributed as dist

from ep_rt import Buffer, buffer_memory
from ep_rt.runtime import driver
from ep_rt.testing.spawn import run_ranks
from ep_rt.transport import ll_layout

from .conftest import gpus

MB = 1 << 20
_ROUNDING = 512  # torch's caching allocator rounds each allocation up to 512 bytes


def measure(rank, num_ranks, nvl_bytes, ll_experts, shrink):
    torch.cuda.synchronize()
    torch_before, driver_before = torch.cuda.memory_allocated(), driver.live_bytes()["device"]
    rdma = ll_layout.rdma_size_hint(32, 1024, num_ranks, ll_experts)
    buf = Buffer(
        dist.group.WORLD,
        nvl_bytes,
        rdma,
        low_latency_mode=True,
        num_qps_per_rank=ll_experts // num_ranks,
        explicitly_destroy=True,
        enable_shrink=shrink,
    )
    torch.cuda.synchronize()
    got = {
        "torch": torch.cuda.memory_allocated() - torch_before,
        "driver": driver.live_bytes()["device"] - driver_before,
        "symmetric": buf._shared_sym.nbytes if buf._shared_sym is not None else buf._ll.sym_bytes,
    }
    plan, nodes = buf._plan, buf.topology.num_nodes
    want = buffer_memory.ep_rt_device_bytes(plan, nvl_bytes, rdma, num_ranks, nodes, shrink)
    buf.destroy()
    return {"got": got, "want": want, "nodes": nodes, "shared": plan.shared_symmetric}


@gpus(1)
@pytest.mark.parametrize(
    "env,nvl_bytes,nodes,shared",
    [({}, 0, 1, False), ({"EP_RT_RANKS_PER_NODE": "1"}, 64 * MB, 2, True)],
    ids=["one_node_low_latency", "two_nodes_both_modes"],
)
def test_a_buffer_allocates_what_buffer_memory_says(env, nvl_bytes, nodes, shared):
    results = run_ranks(measure, 2, args=(nvl_bytes, 16, True), env=env, timeout_s=300)
    for rank, res in enumerate(results):
        got, want = res["got"], res["want"]
        assert (res["nodes"], res["shared"]) == (nodes, shared), (rank, res)
        assert got["driver"] == want["nvl"], (rank, res)
        assert got["symmetric"] == want["symmetric"], (rank, res)
        # each of the ops' few tensors is rounded up by torch's allocator: at most 8 of them
        assert want["op state"] <= got["torch"] <= want["op state"] + 8 * _ROUNDING, (rank, res)
