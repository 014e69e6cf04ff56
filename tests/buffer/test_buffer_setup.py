"""Buffer construction on the CPU with the GPU and the transports stood in: the comparison over the group
(transport.agreement) runs before anything is allocated, a rank's local failure is raised on every rank, and the
NVSHMEM world a Buffer asks for (rail for internode high-throughput only, all ranks with low_latency_mode)."""

import pytest
import torch

import ep_rt.buffer as buffer_mod
from ep_rt.errors import PeerSetupError, RankMismatchError
from ep_rt.ops.internode import InternodeOp
from ep_rt.ops.low_latency import LowLatencyOp
from ep_rt.transport import nvshmem, nvshmem_world as nw
from ep_rt.transport.topology import Topology

from ..fake_dist import MIRROR, FakeComm, FakeGroup, fake_mpi4py


class Allocated(Exception):
    pass


def refuse(*a, **k):
    raise Allocated("a transport was created before every rank agreed")


@pytest.fixture
def no_gpu(monkeypatch):
    """Everything Buffer.__init__ touches before its first collective allocation, stood in; the transports refuse."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (validate.cuda_available: a GPU is there)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", lambda **kw: object())
    monkeypatch.setattr(buffer_mod.driver, "ensure_context", lambda i: None)
    monkeypatch.setattr(buffer_mod.driver, "pci_bus_id", lambda i: "bus")
    monkeypatch.setattr(buffer_mod.driver, "compute_capability", lambda i: (9, 0))
    for name in ("ErrorRecords", "NvlBuffer", "IntranodeOp", "LayoutOp"):
        monkeypatch.setattr(buffer_mod, name, refuse)
    monkeypatch.setattr(nvshmem, "NvshmemSession", refuse)
    monkeypatch.setattr(nvshmem, "host_flavour", lambda: "cu13")
    monkeypatch.setattr(nvshmem, "host_version", lambda: "3.4.5")
    monkeypatch.setattr(nvshmem, "check_compatible", lambda v, ibgda: None)
    monkeypatch.setattr(buffer_mod.modules, "manifest", lambda: {})
    monkeypatch.setattr(buffer_mod.modules, "choose_entry", lambda *a, **k: {"nvshmem": "3.3.24"})
    monkeypatch.setattr(LowLatencyOp, "cubin_entry", staticmethod(lambda *a, **k: {"nvshmem": "3.3.24"}))
    return monkeypatch


def use_topology(monkeypatch, rank, nodes, G):
    R = nodes * G
    t = Topology.from_table(rank, [f"h{r // G}" for r in range(R)], [f"b{r}" for r in range(R)])
    monkeypatch.setattr(buffer_mod.Topology, "gather", classmethod(lambda cls, group, bus: t))
    return t


def peers_send(monkeypatch, rank, size, edit):
    """This process is `rank`; peer r contributes edit(r, what this rank contributed) to the all-gather."""
    FakeGroup(rank, size).install(monkeypatch)

    def gather(table, obj, group=None):
        for r in range(size):
            table[r] = obj if r == rank else edit(r, obj)

    monkeypatch.setattr(torch.distributed, "all_gather_object", gather)


def test_a_peer_with_other_sizes_stops_every_rank_before_any_allocation(no_gpu):
    use_topology(no_gpu, 0, 1, 4)
    peers_send(
        no_gpu,
        0,
        4,
        lambda r, obj: obj if r != 2 else {"values": {**obj["values"], "num_nvl_bytes": 1 << 21}, "error": None},
    )
    with pytest.raises(RankMismatchError, match=r"num_nvl_bytes: 1048576 on ranks 0-1, 3; 2097152 on rank 2"):
        buffer_mod.Buffer(object(), 1 << 20)  # and no transport was created (they raise Allocated)


def test_a_local_failure_is_the_peers_failure_too(no_gpu):
    use_topology(no_gpu, 1, 1, 4)  # one node: num_rdma_bytes without low_latency_mode is refused
    FakeGroup(1, 4, calls=[MIRROR]).install(no_gpu)
    with pytest.raises(ValueError, match="num_rdma_bytes is for the low-latency mode"):
        buffer_mod.Buffer(object(), 1 << 20, 1 << 20)
    # the same failure on rank 1 alone, seen from rank 0 (whose own arguments are fine)
    peers_send(
        no_gpu,
        0,
        4,
        lambda r, obj: (
            obj
            if r != 1
            else {"values": obj["values"], "error": ("ValueError", "num_rdma_bytes is for the low-latency mode")}
        ),
    )
    with pytest.raises(PeerSetupError, match="rank 1: ValueError: num_rdma_bytes is for"):
        buffer_mod.Buffer(object(), 1 << 20, 0)


@pytest.mark.parametrize(
    "low_latency_mode,rail_supported,kind",
    [(False, True, nw.RAIL), (False, False, nw.FULL), (True, True, nw.FULL), (True, False, nw.FULL)],
)
def test_the_world_a_buffer_asks_for(no_gpu, low_latency_mode, rail_supported, kind):
    use_topology(no_gpu, 10, 2, 8)
    FakeGroup(10, 16, calls=[MIRROR]).install(no_gpu)
    no_gpu.setattr(InternodeOp, "supports_rail_world", rail_supported, raising=False)
    asked = []

    class Stop(Exception):
        pass

    def prepare(group, topology, wanted, device_version, num_qps, allow_nvlink, allow_mnnvl):
        asked.append(wanted)
        raise Stop

    no_gpu.setattr(nvshmem, "prepare", prepare)
    with pytest.raises(Stop):
        buffer_mod.Buffer(object(), 1 << 20, 1 << 20, low_latency_mode=low_latency_mode)
    (w,) = asked
    assert w.kind == kind
    if kind == nw.RAIL:
        assert (w.members, w.my_pe, w.pe_base, w.pe_stride) == ((2, 10), 1, 0, 1)
    else:
        assert (w.npes, w.my_pe, w.pe_base, w.pe_stride) == (16, 10, 2, 8)


def _torch_distributed_untouched(monkeypatch):
    def untouched(*a, **k):
        raise AssertionError("torch.distributed was called for a Buffer made over an mpi4py communicator")

    for name in ("get_rank", "get_world_size", "all_gather_object", "barrier", "get_global_rank"):
        monkeypatch.setattr(torch.distributed, name, untouched)


def test_an_mpi4py_communicator_carries_the_comparison(no_gpu):
    """Buffer(None, ..., comm=c), as TensorRT-LLM makes DeepEP's: the comparison over the ranks goes through
    c.allgather (torch.distributed is never called), and a peer with other sizes is still refused on every rank."""
    use_topology(no_gpu, 0, 1, 4)
    _torch_distributed_untouched(no_gpu)
    fake_mpi4py(no_gpu, world_rank=0)

    class Peers(FakeComm):
        def allgather(self, obj):
            if isinstance(obj, dict):  # the comparison: rank 2 asks for another NVL size
                other = {"values": {**obj["values"], "num_nvl_bytes": 1 << 21}, "error": None}
                self.calls = [[obj, obj, other, obj]]
            return super().allgather(obj)

    comm = Peers(0, 4, calls=[[0, 1, 2, 3]])
    with pytest.raises(RankMismatchError, match=r"num_nvl_bytes: 1048576 on ranks 0-1, 3; 2097152 on rank 2"):
        buffer_mod.Buffer(None, 1 << 20, comm=comm)
    assert len(comm.gathers) == 2  # the COMM_WORLD numbers, then the comparison


def test_an_mpi4py_buffer_asks_for_its_world_by_comm_world_numbers(no_gpu):
    """The NVSHMEM world and its identity come from the communicator: ranks numbered as in MPI.COMM_WORLD."""
    use_topology(no_gpu, 1, 1, 2)
    _torch_distributed_untouched(no_gpu)
    fake_mpi4py(no_gpu, world_rank=5)
    comm = FakeComm(1, 2, calls=[[4, 5], MIRROR])
    seen = []

    class Stop(Exception):
        pass

    def prepare(group, topology, wanted, device_version, num_qps, allow_nvlink, allow_mnnvl):
        from ep_rt.transport import collective

        seen.append((collective.rank(group), [collective.global_rank(group, r) for r in range(2)]))
        raise Stop

    no_gpu.setattr(nvshmem, "prepare", prepare)
    with pytest.raises(Stop):
        buffer_mod.Buffer(None, 0, 1 << 20, low_latency_mode=True, comm=comm)
    assert seen == [(1, [4, 5])]


def test_group_wins_over_comm_as_in_deepep(no_gpu):
    use_topology(no_gpu, 1, 1, 4)
    FakeGroup(1, 4, calls=[MIRROR]).install(no_gpu)
    comm = FakeComm(1, 4)  # any allgather on it fails (no calls expected)
    with pytest.raises(ValueError, match="num_rdma_bytes is for the low-latency mode"):
        buffer_mod.Buffer(object(), 1 << 20, 1 << 20, comm=comm)
    assert comm.gathers == [] and comm.barriers == 0


def test_a_communicators_first_collective_comes_after_the_local_checks(no_gpu):
    """Bad arguments are refused before the communicator's first allgather (as before a group's first collective),
    and what is not a communicator before anything else."""
    fake_mpi4py(no_gpu, world_rank=0)
    comm = FakeComm(0, 2)  # any allgather on it fails (no calls expected)
    with pytest.raises(ValueError, match="num_nvl_bytes must be a non-negative multiple of 128"):
        buffer_mod.Buffer(None, 100, comm=comm)
    assert comm.gathers == []
    with pytest.raises(TypeError, match="comm must be an mpi4py communicator"):
        buffer_mod.Buffer(None, 100, comm=object())
