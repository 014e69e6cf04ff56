"""Queue pairs that scale (issue 21 item 6): which NVSHMEM world a Buffer joins (ep_rt.transport.nvshmem_world), the
PE of a node's rail peer (pe_base + n * pe_stride), the unique-id exchange of nvshmem.init over a stand-in NVSHMEM
library and torch.distributed, a second Buffer that needs another world, and the symmetric buffer's zeroing (the
memset finishes before the barrier that lets peers write)."""

import ctypes

import pytest
import torch

from ep_rt.errors import EpRtError
from ep_rt.transport import nvshmem, nvshmem_world as nw, symmetric
from ep_rt.transport.topology import Topology

from ..fake_dist import FakeGroup


def topo(rank, nodes, G):
    R = nodes * G
    return Topology.from_table(rank, [f"host{r // G}" for r in range(R)], [f"bus{r}" for r in range(R)])


# ---- the world and its PE arithmetic ---------------------------------------------------------------------------


@pytest.mark.parametrize("nodes,G", [(2, 8), (4, 2), (8, 8), (32, 8), (3, 1)])
def test_rail_world_is_the_ranks_of_one_local_index(nodes, G):
    for rank in range(nodes * G):
        t = topo(rank, nodes, G)
        w = nw.rail_world(t)
        local, node = rank % G, rank // G
        assert w.members == tuple(n * G + local for n in range(nodes)) and w.npes == nodes
        assert w.my_pe == node and w.root == local and (w.pe_base, w.pe_stride) == (0, 1)
        assert [w.pe_of_node(n) for n in range(nodes)] == list(range(nodes))
        assert [w.pe_of_rank(w.members[n]) for n in range(nodes)] == list(range(nodes))
        assert all(w.pe_of_rank(r) is None for r in t.local_ranks if r != rank)  # node peers are not PEs


@pytest.mark.parametrize("nodes,G", [(2, 8), (4, 2), (8, 8)])
def test_full_world_pe_of_node_is_n_times_G_plus_local(nodes, G):
    for rank in range(nodes * G):
        w = nw.full_world(topo(rank, nodes, G))
        assert w.npes == nodes * G and w.my_pe == rank and w.root == 0
        assert [w.pe_of_node(n) for n in range(nodes)] == [n * G + rank % G for n in range(nodes)]
        assert w.pe_of_rank(5 % (nodes * G)) == 5 % (nodes * G)


def test_choice_rail_for_high_throughput_only_full_with_low_latency():
    t = topo(9, 4, 8)
    assert nw.choose(t, low_latency_mode=False).kind == nw.RAIL
    assert nw.choose(t, low_latency_mode=True).kind == nw.FULL
    assert nw.choose(t, low_latency_mode=False, rail_supported=False).kind == nw.FULL
    assert list(nw.root_ranks(nw.RAIL, t)) == list(range(8)) and list(nw.root_ranks(nw.FULL, t)) == [0]


# ---- a second Buffer in the same process -------------------------------------------------------------------


def test_reuse_same_world_or_a_full_world_for_a_rail_buffer():
    t = topo(3, 2, 8)
    ident = (tuple(range(16)), 8)
    rail, full = nw.rail_world(t), nw.full_world(t)
    assert nw.reuse(rail, ident, rail, ident, t) is rail
    assert nw.reuse(full, ident, full, ident, t) is full
    assert nw.reuse(full, ident, rail, ident, t) == full  # HT-only Buffer next to an LL Buffer: the LL world


@pytest.mark.parametrize("case", ["ll_after_rail", "other_ranks", "other_node_size"])
def test_reuse_refuses_what_one_world_cannot_serve(case):
    t = topo(3, 2, 8)
    ident = (tuple(range(16)), 8)
    live, live_ident, wanted, ident2 = nw.rail_world(t), ident, nw.full_world(t), ident
    if case == "other_ranks":
        live, ident2 = nw.full_world(t), (tuple(range(16, 32)), 8)
    if case == "other_node_size":
        live, ident2 = nw.full_world(t), (tuple(range(16)), 4)
    with pytest.raises(EpRtError, match="NVSHMEM is initialised once per process") as e:
        nw.reuse(live, live_ident, wanted, ident2, t)
    assert "destroy()" in str(e.value) and "Supported:" in str(e.value)


# ---- nvshmem.init: the unique ids over one all_gather_object ----------------------------------------------------


class FakeLib:
    def __init__(self, uid=b"", fail_uid=False):
        self.uid, self.fail_uid = uid, fail_uid
        self.attr_args = self.inits = None

    def nvshmemx_get_uniqueid(self, buf):
        if self.fail_uid:
            return 7
        ctypes.memmove(buf, self.uid, len(self.uid))
        return 0

    def nvshmemx_set_attr_uniqueid_args(self, pe, npes, uid, attr):
        self.attr_args = (pe, npes, uid.raw[:8])
        return 0

    def nvshmemx_hostlib_init_attr(self, flags, attr):
        self.inits = flags
        return 0


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(nvshmem, "_state", {"lib": None, "users": 0, "plan": None, "world": None, "identity": None})


def uid(tag):
    return tag.ljust(128, b"\0")


@pytest.mark.parametrize("kind", [nw.RAIL, nw.FULL])
def test_init_takes_the_id_of_its_worlds_root(monkeypatch, fresh_state, kind):
    rank, nodes, G = 9, 2, 8  # node 1, local 1
    t = topo(rank, nodes, G)
    world = nw.rail_world(t) if kind == nw.RAIL else nw.full_world(t)
    # node 0's ranks each made one (one per rail); the full world uses rank 0's
    peers = [uid(b"rail%d" % r) if r < G else None for r in range(nodes * G)]
    FakeGroup(rank, nodes * G, calls=[peers]).install(monkeypatch)
    lib = FakeLib()
    monkeypatch.setattr(nvshmem, "_lib", lambda: lib)
    joined = nvshmem.init(None, world, (tuple(range(16)), 8), t)
    assert joined is world
    want = (1, 2, b"rail1\0\0\0") if kind == nw.RAIL else (9, 16, b"rail0\0\0\0")
    assert lib.attr_args == want
    assert nvshmem._state["users"] == 1 and nvshmem._state["world"] is world


def test_a_roots_failure_stops_every_rank(monkeypatch, fresh_state):
    t = topo(9, 2, 8)
    peers = [uid(b"rail%d" % r) if r < 8 else None for r in range(16)]
    peers[1] = ("error", "nvshmemx_get_uniqueid failed (7) on rank 1")  # the root of rank 9's rail
    FakeGroup(9, 16, calls=[peers]).install(monkeypatch)
    lib = FakeLib()
    monkeypatch.setattr(nvshmem, "_lib", lambda: lib)
    with pytest.raises(EpRtError, match="failed \\(7\\) on rank 1"):
        nvshmem.init(None, nw.rail_world(t), (tuple(range(16)), 8), t)
    assert lib.inits is None  # nobody initialised


def test_a_root_contributes_its_id_or_its_failure(monkeypatch, fresh_state):
    t = topo(1, 2, 8)  # a root of the rail worlds (node 0), not of the full world
    g = FakeGroup(1, 16, calls=[[uid(b"x")] * 16]).install(monkeypatch)
    monkeypatch.setattr(nvshmem, "_lib", lambda: FakeLib(fail_uid=True))
    with pytest.raises(EpRtError, match="failed \\(7\\) on rank 1"):
        nvshmem.init(None, nw.rail_world(t), (tuple(range(16)), 8), t)
    assert g.gathers == [("error", "nvshmemx_get_uniqueid failed (7) on rank 1")]  # the peers learn it too


def emulated(rank, nodes, G):  # every rank on one GPU of one host, nodes from EP_RT_RANKS_PER_NODE
    R = nodes * G
    return Topology.from_table(rank, ["host"] * R, ["bus0"] * R, ranks_per_node=G)


def test_rail_worlds_start_one_after_the_other_only_where_a_rail_shares_a_gpu():
    """NVSHMEM's several-PEs-per-GPU start names its host shared memory by PE alone: rail worlds that start at once
    on one GPU swap files (nvshmem_world.start_turns)."""
    assert nw.start_turns(nw.RAIL, topo(3, 2, 8)) == 1  # real nodes: a rail has one PE per host
    assert nw.start_turns(nw.FULL, emulated(3, 2, 2)) == 1  # one world: nothing to collide with
    assert nw.start_turns(nw.RAIL, emulated(3, 2, 2)) == 2  # 2 x 2 on one GPU: one turn per rail
    assert nw.start_turns(nw.RAIL, emulated(3, 4, 1)) == 1  # 4 x 1: one rail, one world
    assert nw.start_turns(nw.RAIL, emulated(3, 2, 8)) == 8
    R = 4  # two GPUs of one host, each with a node of 2 ranks: no two PEs of one rail share a GPU
    two_gpus = Topology.from_table(0, ["host"] * R, ["bus0", "bus0", "bus1", "bus1"], ranks_per_node=2)
    assert nw.start_turns(nw.RAIL, two_gpus) == 1


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_init_in_turns_starts_nvshmem_in_its_rails_turn_and_takes_every_barrier(monkeypatch, fresh_state, rank):
    t = emulated(rank, 2, 2)
    order = []
    FakeGroup(rank, 4, calls=[[uid(b"rail0"), uid(b"rail1"), None, None]]).install(monkeypatch)
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: order.append("barrier"))
    lib = FakeLib()
    lib.nvshmemx_hostlib_init_attr = lambda flags, attr: order.append("init") or 0
    monkeypatch.setattr(nvshmem, "_lib", lambda: lib)
    nvshmem.init(None, nw.rail_world(t), (tuple(range(4)), 2), t)
    want = ["init", "barrier", "barrier"] if t.local_rank == 0 else ["barrier", "init", "barrier"]
    assert order == want


def test_second_init_joins_or_refuses(monkeypatch, fresh_state):
    t = topo(9, 2, 8)
    ident = (tuple(range(16)), 8)
    full = nw.full_world(t)
    nvshmem._state.update(users=1, world=full, identity=ident)
    FakeGroup(9, 16).install(monkeypatch)  # no collective may run
    assert nvshmem.init(None, nw.rail_world(t), ident, t) == full and nvshmem._state["users"] == 2
    with pytest.raises(EpRtError, match="already belongs to a world of all 16 ranks"):
        nvshmem.init(None, full, ((0, 1), 1), topo(1, 2, 1))


# ---- the symmetric buffer: zeroed before any peer may write ------------------------------------------------


def test_symmetric_buffer_memset_finishes_before_the_barrier(monkeypatch):
    events = []
    monkeypatch.setattr(nvshmem, "align", lambda n: events.append("align") or 0x1000)
    monkeypatch.setattr(symmetric.driver, "memset_d8", lambda p, v, n: events.append("memset"))
    monkeypatch.setattr(symmetric.driver, "ctx_synchronize", lambda: events.append("synchronize"))
    monkeypatch.setattr(nvshmem, "barrier_all", lambda: events.append("barrier"))
    monkeypatch.setattr(nvshmem, "peer_ptr", lambda ptr, pe: 0x1000 + pe)

    class Session:  # rank 9 of 2 nodes of 8 in its rail world: PEs are ranks 1 and 9
        world = nw.rail_world(topo(9, 2, 8))
        pe_base, pe_stride = world.pe_base, world.pe_stride

        def pe_of_rank(self, r):
            return self.world.pe_of_rank(r)

    sym = symmetric.SymmetricBuffer(Session(), 4096, 16)
    assert events == ["align", "memset", "synchronize", "barrier"]
    bases = sym.mapped_bases
    assert bases[1] == 0x1000 and bases[9] == 0x1001  # PE 0 and PE 1 of the rail
    assert all(b == 0 for r, b in enumerate(bases) if r not in (1, 9))  # node peers and other rails: not PEs
    assert (sym.pe_base, sym.pe_stride) == (0, 1)
