"""The host collectives of a Buffer's setup (its rank, the group's size, one Python object gathered from every rank,
a barrier, a rank's global number) over either a torch.distributed process group or, as DeepEP's `comm=`, an
mpi4py communicator (TensorRT-LLM passes one). The transports call these instead of torch.distributed, so both kinds
of group take the same path; the data path has no host collective at all."""

from __future__ import annotations

import torch.distributed as dist

_MPI_METHODS = ("Get_rank", "Get_size", "allgather", "Barrier")


class MpiGroup:
    """An mpi4py communicator standing where a torch.distributed group would (Buffer(None, ..., comm=c)).

    Built collectively (every rank of the communicator, as the Buffer is): it gathers each rank's number in
    MPI.COMM_WORLD once, which is what a global rank means for this group (torch's `get_global_rank` is the default
    process group's number; a process that mixes both kinds of group numbers them the same way only where its
    launcher did)."""

    def __init__(self, comm):
        MPI = check_communicator(comm)
        self.comm = comm
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())
        self.global_ranks = tuple(int(r) for r in comm.allgather(int(MPI.COMM_WORLD.Get_rank())))


def check_communicator(comm):
    """Local (no collective): that `comm` has what an mpi4py communicator has and mpi4py is importable; returns
    mpi4py's MPI module."""
    missing = [m for m in _MPI_METHODS if not callable(getattr(comm, m, None))]
    if missing:
        raise TypeError(
            f"comm must be an mpi4py communicator (with {', '.join(_MPI_METHODS)}); {type(comm).__name__} "
            f"lacks {', '.join(missing)}"
        )
    try:
        from mpi4py import MPI
    except ImportError as e:  # a communicator without its package: not something mpi4py hands out
        raise TypeError("comm= needs mpi4py importable in this process (pip install mpi4py)") from e
    return MPI


def rank(group) -> int:
    """This process's rank in `group`."""
    return group.rank if isinstance(group, MpiGroup) else dist.get_rank(group)


def size(group) -> int:
    """The number of ranks in `group`."""
    return group.size if isinstance(group, MpiGroup) else dist.get_world_size(group)


def all_gather_object(group, obj) -> list:
    """Every rank's `obj` (picklable), indexed by rank; collective over `group`."""
    if isinstance(group, MpiGroup):
        table = list(group.comm.allgather(obj))
        if len(table) != group.size:
            raise RuntimeError(f"comm.allgather returned {len(table)} entries for {group.size} ranks")
        return table
    table = [None] * dist.get_world_size(group)
    dist.all_gather_object(table, obj, group=group)
    return table


def barrier(group) -> None:
    """Every rank of `group` reaches this before any leaves it."""
    if isinstance(group, MpiGroup):
        group.comm.Barrier()
    else:
        dist.barrier(group=group)


def global_rank(group, r: int) -> int:
    """Rank r of `group` in its world (torch: the default process group; mpi4py: MPI.COMM_WORLD)."""
    return group.global_ranks[r] if isinstance(group, MpiGroup) else dist.get_global_rank(group, r)
