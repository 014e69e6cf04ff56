"""The NVLink check with a stand-in NVML: a pair without NVLink is a clear error naming the GPUs."""
import sys
import types

import pytest

from ep_rt import topology
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
