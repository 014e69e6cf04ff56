"""A stand-in for torch.distributed in CPU tests: one rank of a group of `size`. Each all_gather_object takes the
next entry of `calls` (what every rank contributes to that call; this rank's own entry is replaced by what it
really passes; MIRROR: every rank contributes what this one does) and records this rank's contribution."""

import torch.distributed as dist


MIRROR = "mirror"


class FakeGroup:
    def __init__(self, rank: int, size: int, calls=(), global_ranks=None):
        self.rank, self.size = rank, size
        self.calls = [c if c == MIRROR else list(c) for c in calls]
        self.global_ranks = list(global_ranks) if global_ranks is not None else list(range(size))
        self.gathers = []  # this rank's contribution to each all_gather_object, in order

    def install(self, monkeypatch):
        monkeypatch.setattr(dist, "get_rank", lambda group=None: self.rank)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: self.size)
        monkeypatch.setattr(dist, "get_global_rank", lambda group, r: self.global_ranks[r])
        monkeypatch.setattr(dist, "all_gather_object", self.all_gather_object)
        return self

    def all_gather_object(self, table, obj, group=None):
        table[:] = self.next_table(obj, "all_gather_object")

    def next_table(self, obj, what: str) -> list:
        """The next gather's table: the next entry of `calls` with this rank's own entry `obj`, recorded."""
        if not self.calls:
            raise AssertionError(f"rank {self.rank}: an {what} nobody expected (contributing {obj!r})")
        peers = self.calls.pop(0)
        if peers == MIRROR:
            peers = [obj] * self.size
        self.gathers.append(obj)
        return [obj if r == self.rank else peers[r] for r in range(self.size)]


class FakeComm(FakeGroup):
    """A stand-in for an mpi4py communicator, one rank of `size` (Buffer(None, ..., comm=...)): each allgather takes
    the next entry of `calls` as FakeGroup.all_gather_object does (the first is transport.collective.MpiGroup's
    gather of every rank's MPI.COMM_WORLD number) and returns the table; Barrier counts. (Not installed into
    torch.distributed: a Buffer over a communicator never calls it.)"""

    def __init__(self, rank: int, size: int, calls=()):
        super().__init__(rank, size, calls)
        self.barriers = 0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def allgather(self, obj):
        return self.next_table(obj, "allgather")

    def Barrier(self):
        self.barriers += 1


def fake_mpi4py(monkeypatch, world_rank: int) -> None:
    """`from mpi4py import MPI` gives a module whose COMM_WORLD says this process is `world_rank`."""
    import sys
    import types

    world = types.SimpleNamespace(Get_rank=lambda: world_rank)
    package = types.ModuleType("mpi4py")
    package.MPI = types.SimpleNamespace(COMM_WORLD=world)
    monkeypatch.setitem(sys.modules, "mpi4py", package)
