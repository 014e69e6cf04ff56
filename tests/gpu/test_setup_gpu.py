"""Buffer setup on the GPU (issue 21 items 6 and 7), with the ranks sharing one GPU: ranks that disagree on a size or
a knob all raise before any collective allocation, and the NVSHMEM worlds Buffers join."""

from ep_rt.testing.spawn import run_ranks

from . import setup_workers
from .conftest import gpus


@gpus(1)
def test_ranks_that_disagree_all_raise_and_a_buffer_made_alike_works():
    results = run_ranks(setup_workers.disagreeing_ranks, 4, timeout_s=300)
    for rank, r in enumerate(results):
        assert r["nvl"] is not None and r["nvl"].startswith("RankMismatchError"), (rank, r["nvl"])
        assert "num_nvl_bytes: 1048576 on ranks 0-2; 2097152 on rank 3" in r["nvl"], r["nvl"]
        assert r["knob"] is not None and "EP_RT_NVSHMEM_DEBUG: False on ranks 0-2; True on rank 3" in r["knob"]
        assert r["after"]


@gpus(1)
def test_worlds_of_low_latency_and_high_throughput_buffers():
    env = {"EP_RT_RANKS_PER_NODE": "2", "EP_RT_TIMEOUT_S": "20", "EP_RT_NET_TIMEOUT_S": "40"}
    results = run_ranks(setup_workers.worlds, 4, args=(2,), env=env, timeout_s=600)
    for rank, r in enumerate(results):
        assert r["ll"] == ("full", 4, rank, rank % 2, 2), (rank, r["ll"])
        assert r["ht_shares"], rank
        if rank < 2:
            assert r["sub"] is not None and "NVSHMEM is initialised once per process" in r["sub"], r["sub"]


@gpus(1)
def test_a_buffer_made_over_an_mpi4py_style_communicator_works():
    """Buffer(None, ..., comm=c) (DeepEP's comm=, which TensorRT-LLM passes): the setup gathers over c, and an HT and
    an LL case are bit-exact (c's collectives ride the gloo world; mpi4py is stood in: no MPI on the GPU machine)."""
    import random

    seed = random.SystemRandom().randrange(1 << 30)
    env = {"EP_RT_TIMEOUT_S": "20"}
    results = run_ranks(setup_workers.over_a_communicator, 2, args=(seed,), env=env, timeout_s=300)
    for rank, r in enumerate(results):
        assert (r["group"], r["rank"], r["size"]) == (None, rank, 2), r
        assert r["setup_gathers"] >= 4, r  # COMM_WORLD numbers, topology, agreement, IPC handles, NVSHMEM id, ...
        assert [name for name, _, _ in r["cases"]] == ["bf16 uniform", "LL fp8"], r["cases"]
        for name, checks, failures in r["cases"]:
            assert checks > 0 and not failures, (rank, name, failures[:5], f"seed {seed}")
