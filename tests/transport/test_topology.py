"""The NVLink check with a stand-in NVML: a pair without NVLink is a clear error naming the GPUs."""

import sys
import types

import pytest

from ep_rt.transport import topology
from ep_rt.errors import TopologyError


def fake_pynvml(linked_pairs):
    m = types.SimpleNamespace(NVML_P2P_CAPS_INDEX_NVLINK=4, NVML_P2P_STATUS_OK=0)
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetHandleByPciBusId = lambda bus: bus
    m.nvmlDeviceGetP2PStatus = lambda a, b, idx: 0 if frozenset((a, b)) in linked_pairs else 5
    return m


def test_all_linked_passes(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({frozenset(("A", "B"))}))
    topology.require_nvlink(["A", "B", "A"])  # two ranks on one GPU need no link


def test_missing_link_names_the_pair(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({frozenset(("A", "B"))}))
    with pytest.raises(TopologyError, match="B <-> C"):
        topology.require_nvlink(["A", "B", "C"])


# ---- Topology: nodes from hosts, or emulated by EP_RT_RANKS_PER_NODE ----------------------------------------
Topology = topology.Topology


def test_one_host_is_one_node():
    t = Topology.from_table(3, ["h"] * 4, [f"b{i}" for i in range(4)])
    assert (t.num_nodes, t.node_size, t.node, t.local_rank, list(t.local_ranks)) == (1, 4, 0, 3, [0, 1, 2, 3])
    assert t.single_host and not t.emulated


def test_nodes_by_host():
    hosts = ["a"] * 8 + ["b"] * 8
    t = Topology.from_table(11, hosts, ["x"] * 16)
    assert (t.num_nodes, t.node_size, t.node, t.local_rank, list(t.local_ranks)) == (2, 8, 1, 3, list(range(8, 16)))
    assert not t.single_host and t.node_of(7) == 0 and t.node_of(8) == 1


def test_emulated_nodes_on_one_host():
    t = Topology.from_table(5, ["h"] * 8, ["x"] * 8, ranks_per_node=2)
    assert (t.num_nodes, t.node_size, t.node, t.local_rank, list(t.local_ranks)) == (4, 2, 2, 1, [4, 5])
    assert t.emulated and "emulated" in t.describe()
    one = Topology.from_table(1, ["h"] * 4, ["x"] * 4, ranks_per_node=1)
    assert one.num_nodes == 4 and list(one.local_ranks) == [1]


@pytest.mark.parametrize(
    "hosts,g,match",
    [
        (["a", "b", "a", "b"], None, "contiguous"),
        (["a", "a", "a", "b"], None, "same number of ranks"),
        (["h"] * 6, 4, "must divide"),
        (["a", "a", "b", "b"], 4, "one host"),
        (["h"] * 4, 0, "must divide"),
    ],
)
def test_bad_layouts_are_clear_errors(hosts, g, match):
    with pytest.raises(TopologyError, match=match):
        Topology.from_table(0, hosts, ["x"] * len(hosts), ranks_per_node=g)


def test_ranks_per_node_knob(monkeypatch):
    from ep_rt import env

    monkeypatch.delenv("EP_RT_RANKS_PER_NODE", raising=False)
    assert env.ranks_per_node() is None
    monkeypatch.setenv("EP_RT_RANKS_PER_NODE", "2")
    assert env.ranks_per_node() == 2
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("EP_RT_RANKS_PER_NODE", bad)
        with pytest.raises(ValueError, match="EP_RT_RANKS_PER_NODE"):
            env.ranks_per_node()
