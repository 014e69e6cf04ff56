"""Intranode calls larger than the NVL buffer go through it in rounds (issue 22 item 1, ep_rt/ops/intranode.py): on
the CPU with CUDA stubbed (tests/host_trace.py), what the host launches and the pointers it gives each round. That
the kernels put every row where one pass would is checked on a GPU, bit for bit with the reference
(tests/gpu/test_intranode_gpu.py::test_calls_larger_than_the_buffer_go_in_rounds)."""

import pytest

from ep_rt.errors import BufferTooSmallError
from ep_rt.transport import nvl_layout

from .. import host_trace

R, N, H, K = 2, host_trace.N, host_trace.H, host_trace.K
# An NVL buffer of 4 dispatch rows (5 combine rows) at hidden 256, top-k 4: 2 tokens per source per round.
FOUR_ROWS = nvl_layout.align(nvl_layout.ALIGN * 5 + 4 * sum(nvl_layout.DispatchRows(2 * H, 0, K).widths()))


def test_rounds_for():
    assert nvl_layout.rounds_for(4, 5, 2, 6) == nvl_layout.Rounds(2, 3)
    assert nvl_layout.rounds_for(100, 40, 8, 41) == nvl_layout.Rounds(5, 9)  # the smaller capacity decides
    assert nvl_layout.rounds_for(16, 16, 8, 0) == nvl_layout.Rounds(2, 1)  # no tokens anywhere: one (empty) round
    assert nvl_layout.rounds_for(7, 100, 8, 10) is None  # not one token from each rank
    split = nvl_layout.Rounds(4, 3)
    assert [split.token_range(k, 9) for k in range(3)] == [(0, 4), (4, 8), (8, 9)]
    assert split.token_range(2, 5) == (5, 5)  # a rank with fewer tokens: empty last rounds


def _launches(trace, start):
    return [(e[1], e[-1]) for e in trace.events[start:] if e[0] in ("launch", "launch_ex")]


def _rows(trace, t, row):
    return trace.norm(t.data_ptr() + row * t.stride(0) * t.element_size())


def test_a_dispatch_too_large_for_the_buffer_goes_in_rounds_with_its_combine_and_cached_dispatch(monkeypatch):
    monkeypatch.setattr(host_trace, "ROWS", 9)  # every rank receives 9 rows: more than the 4 the buffer holds
    with host_trace.driven("intranode") as (trace, make):
        buf = host_trace.build({"num_nvl_bytes": FOUR_ROWS, "explicitly_destroy": True})
        x, idx, w, common = host_trace.ht_inputs(buf)
        start = len(trace.events)
        recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        got = _launches(trace, start)
        names = [n for n, _ in got]
        # the id check, the whole call's notify (the host reads its counts), a barrier, then 3 rounds of 2 tokens
        assert (
            names
            == ["ep_rt_check_topk_idx", "ep_rt_intranode_notify", "ep_rt_intranode_barrier"]
            + [
                "ep_rt_intranode_notify",
                "ep_rt_intranode_dispatch",
            ]
            * 3
        ), names
        rounds = handle.rounds
        assert (rounds.tokens_per_round, rounds.num_rounds) == (2, 3)
        assert got[1][1]["host_token"] != 0 and got[1][1]["num_tokens"] == N
        in_rank = common["is_token_in_rank"]
        for k in range(3):
            note, d = got[3 + 2 * k][1], got[4 + 2 * k][1]
            assert note["host_token"] == 0 and note["num_tokens"] == 2
            assert note["is_token_in_rank"] == _rows(trace, in_rank, 2 * k)
            assert note["send_pos"] == _rows(trace, rounds.send_pos, 2 * k)
            assert note["rank_prefix_matrix"] == trace.norm(rounds.rank_prefix_matrix[k].data_ptr())
            assert d["round"] == k and d["token_offset"] == 2 * k and d["num_tokens"] == 2
            assert d["x"] == _rows(trace, x, 2 * k) and d["topk_idx"] == _rows(trace, idx, 2 * k)
            assert d["topk_weights"] == _rows(trace, w, 2 * k) and d["send_pos"] == note["send_pos"]
            assert d["rank_prefix_matrix"] == note["rank_prefix_matrix"]
            assert d["round_rpm"] == trace.norm(rounds.rank_prefix_matrix.data_ptr())
            assert d["full_rpm"] == trace.norm(handle.rank_prefix_matrix.data_ptr())
            assert d["recv_x"] == trace.norm(recv_x.data_ptr()) and d["num_out_rows"] == 9  # the whole call's
            assert d["fill_unused_rows"] == 0 and d["handshake"] == 0
        assert recv_x.size(0) == 9 and handle.rank_prefix_matrix.shape == (R, R)  # DeepEP's handle, whole call

        start = len(trace.events)
        combined, _, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
        got = _launches(trace, start)
        assert [n for n, _ in got] == ["ep_rt_intranode_combine"] * 3
        for k, (_, c) in enumerate(got):
            assert c["round"] == k and c["num_tokens"] == 2 and c["num_in_rows"] == 9
            assert c["combined_x"] == _rows(trace, combined, 2 * k)
            assert c["send_pos"] == _rows(trace, rounds.send_pos, 2 * k)
            assert c["round_rpm"] == trace.norm(rounds.rank_prefix_matrix.data_ptr())
            assert c["recv_channel_prefix_matrix"] == trace.norm(rounds.recv_channel_prefix_matrix[k].data_ptr())

        start = len(trace.events)
        buf.dispatch(x, handle=handle)
        got = _launches(trace, start)
        assert [n for n, _ in got] == ["ep_rt_intranode_dispatch"] * 3  # no notify: the handshake guards each round
        assert [(d["round"], d["handshake"], d["num_tokens"]) for _, d in got] == [(k, 1, 2) for k in range(3)]

        monkeypatch.setattr(host_trace, "ROWS", 4)  # fits: one pass, as before
        start = len(trace.events)
        _, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        got = _launches(trace, start)
        assert [n for n, _ in got][1:] == ["ep_rt_intranode_notify", "ep_rt_intranode_dispatch"]
        assert handle.rounds is None and got[-1][1]["round_rpm"] == 0 and got[-1][1]["num_tokens"] == N
        buf.destroy()


def test_a_buffer_below_one_round_raises_naming_the_size(monkeypatch):
    monkeypatch.setattr(host_trace, "ROWS", 9)
    one_row = nvl_layout.align(nvl_layout.ALIGN * 5 + sum(nvl_layout.DispatchRows(2 * H, 0, K).widths()))
    with host_trace.driven("intranode") as (trace, make):
        buf = host_trace.build({"num_nvl_bytes": one_row, "explicitly_destroy": True})
        x, idx, w, common = host_trace.ht_inputs(buf)
        with pytest.raises(BufferTooSmallError, match=r"less than one round of 2 rows .* num_nvl_bytes >= \d+"):
            buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        buf.destroy()
