"""The high-throughput host path launches exactly what it launched before its call plans (issue 23 item 2).

tests/data/ht_call_trace.json was written by `python tools/host_path_stub.py --trace-ht tests/data/ht_call_trace.json`
at 47fd4f9's ep_rt, BEFORE ep_rt/ops/intranode.py, internode.py and layout.py got their per-shape call plans. It holds,
for a fixed sequence of layout, dispatch, cached dispatch and combine calls on a fake intranode and a fake internode
Buffer (tools/host_path_stub.py trace_ht_sequence: shapes, top-k widths, expert and channel counts, alignments, scale
dtypes changing, num_worst_tokens, no top-k, config=None, async_finish, previous_event, allocate_on_comm_stream, no
tokens, a shape seen before), every kernel launch (kernel, grid, block, smem, stream, launch config, every field of
the parameter struct), every stream wait and every record_stream, in order. Pointers are named by the tensor they
point at ("&intranode.D2[4][0]": the first handle tensor of dispatch D2); the few internal ones by first appearance.
Regenerate it only for an intended change of what the kernels receive, and say so in the commit. Edited, not
regenerated, for issue 22's intranode rounds: every intranode dispatch and combine entry gained round_rpm, full_rpm,
round (and token_offset, dispatch) as 0, what one pass passes, and the combine's pad field (now round) went.
"""

import ctypes
import json

import pytest

from tests.host_path_tools import load_stub, repo_root

FIXTURE = repo_root() / "tests" / "data" / "ht_call_trace.json"


@pytest.fixture(scope="module")
def trace():
    stub = load_stub()
    with stub.stubbed():
        return json.loads(json.dumps(stub.trace_ht_sequence()))


def test_the_trace_names_every_pointer(trace):
    """A raw address would differ from run to run, and the comparison below would be meaningless there."""
    stub = load_stub()
    pointers = {n for t in stub.S.params_types.values() for n, ft in t._fields_ if ft is ctypes.c_uint64}
    assert {"x", "recv_x", "topk_idx", "send_pos", "combined_x", "recv_src_meta"} <= pointers
    for e in trace:
        for key, v in e.get("params", {}).items():
            if key in pointers:
                assert v == 0 or isinstance(v, str) or v < 1 << 32, f"{e['launch']}.{key} = {v:#x} is unnamed"


def test_the_launches_and_parameters_are_those_recorded_before_the_call_plans(trace):
    expected = json.loads(FIXTURE.read_text())
    assert len(trace) == len(expected)
    for i, (got, want) in enumerate(zip(trace, expected)):
        assert got == want, f"entry {i} differs (entries before it: {expected[max(0, i - 3) : i]})"


def test_the_sequence_covers_what_it_claims(trace):
    launches = [e for e in trace if "launch" in e]
    names = {e["launch"] for e in launches}
    assert {
        "ep_rt_get_dispatch_layout",
        "ep_rt_intranode_notify",
        "ep_rt_intranode_dispatch",
        "ep_rt_intranode_combine",
    } <= names
    assert {
        f"ep_rt_internode_{k}"
        for k in ("notify", "send", "forward", "recv", "combine_publish", "combine_forward", "combine_reduce")
    } <= names
    intra = [e["params"] for e in launches if e["launch"] == "ep_rt_intranode_dispatch"]
    assert {p["hidden_bytes"] for p in intra} >= {256, 512, 768, 1024}
    assert {p["num_topk"] for p in intra} == {0, 2, 4} and {p["num_channels"] for p in intra} >= {4, 6, 20}
    assert {p["handshake"] for p in intra} == {0, 1} and {p["fill_unused_rows"] for p in intra} == {0, 1}
    assert {p["topk_idx_bits"] for p in intra} == {32, 64} and {p["num_scales"] for p in intra} >= {0, 2, 3, 4}
    inter = [e["params"] for e in launches if e["launch"] == "ep_rt_internode_send"]
    assert {p["cached"] for p in inter} == {0, 1} and {p["num_experts"] for p in inter} >= {8, 16}
    assert {p["expert_alignment"] for p in inter} >= {1, 2, 4} and any(p["num_tokens"] == 0 for p in inter)
    assert {e["stream"] for e in launches} == {"comm"}
    assert any("record_stream" in e for e in trace) and any("wait" in e for e in trace)
