"""The low-latency host path launches exactly what it launched before its call plans (issue 23 item 2).

tests/data/ll_call_trace.json was written by `python tools/host_path_stub.py --trace-ll tests/data/ll_call_trace.json`
at c891e12, BEFORE ep_rt/ops/low_latency.py got its per-shape call plans and events.py its reused fence events. It
holds, for a fixed sequence of LL calls run with every CUDA call stubbed (tools/host_path_stub.py trace_ll_sequence:
shapes changing, FP8 / BF16 / UE8M0 / LogFMT / zero_copy, hooks on and off, a hook called late, async_finish, a
CUDA-graph capture, a shrink Buffer with a peer behind the network), every kernel launch (kernel, grid, block, smem,
stream, launch config, every field of the parameter struct) and every stream wait and record_stream, in order.
Pointers are named by the tensor they point at ("&c3[2][0]": the first handle tensor of the third call), so the
comparison is exact wherever run-to-run addresses do not matter. Regenerate it only for an intended change of what
the kernels receive, and say so in the commit.

Since issue 23 item 3 an eager call is one kernel (ep_rt_ll_dispatch / ep_rt_ll_combine, launched cooperatively)
where the trace has the send kernel and the receive kernel started early behind it. The comparison folds each such
pair of the recorded trace into the one launch that replaces it, after checking that the pair's two parameter
structs were equal (so the one kernel gets every field both halves got); with EP_RT_LL_TWO_KERNELS the trace must be
the recorded one as it is.
"""

import ctypes
import json

import pytest

from ep_rt.ops.low_latency import LowLatencyOp
from ep_rt.runtime.abi import LowLatencyParams

from tests.host_path_tools import load_stub, repo_root

FIXTURE = repo_root() / "tests" / "data" / "ll_call_trace.json"


def _trace(two_kernels=False):
    stub = load_stub()
    saved = LowLatencyOp.two_kernels
    LowLatencyOp.two_kernels = two_kernels  # what EP_RT_LL_TWO_KERNELS sets when an op is made
    try:
        with stub.stubbed():
            return json.loads(json.dumps(stub.trace_ll_sequence()))
    finally:
        LowLatencyOp.two_kernels = saved


@pytest.fixture(scope="module")
def trace():
    return _trace()


# The stub's one-kernel grids (tools/host_path_stub.py ll_buffer: as LowLatencyOp sizes them on 132 SMs).
FUSED_GRID = {"dispatch": 132, "combine": 264}
COOPERATIVE = {"cluster": 1, "cooperative": True, "programmatic": False}


def fold_eager_pairs(recorded):
    """The recorded trace with every eager call's (send, early receive) pair replaced by its one kernel."""
    blocks = load_stub().MOD.entry["blocks"]
    out, i = [], 0
    while i < len(recorded):
        e = recorded[i]
        nxt = recorded[i + 1] if i + 1 < len(recorded) else {}
        kind = e.get("launch", "").removeprefix("ep_rt_ll_").removesuffix("_send")
        early_recv = nxt.get("launch") == f"ep_rt_ll_{kind}_recv" and (nxt.get("config") or {}).get("programmatic")
        if e.get("launch", "").endswith("_send") and early_recv:
            assert nxt["params"] == e["params"], f"entry {i}: the receive kernel got other parameters than its send"
            assert nxt["stream"] == e["stream"]
            name = f"ep_rt_ll_{kind}"
            out.append(
                {
                    "block": blocks[name],
                    "config": COOPERATIVE,
                    "grid": FUSED_GRID[kind],
                    "launch": name,
                    "params": e["params"],
                    "smem": 0,
                    "stream": e["stream"],
                }
            )
            i += 2
        else:
            out.append(e)
            i += 1
    return out


def test_the_trace_names_every_pointer(trace):
    """A pointer the names miss would be a run-to-run address, and the comparison below would be vacuous there."""
    # The 64-bit unsigned fields are the pointers; sym_base and error are the fake Buffer's fixed constants.
    pointers = {n for n, t in LowLatencyParams._fields_ if t is ctypes.c_uint64} - {"sym_base", "error"}
    assert {"x", "topk_idx", "recv_x", "peer_bases", "workspace", "mask"} <= pointers
    for e in trace:
        for key, v in e.get("params", {}).items():
            if key in pointers:
                assert v == 0 or isinstance(v, str), f"{e['launch']}.{key} = {v:#x} is no tensor of the sequence"


def _same(got_trace, expected):
    assert len(got_trace) == len(expected)
    for i, (got, want) in enumerate(zip(got_trace, expected)):
        assert got == want, f"entry {i} differs (entries before it: {expected[max(0, i - 3) : i]})"


def test_the_launches_and_parameters_are_those_recorded_before_the_call_plans(trace):
    expected = fold_eager_pairs(json.loads(FIXTURE.read_text()))
    assert sum(e.get("launch") in ("ep_rt_ll_dispatch", "ep_rt_ll_combine") for e in expected) >= 8  # folded
    _same(trace, expected)


def test_two_kernels_per_eager_call_launch_exactly_what_was_recorded():
    _same(_trace(two_kernels=True), json.loads(FIXTURE.read_text()))


def test_the_sequence_covers_what_it_claims(trace):
    launches = [e for e in trace if "launch" in e]
    fields = [e["params"] for e in launches]
    assert {e["launch"] for e in launches} == {
        f"ep_rt_ll_{k}"
        for k in ("dispatch", "combine", "dispatch_send", "dispatch_recv", "combine_send", "combine_recv")
    }
    # eager calls: one cooperative kernel each; hooked calls: send now, receive from the hook (no config)
    assert all(e["config"] == COOPERATIVE for e in launches if e["launch"] in ("ep_rt_ll_dispatch", "ep_rt_ll_combine"))
    assert {p["hidden"] for p in fields} == {256, 512} and {p["use_fp8"] for p in fields} == {0, 1}
    assert any(p["use_ue8m0"] for p in fields) and any(p["use_logfmt"] for p in fields)
    assert any(p["zero_copy"] for p in fields) and any(p["has_remote_peers"] for p in fields)
    assert {p["buffer_idx"] for p in fields} == {0, 1} and {p["topk_idx_bits"] for p in fields} == {32, 64}
    assert any(p["mask"] for p in fields) and any(p["num_tokens"] == 0 for p in fields)
    assert {e["stream"] for e in launches} == {"comm", "compute"}
    assert any(e["config"] is None and e["launch"].endswith("recv") for e in launches)  # hook receive
