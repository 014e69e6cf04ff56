"""Per-rank bodies of the Buffer-setup GPU tests (issue 21 items 6 and 7): ranks that disagree all raise before any
collective allocation, the NVSHMEM world each kind of Buffer joins, and a Buffer that would need a second world."""

from __future__ import annotations

import os

import torch.distributed as dist

from ep_rt import Buffer
from ep_rt.errors import EpRtError, RankMismatchError

MB = 1 << 20


def _error(make):
    """The message of the error `make()` raises (its Buffer destroyed if it does not raise: then None)."""
    try:
        buf = make()
    except (RankMismatchError, EpRtError) as e:
        return f"{type(e).__name__}: {e}"
    buf.destroy()
    return None


def disagreeing_ranks(rank, num_ranks):
    """The last rank asks for another NVL size, then another EP_RT_NVSHMEM_DEBUG: every rank raises (naming it), and
    a Buffer made alike afterwards works."""
    out = {
        "nvl": _error(
            lambda: Buffer(dist.group.WORLD, (2 if rank == num_ranks - 1 else 1) * MB, explicitly_destroy=True)
        )
    }
    hint = Buffer.get_low_latency_rdma_size_hint(16, 1024, num_ranks, 4 * num_ranks)
    os.environ["EP_RT_NVSHMEM_DEBUG"] = "1" if rank == num_ranks - 1 else "0"
    out["knob"] = _error(
        lambda: Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
    )
    os.environ["EP_RT_NVSHMEM_DEBUG"] = "0"
    buf = Buffer(dist.group.WORLD, 1 * MB, explicitly_destroy=True)
    buf._nvl.barrier(buf.comm_stream)
    buf.destroy()
    out["after"] = True
    return out


def worlds(rank, num_ranks, ranks_per_node):
    """On emulated nodes of `ranks_per_node`: a low-latency Buffer joins the world of all ranks (PE of node n's rail
    peer = n * G + local); an internode high-throughput Buffer made next to it shares that world; a Buffer over a
    subgroup then needs a second world, which is refused on every rank of the subgroup before anything is
    allocated."""
    from ep_rt.transport import internode_layout, nvshmem

    G = ranks_per_node
    hint = Buffer.get_low_latency_rdma_size_hint(16, 1024, num_ranks, 4 * num_ranks)
    ll = Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True)
    w = ll._session.world
    got = {"ll": (w.kind, w.npes, w.my_pe, ll._session.pe_base, ll._session.pe_stride)}
    ht = Buffer(
        dist.group.WORLD,
        internode_layout.nvl_size_hint(256, num_ranks, G, 64),
        internode_layout.rdma_size_hint(256, num_ranks, G, 64),
        explicitly_destroy=True,
    )
    got["ht_shares"] = ht._session.world == w and nvshmem._state["users"] == 2
    sub = dist.new_group(list(range(G)))  # every rank creates it; only the first node's ranks use it
    if rank < G:
        got["sub"] = _error(
            lambda: Buffer(
                sub,
                0,
                Buffer.get_low_latency_rdma_size_hint(16, 1024, G, 4 * G),
                low_latency_mode=True,
                num_qps_per_rank=4,
                explicitly_destroy=True,
            )
        )
    ht.destroy()
    ll.destroy()
    return got


def over_a_communicator(rank, num_ranks, seed):
    """Buffer(None, ..., comm=c), as TensorRT-LLM makes DeepEP's: c an mpi4py-like communicator whose allgather and
    Barrier go over this process group's gloo world, with mpi4py itself stood in (MPI.COMM_WORLD numbers the ranks
    as the world does; no MPI here). The setup's collectives take the communicator's path; then one high-throughput
    case and one low-latency case, each bit-exact with the reference."""
    import sys
    import types

    from ep_rt import Config
    from ep_rt.testing import selfcheck_ht, selfcheck_ll

    class GlooComm:
        gathers = barriers = 0

        def Get_rank(self):
            return dist.get_rank()

        def Get_size(self):
            return dist.get_world_size()

        def allgather(self, obj):
            self.gathers += 1
            table = [None] * dist.get_world_size()
            dist.all_gather_object(table, obj)
            return table

        def Barrier(self):
            self.barriers += 1
            dist.barrier()

    package = types.ModuleType("mpi4py")
    package.MPI = types.SimpleNamespace(COMM_WORLD=types.SimpleNamespace(Get_rank=dist.get_rank))
    sys.modules["mpi4py"] = package
    comm = GlooComm()
    ht = selfcheck_ht.Case("bf16 uniform", num_tokens=1024, hidden=2048)
    ll = selfcheck_ll.LLCase("fp8")
    nvl = Config(24).get_nvl_buffer_size_hint(ht.hidden * 2, num_ranks, ht.num_tokens)
    rdma = Buffer.get_low_latency_rdma_size_hint(ll.max_tokens, ll.hidden, num_ranks, ll.num_experts)
    buf = Buffer(None, nvl, rdma, low_latency_mode=True, num_qps_per_rank=4, explicitly_destroy=True, comm=comm)
    out = {"group": buf.group, "rank": buf.rank, "size": buf.group_size, "setup_gathers": comm.gathers, "cases": []}
    for name, chk in (
        (ht.name, selfcheck_ht.run_case(buf, ht, seed)),
        (f"LL {ll.name}", selfcheck_ll.run_ll_case(buf, ll, seed + 1)),
    ):
        out["cases"].append((name, chk.checks, chk.failures))
    buf.destroy()
    return out
