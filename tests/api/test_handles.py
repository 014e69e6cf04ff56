"""Handles are NamedTuples: plain tuples to DeepEP code (length, order, unpacking), typed to ep_rt."""

import pytest
import torch

from ep_rt import config_tables
from ep_rt.config import table_config
from ep_rt.handles import IntranodeHandle, LowLatencyHandle, as_handle


def test_handles_are_deepep_tuples():
    h = IntranodeHandle(*[torch.zeros(1)] * 6)
    assert isinstance(h, tuple) and len(h) == 6 and h[5] is h.send_pos
    a, b, c, d, e, f = h  # DeepEP code unpacks it
    ll = LowLatencyHandle(torch.zeros(1), torch.zeros(1), 128, 7168, 288)
    assert len(ll) == 5 and ll[2:] == (128, 7168, 288)


def test_as_handle_goes_by_type_then_by_length():
    t = tuple(torch.zeros(1) for _ in range(6))
    assert isinstance(as_handle(IntranodeHandle, t, "combine"), IntranodeHandle)
    ll = LowLatencyHandle(torch.zeros(1), torch.zeros(1), 128, 7168, 288)
    with pytest.raises(ValueError, match="comes from a low-latency dispatch"):
        as_handle(IntranodeHandle, ll, "combine")
    with pytest.raises(ValueError, match="comes from a high-throughput"):
        as_handle(LowLatencyHandle, IntranodeHandle(*t), "low_latency_combine")
    with pytest.raises(ValueError, match="5-tuple"):
        as_handle(LowLatencyHandle, (1, 2), "low_latency_combine")
    with pytest.raises(ValueError, match="6-tuple"):
        as_handle(IntranodeHandle, None, "combine")


def test_config_tables_are_rows():
    for row in config_tables.ROWS:
        assert row.kind in ("dispatch", "combine") and row.num_ranks > 0
        c = table_config(row.kind, row.num_ranks, 24)
        assert (c.num_sms, c.num_max_nvl_chunked_send_tokens) == (24, row.nvl_send)
    keys = [(r.kind, r.num_ranks) for r in config_tables.ROWS]
    assert len(keys) == len(set(keys))
    with pytest.raises(ValueError, match="multiple of the ranks per node"):
        table_config("dispatch", 12, 24, num_ranks_per_node=8)
