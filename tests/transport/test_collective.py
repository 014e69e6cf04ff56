"""transport.collective: the setup's collectives over a torch.distributed group (torch.distributed's own calls) or
an mpi4py communicator (DeepEP's comm=), with both stood in on the CPU."""

import pytest
import torch.distributed as dist

from ep_rt.transport import collective

from ..fake_dist import MIRROR, FakeComm, FakeGroup, fake_mpi4py


def test_a_torch_group_takes_torch_distributeds_calls(monkeypatch):
    fake = FakeGroup(1, 3, calls=[["a", None, "c"]], global_ranks=[4, 5, 6]).install(monkeypatch)
    barriers = []
    monkeypatch.setattr(dist, "barrier", lambda group=None: barriers.append(group))
    group = object()
    assert (collective.rank(group), collective.size(group)) == (1, 3)
    assert collective.all_gather_object(group, "b") == ["a", "b", "c"] and fake.gathers == ["b"]
    collective.barrier(group)
    assert barriers == [group]
    assert [collective.global_rank(group, r) for r in range(3)] == [4, 5, 6]


def test_an_mpi4py_communicator_takes_its_own_calls(monkeypatch):
    def untouched(*a, **k):
        raise AssertionError("torch.distributed was called for an mpi4py communicator")

    for name in ("get_rank", "get_world_size", "all_gather_object", "barrier", "get_global_rank"):
        monkeypatch.setattr(dist, name, untouched)
    fake_mpi4py(monkeypatch, world_rank=9)
    comm = FakeComm(2, 4, calls=[[7, 8, None, 10], ["w", "x", None, "z"]])
    group = collective.MpiGroup(comm)  # gathers every rank's COMM_WORLD number: the first allgather
    assert comm.gathers == [9]
    assert (collective.rank(group), collective.size(group)) == (2, 4)
    assert [collective.global_rank(group, r) for r in range(4)] == [7, 8, 9, 10]
    assert collective.all_gather_object(group, "y") == ["w", "x", "y", "z"]
    collective.barrier(group)
    assert comm.barriers == 1


def test_what_is_not_a_communicator_is_refused_by_name(monkeypatch):
    fake_mpi4py(monkeypatch, 0)
    with pytest.raises(TypeError, match=r"comm must be an mpi4py communicator .*object lacks Get_rank, Get_size"):
        collective.MpiGroup(object())

    class Half:
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 1

    with pytest.raises(TypeError, match="Half lacks allgather, Barrier"):
        collective.MpiGroup(Half())


def test_a_short_allgather_is_an_error_not_a_wrong_table(monkeypatch):
    fake_mpi4py(monkeypatch, 0)
    comm = FakeComm(0, 2, calls=[MIRROR])
    group = collective.MpiGroup(comm)
    comm.allgather = lambda obj: [obj]  # one entry for two ranks
    with pytest.raises(RuntimeError, match="returned 1 entries for 2 ranks"):
        collective.all_gather_object(group, "x")


def test_a_communicator_without_mpi4py_says_so(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # (import fails)
    with pytest.raises(TypeError, match="pip install mpi4py"):
        collective.MpiGroup(FakeComm(0, 1, calls=[MIRROR]))
