"""Internode calls larger than the buffers go in rounds (issue 22 item 1, ep_rt/ops/internode_rounds.py): on the CPU
with CUDA stubbed (tests/host_trace.py), what the host launches and the pointers it gives each round, and where each
round's rows go in the whole call's outputs. That the kernels move every row where one pass would is checked on a GPU,
bit for bit with the reference, on emulated nodes (tests/gpu/test_internode_gpu.py::
test_internode_calls_larger_than_the_buffers_go_in_rounds)."""

import pytest
import torch

from ep_rt.errors import BufferTooSmallError
from ep_rt.ops import internode_rounds
from ep_rt.runtime import abi
from ep_rt.transport import internode_layout as lay
from ep_rt.transport import nvl_layout

from .. import host_trace

H, K, T = host_trace.H, host_trace.K, host_trace.N  # hidden, top-k, tokens per rank
R, NODES = 4, 2  # the "internode" scenario: 2 nodes of 2 ranks
RECORD = max(lay.dispatch_record_bytes(2 * H, 0, K), lay.combine_record_bytes(H, K))
# Room for streams of 2 records and for 9 rows a rank receives: rounds of 2 tokens per rank (4 ranks x 2 = 8 rows).
RDMA = lay.rdma_bytes_for(RECORD, NODES, 2)
NVL = nvl_layout.align(lay.nvl_control_offsets(R, NODES)["records"] + 9 * RECORD)


def test_rounds_for():
    assert lay.rounds_for(2, 9, 4, 6) == nvl_layout.Rounds(2, 3)
    assert lay.rounds_for(100, 40, 8, 41) == nvl_layout.Rounds(5, 9)  # the NVL rows decide
    assert lay.rounds_for(3, 400, 8, 7) == nvl_layout.Rounds(3, 3)  # the stream capacity decides
    assert lay.rounds_for(4, 32, 8, 0) == nvl_layout.Rounds(4, 1)  # no tokens anywhere: one (empty) round
    assert lay.rounds_for(0, 400, 8, 10) is None and lay.rounds_for(5, 7, 8, 10) is None  # not a token per rank


def test_round_rows_put_each_round_after_the_earlier_rounds_of_its_source():
    full = torch.tensor([3, 5, 9], dtype=torch.int32)  # the whole call: 3, 2 and 4 rows from sources 0, 1, 2
    before = torch.zeros(3, dtype=torch.int32)
    first, sources = internode_rounds.round_rows(full, before, torch.tensor([2, 3, 5], dtype=torch.int32), 5)
    assert first.tolist() == [0, 1, 3, 5, 6] and sources.tolist() == [0, 0, 1, 2, 2] and before.tolist() == [2, 1, 2]
    empty, _ = internode_rounds.round_rows(full, before, torch.tensor([0, 0, 0], dtype=torch.int32), 0)
    assert empty.tolist() == [] and before.tolist() == [2, 1, 2]
    second, sources = internode_rounds.round_rows(full, before, torch.tensor([1, 2, 4], dtype=torch.int32), 4)
    assert second.tolist() == [2, 4, 7, 8] and sources.tolist() == [0, 1, 2, 2] and before.tolist() == [3, 2, 4]
    assert sorted(first.tolist() + second.tolist()) == list(range(9))  # every row of one pass, once


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32, torch.int64])
def test_put_rows_copies_every_dtype_of_the_outputs_bit_for_bit(dtype, monkeypatch):
    """FP8 rows go through a byte view (CUDA's index_copy_ has no FP8 kernel); the CPU's index_copy_ is made to
    refuse FP8 here as CUDA does, so that the test fails if the view is dropped."""
    real = torch.Tensor.index_copy_

    def cuda_like(self, dim, index, source):
        if self.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise NotImplementedError('"index_copy_cuda" not implemented for Float8')
        return real(self, dim, index, source)

    monkeypatch.setattr(torch.Tensor, "index_copy_", cuda_like)
    rows = (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5).to(dtype)
    out = torch.zeros(5, 4, dtype=dtype)
    internode_rounds.put_rows(out, torch.tensor([4, 0, 2]), rows)
    want = torch.zeros(5, 4, dtype=dtype)
    want[4], want[0], want[2] = rows[0], rows[1], rows[2]
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))


def test_forwarded_positions_continue_from_the_earlier_rounds():
    """send_nvl_head as one pass has it: a record's position among its source's records for that rank, counted
    over the whole call. Two source nodes, two ranks on my node; the records of each round in token order."""
    sent = torch.zeros(2, 2, dtype=torch.int32)
    heads = torch.tensor([[0, -1], [1, 0], [0, 0]], dtype=torch.int32)  # node 0: two records; node 1: one
    first = internode_rounds.shifted_nvl_heads(heads, torch.tensor([0, 0, 1]), sent)
    assert first.tolist() == heads.tolist() and sent.tolist() == [[2, 1], [1, 1]]
    heads = torch.tensor([[-1, 0], [0, 1], [0, -1]], dtype=torch.int32)  # node 0: one record; node 1: two
    second = internode_rounds.shifted_nvl_heads(heads, torch.tensor([0, 1, 1]), sent)
    assert second.tolist() == [[-1, 1], [1, 2], [1, -1]] and sent.tolist() == [[2, 2], [3, 2]]


def _every_token_everywhere(p):
    """Every rank has p.num_tokens tokens and sends each to every rank: (rows received, rows forwarded, longest
    stream, most rows received). The notify that finds the largest token count has no per-expert counts."""
    return R * p.num_tokens, NODES * p.num_tokens, p.num_tokens, R * p.num_tokens


def _launches(trace, start):
    return [(e[1], e[-1]) for e in trace.events[start:] if e[0] in ("launch", "launch_ex")]


def _row(trace, t, row):
    return trace.norm(t.data_ptr() + row * t.stride(0) * t.element_size())


def _consecutive_rows(full, before, round_prefix, num_rows):  # (the stand-in prefix sums hold no counts)
    start = int(before[0])
    before[0] += num_rows
    return torch.arange(start, start + num_rows), torch.zeros(num_rows, dtype=torch.int64)


def test_an_internode_dispatch_too_large_for_the_buffers_goes_in_rounds(monkeypatch):
    monkeypatch.setattr(host_trace, "INTERNODE_COUNTS", _every_token_everywhere)
    monkeypatch.setattr(internode_rounds, "round_rows", _consecutive_rows)
    with host_trace.driven("internode") as (trace, make):
        buf = host_trace.build({"num_nvl_bytes": NVL, "num_rdma_bytes": RDMA, "explicitly_destroy": True})
        x, idx, w, common = host_trace.ht_inputs(buf)
        start = len(trace.events)
        recv_x, _, recv_w, per_expert, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        got = _launches(trace, start)
        names = [n.replace("ep_rt_internode_", "") for n, _ in got]
        data = ["send", "forward", "recv"]
        # the id check; the whole call's notify, its data kernels told to skip; the notify that finds the largest
        # token count and its skipped data kernels; then 3 rounds of 2 tokens, each an ordinary dispatch
        assert names == ["ep_rt_check_topk_idx", "notify", *data, "notify", *data] + ["notify", *data] * 3, names
        whole, largest = got[1][1], got[5][1]
        assert whole["host_token"] != 0 and whole["num_tokens"] == T
        for f in got[2:5] + got[6:9]:
            assert f[1]["recv_x"] == 0 and f[1]["num_out_rows"] == 0 and f[1]["num_fwd_rows"] == 0
        assert largest["num_tokens"] == T and largest["host_token"] not in (0, whole["host_token"])
        assert largest["topk_idx"] == 0 and largest["num_tokens_per_expert"] == 0
        assert largest["is_token_in_rank"] != whole["is_token_in_rank"]  # every token to every rank
        rounds = handle.rounds
        assert rounds.starts == (0, 2, 4) and len(rounds.handles) == 3  # every token everywhere: the least rounds
        for k in range(3):
            note, send = got[9 + 4 * k][1], got[10 + 4 * k][1]
            assert note["num_tokens"] == 2 and note["host_token"] != 0
            assert note["x"] == _row(trace, x, 2 * k) and note["topk_idx"] == _row(trace, idx, 2 * k)
            assert note["is_token_in_rank"] == _row(trace, common["is_token_in_rank"], 2 * k)
            assert note["topk_weights"] == _row(trace, w, 2 * k)
            assert send["num_out_rows"] == R * 2 and send["recv_x"] != trace.norm(recv_x.data_ptr())  # its own
            assert rounds.rows[k].tolist() == list(range(8 * k, 8 * k + 8))
        # The whole call's outputs and DeepEP's handle entries: those of one pass.
        assert recv_x.shape == (R * T, H) and handle.recv_src_meta.shape == (R * T, 8)
        assert handle.send_nvl_head.shape == (NODES * T, 2)
        assert handle.send_rdma_head.data_ptr() != 0 and list(per_expert) == [3] * (host_trace.E // R)

        start = len(trace.events)
        combined, combined_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
        got = _launches(trace, start)
        assert [n.replace("ep_rt_internode_", "") for n, _ in got] == [
            "combine_publish",
            "combine_forward",
            "combine_reduce",
        ] * 3
        for k in range(3):
            publish = got[3 * k][1]
            assert publish["num_tokens"] == 2 and publish["num_in_rows"] == 8
            assert publish["combined_x"] == _row(trace, combined, 2 * k)
            assert publish["combined_topk_weights"] == _row(trace, combined_w, 2 * k)
            assert publish["send_rdma_head"] == trace.norm(rounds.handles[k].send_rdma_head.data_ptr())
        assert combined.shape == (T, H)

        start = len(trace.events)
        again, _, _, _, _, _ = buf.dispatch(x, handle=handle)
        got = _launches(trace, start)
        assert [n.replace("ep_rt_internode_", "") for n, _ in got] == data * 3
        for k in range(3):
            send = got[3 * k][1]
            assert send["cached"] == 1 and send["num_tokens"] == 2 and send["x"] == _row(trace, x, 2 * k)
        assert again.shape == recv_x.shape
        buf.destroy()


def _every_other_token_unless(dense_from: int):
    """Each rank's tokens reach one node and half the ranks (streams of T / 2, 2T rows a rank) in the whole call;
    a round of `dense_from` tokens or more finds every token everywhere. The notify that finds the largest token
    count (no top-k) sends every token everywhere."""

    def counts(p):
        n = p.num_tokens
        if p.topk_idx == 0 or n >= dense_from and n != T:
            return _every_token_everywhere(p)
        return 2 * n, n, n // 2, 2 * n

    return counts


def _round_starts_and_sizes(trace, start):
    notes = [e[-1] for e in trace.events[start:] if e[0] in ("launch", "launch_ex") and e[1].endswith("_notify")]
    return [n["num_tokens"] for n in notes]


def test_rounds_take_as_many_tokens_as_the_counts_say_fit(monkeypatch):
    """T = 6 tokens, streams of 3 and 12 rows a rank in the whole call, against room for streams of 2 and 9 rows:
    the least round (whatever the routing) is 2 tokens, three rounds; the counts say 3.6 tokens fit, so the first
    round takes 3 and the next the 3 left (two rounds)."""
    monkeypatch.setattr(host_trace, "INTERNODE_COUNTS", _every_other_token_unless(T + 1))
    monkeypatch.setattr(internode_rounds, "round_rows", _consecutive_rows)
    with host_trace.driven("internode") as (trace, make):
        buf = host_trace.build({"num_nvl_bytes": NVL, "num_rdma_bytes": RDMA, "explicitly_destroy": True})
        x, idx, w, common = host_trace.ht_inputs(buf)
        start = len(trace.events)
        recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        assert _round_starts_and_sizes(trace, start) == [T, T, 3, 3]  # whole call, largest count, two rounds
        assert handle.rounds.starts == (0, 3) and len(handle.rounds.handles) == 2
        start = len(trace.events)
        buf.combine(recv_x, handle, topk_weights=recv_w)
        publish = [e[-1] for e in trace.events[start:] if e[0] in ("launch", "launch_ex")][::3]
        assert [p["num_tokens"] for p in publish] == [3, 3]
        buf.destroy()


def test_a_round_that_does_not_fit_moves_nothing_and_is_tried_with_fewer_tokens(monkeypatch):
    """Rounds of 3 tokens or more find every token everywhere (streams of 3, 4 ...). The first round's guess (3
    tokens) does not fit: its data kernels skip and the same range is tried with 2 tokens (the least round), which
    fits; its counts (streams of 1) suggest 3 tokens, which do not fit either, and so on in rounds of 2."""
    monkeypatch.setattr(host_trace, "INTERNODE_COUNTS", _every_other_token_unless(3))
    monkeypatch.setattr(internode_rounds, "round_rows", _consecutive_rows)
    with host_trace.driven("internode") as (trace, make):
        buf = host_trace.build({"num_nvl_bytes": NVL, "num_rdma_bytes": RDMA, "explicitly_destroy": True})
        x, idx, w, common = host_trace.ht_inputs(buf)
        start = len(trace.events)
        buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        got = _launches(trace, start)
        names = [n.replace("ep_rt_internode_", "") for n, _ in got]
        data = ["send", "forward", "recv"]
        assert names == ["ep_rt_check_topk_idx"] + ["notify", *data] * 7, names
        sizes = [f["num_tokens"] for n, f in got if n.endswith("_notify")]
        assert sizes == [T, T, 3, 2, 3, 2, 2]
        assert [f["x"] for n, f in got if n.endswith("_notify")][2:] == [_row(trace, x, i) for i in (0, 0, 2, 2, 4)]
        tried = got[9:13]  # the round of 3 tokens: its data kernels told to move nothing
        for _, f in tried[1:]:
            assert f["recv_x"] == 0 and f["num_out_rows"] == 0
        assert got[14][1]["num_out_rows"] == 4  # the round of 2 that fits moves its rows (2 a token)
        assert got[18][1]["recv_x"] == 0 and got[22][1]["num_out_rows"] == 4
        buf.destroy()


def test_a_buffer_below_one_round_raises_naming_the_size_and_moves_nothing(monkeypatch):
    monkeypatch.setattr(host_trace, "INTERNODE_COUNTS", _every_token_everywhere)
    small = nvl_layout.align(lay.nvl_control_offsets(R, NODES)["records"] + 3 * RECORD)  # 3 rows: not 4
    with host_trace.driven("internode") as (trace, make):
        buf = host_trace.build({"num_nvl_bytes": small, "num_rdma_bytes": RDMA, "explicitly_destroy": True})
        x, idx, w, common = host_trace.ht_inputs(buf)
        start = len(trace.events)
        with pytest.raises(BufferTooSmallError, match="less than one round of 4 rows.*num_nvl_bytes >= "):
            buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        names = [n.replace("ep_rt_internode_", "") for n, _ in _launches(trace, start)]
        assert names == ["ep_rt_check_topk_idx", "notify", "send", "forward", "recv"]  # the notify's data skipped
        assert int(buf._ht.workspace[abi.EP_RT_IN_WS_SKIP]) == 1
        buf.destroy()


def test_num_worst_tokens_below_what_arrives_raises_on_every_rank(monkeypatch):
    monkeypatch.setattr(host_trace, "INTERNODE_COUNTS", _every_token_everywhere)
    with host_trace.driven("internode") as (trace, make):
        buf = host_trace.build({"num_nvl_bytes": NVL, "num_rdma_bytes": RDMA, "explicitly_destroy": True})
        x, idx, w, common = host_trace.ht_inputs(buf)
        # 10 > the 9 rows the NVL buffer holds: the host waits for the counts; 24 rows arrive
        with pytest.raises(ValueError, match="num_worst_tokens=10 but a rank receives or forwards 24"):
            buf.dispatch(x, topk_idx=idx, topk_weights=w, num_worst_tokens=10, **common)
        buf.destroy()


@pytest.mark.parametrize(
    "helper,names",
    [("_rdma_hidden_below_one_round", "num_rdma_bytes"), ("_nvl_hidden_below_one_round", "num_nvl_bytes")],
)
def test_the_catalogues_too_large_dispatches_are_below_one_round(monkeypatch, helper, names):
    """The internode bad-input catalogue's dispatches too large for a buffer (ep_rt/testing/bad_inputs.py) must
    still be refused now that larger calls go in rounds: their hidden sizes are below one round of the catalogue's
    Buffer (2 MiB NVL, 64 MiB RDMA), and the error names the buffer the case is about."""
    from types import SimpleNamespace

    from ep_rt.testing import bad_inputs

    monkeypatch.setattr(host_trace, "INTERNODE_COUNTS", _every_token_everywhere)
    with host_trace.driven("internode") as (trace, make):
        buf = host_trace.build({"num_nvl_bytes": 2 << 20, "num_rdma_bytes": 64 << 20, "explicitly_destroy": True})
        x, idx, w, common = host_trace.ht_inputs(buf)
        hidden = getattr(bad_inputs, helper)(SimpleNamespace(buf=buf))
        wide = torch.zeros(x.size(0), hidden, dtype=torch.bfloat16)
        with pytest.raises(BufferTooSmallError, match=f"less than one round.*{names} >= "):
            buf.dispatch(wide, topk_idx=idx, topk_weights=w, **common)
        buf.destroy()
