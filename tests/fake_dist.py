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
        if not self.calls:
            raise AssertionError(f"rank {self.rank}: an all_gather_object nobody expected (contributing {obj!r})")
        peers = self.calls.pop(0)
        if peers == MIRROR:
            peers = [obj] * self.size
        self.gathers.append(obj)
        for r in range(self.size):
            table[r] = obj if r == self.rank else peers[r]
