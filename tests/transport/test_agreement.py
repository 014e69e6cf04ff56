"""Collective allocations that cannot diverge (issue 21 item 7): before any collective allocation every rank's
inputs and local failures are compared with one all_gather_object (ep_rt.transport.agreement), and every rank
raises, naming the ranks that differ and their values. Pure functions, a stand-in torch.distributed, and a real
gloo group of 3 processes on the CPU (each of which must raise)."""

import multiprocessing as mp
import os
import socket

import pytest

from ep_rt.errors import PeerSetupError, RankMismatchError
from ep_rt.transport import agreement
from ep_rt.transport.topology import Topology

from ..fake_dist import FakeGroup


# ---- the comparison -------------------------------------------------------------------------------------------


def test_equal_values_have_no_differences():
    assert agreement.differences([{"a": 1, "b": "x"}] * 4) == []


def test_a_difference_names_every_value_and_its_ranks():
    rows = [{"num_rdma_bytes": 1 << 30, "low_latency_mode": True} for _ in range(6)]
    rows[3] = {"num_rdma_bytes": 1 << 29, "low_latency_mode": True}
    rows[5] = {"num_rdma_bytes": 1 << 29, "low_latency_mode": False}
    assert agreement.differences(rows) == [
        "num_rdma_bytes: 1073741824 on ranks 0-2, 4; 536870912 on ranks 3, 5",
        "low_latency_mode: True on ranks 0-4; False on rank 5",
    ]


def test_missing_values_are_compared_over_the_ranks_that_have_them():
    rows = [{"a": 1, "b": 2}, {"a": 1}, {"a": 1, "b": 2}]  # rank 1 failed before computing b
    assert agreement.differences(rows) == []
    assert agreement.differences([{"a": 1}, {"a": 2}, {}]) == ["a: 1 on rank 0; 2 on rank 1"]


def test_many_distinct_values_are_capped():
    (line,) = agreement.differences([{"x": r} for r in range(10)])
    assert line.endswith("and 4 other values") and "0 on rank 0" in line


def contributions(values, errors=None):
    return [{"values": v, "error": (errors or {}).get(r)} for r, v in enumerate(values)]


def test_verdict_mismatch_is_raised_on_every_rank():
    table = contributions([{"num_nvl_bytes": 0}, {"num_nvl_bytes": 0}, {"num_nvl_bytes": 128}])
    for rank in range(3):
        e = agreement.verdict(table, rank)
        assert isinstance(e, RankMismatchError) and isinstance(e, ValueError)
        assert "num_nvl_bytes: 0 on ranks 0-1; 128 on rank 2" in str(e) and "Nothing was allocated" in str(e)


def test_a_restarted_process_beside_ranks_holding_a_live_nvshmem_world_is_explained():
    """Issue 25 item 5: survivors of a dead peer keep the NVSHMEM world their abandoned Buffer started (its teardown
    needs every peer); a replacement process has none. Every rank raises, and says why and what to do."""
    world = "NVSHMEM world"
    table = contributions([{world: "join the live full world of 2 PEs"}, {world: "initialise full world of 2 PEs"}])
    for rank in range(2):
        e = str(agreement.verdict(table, rank))
        assert "'join the live full world of 2 PEs' on rank 0; 'initialise full world of 2 PEs' on rank 1" in e
        assert "a restarted or new process" in e and "Restart every process of the group" in e
    other = str(
        agreement.verdict(
            contributions([{world: "initialise full world of 2 PEs"}, {world: "initialise rail world of 1 PEs"}]), 0
        )
    )
    assert "restarted" not in other  # another difference of the world gets no such hint


def test_verdict_local_failure_the_failed_rank_reraises_the_others_name_it():
    table = contributions([{"a": 1}] * 3, errors={1: ("NetworkSettingError", "NVSHMEM_IB_SL='99' is out of range")})
    assert agreement.verdict(table, 1) is None  # rank 1 raises its own exception
    for rank in (0, 2):
        e = agreement.verdict(table, rank)
        assert isinstance(e, PeerSetupError)
        assert "rank 1: NetworkSettingError: NVSHMEM_IB_SL='99' is out of range" in str(e)
        assert str(e).startswith(f"rank {rank}: ")


def test_verdict_mismatch_wins_and_mentions_the_failures():
    table = contributions([{"a": 1}, {"a": 2}], errors={0: ("ValueError", "boom")})
    e = agreement.verdict(table, 0)
    assert (
        isinstance(e, RankMismatchError)
        and "a: 1 on rank 0; 2 on rank 1" in str(e)
        and "rank 0: ValueError: boom" in str(e)
    )
    assert agreement.verdict(contributions([{"a": 1}] * 2), 0) is None


# ---- exchange: one all_gather_object, prepare's failures shipped ------------------------------------------


def test_exchange_returns_prepare_result_when_all_agree(monkeypatch):
    peers = contributions([{"n": 4, "x": 1}] * 3)
    g = FakeGroup(1, 3, calls=[peers]).install(monkeypatch)
    assert agreement.exchange(None, {"n": 4}, lambda: ({"x": 1}, "the setup")) == "the setup"
    assert g.gathers == [{"values": {"n": 4, "x": 1}, "error": None}]  # one collective, prepare's values included


def test_exchange_a_peer_differs(monkeypatch):
    peers = contributions([{"n": 4}, {"n": 4}, {"n": 8}])
    FakeGroup(0, 3, calls=[peers]).install(monkeypatch)
    with pytest.raises(RankMismatchError, match=r"n: 4 on ranks 0-1; 8 on rank 2"):
        agreement.exchange(None, {"n": 4})


def test_exchange_own_failure_is_shipped_then_reraised(monkeypatch):
    g = FakeGroup(2, 3, calls=[contributions([{"n": 4}] * 3)]).install(monkeypatch)

    def prepare():
        raise ValueError("num_rdma_bytes is for the low-latency mode")

    with pytest.raises(ValueError, match="num_rdma_bytes is for"):
        agreement.exchange(None, {"n": 4}, prepare)
    assert g.gathers[0]["error"] == ("ValueError", "num_rdma_bytes is for the low-latency mode")


def test_exchange_a_peers_failure(monkeypatch):
    peers = contributions([{"n": 4}] * 3, errors={0: ("CubinNotFoundError", "no cubin for sm_70")})
    FakeGroup(1, 3, calls=[peers]).install(monkeypatch)
    with pytest.raises(PeerSetupError, match="rank 0: CubinNotFoundError: no cubin for sm_70"):
        agreement.exchange(None, {"n": 4}, lambda: ({}, None))


def test_buffer_values_read_the_knobs_without_raising(monkeypatch):
    monkeypatch.setenv("EP_RT_REMOTE_TRANSPORT", "carrier-pigeon")
    topo = Topology.from_table(0, ["h"] * 4, list("abcd"), 2)
    values = agreement.buffer_values({"num_rdma_bytes": 128, "low_latency_mode": True}, topo)
    assert values["EP_RT_REMOTE_TRANSPORT"].startswith("invalid (EP_RT_REMOTE_TRANSPORT must be one of")
    assert values["nodes (Topology)"] == "2 of 2 (emulated)" and values["num_rdma_bytes"] == 128


# ---- Topology: EP_RT_RANKS_PER_NODE compared before it is parsed ------------------------------------------


def test_ranks_per_node_must_match_before_it_is_used(monkeypatch):
    table = [("h", "a", "2"), ("h", "b", "2"), ("h", "c", "3"), ("h", "d", "")]
    for rank in range(4):  # every rank raises, whatever its own value
        with pytest.raises(RankMismatchError, match=r"it is '2' on ranks 0-1; '3' on rank 2; '\(unset\)' on rank 3"):
            Topology.from_gathered(rank, table)
    monkeypatch.setenv("EP_RT_RANKS_PER_NODE", "2")
    t = Topology.from_gathered(3, [("h", b, "2") for b in "abcd"])
    assert (t.num_nodes, t.node_size, t.emulated) == (2, 2, True)


# ---- a real group: 3 processes over gloo, every one of them raises -----------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = ("mismatch", "failure", "agree")


def _worker(rank, size, port, out):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        for case in CASES:  # one group, one exchange per case
            values = {"num_rdma_bytes": 1 << 30, "num_qps_per_rank": 24}
            if case == "mismatch" and rank == 2:
                values["num_qps_per_rank"] = 12

            def prepare():
                if case == "failure" and rank == 1:
                    raise ValueError("EP_RT_RANKS_PER_NODE=3 must divide the number of ranks (4)")
                return {}, "ok"

            try:
                out.put((case, rank, "returned", agreement.exchange(dist.group.WORLD, values, prepare)))
            except Exception as e:
                out.put((case, rank, type(e).__name__, str(e)))
            dist.barrier()  # every rank got here: nobody is left waiting in a collective
    finally:
        dist.destroy_process_group()


def test_real_group_every_rank_raises():
    size = 3
    ctx = mp.get_context("fork")  # the parent never initialised torch.distributed; fork avoids re-importing torch
    out, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_worker, args=(r, size, port, out)) for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    for _ in range(size * len(CASES)):
        case, rank, kind, msg = out.get(timeout=120)
        got[case, rank] = (kind, msg)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank in range(size):
        kind, msg = got["mismatch", rank]
        assert kind == "RankMismatchError", (rank, kind, msg)
        assert "num_qps_per_rank: 24 on ranks 0-1; 12 on rank 2" in msg
    assert got["failure", 1] == ("ValueError", "EP_RT_RANKS_PER_NODE=3 must divide the number of ranks (4)")
    for rank in (0, 2):
        kind, msg = got["failure", rank]
        assert kind == "PeerSetupError" and "rank 1: ValueError: EP_RT_RANKS_PER_NODE=3" in msg
    assert all(got["agree", r] == ("returned", "ok") for r in range(size))
