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
"""

import ctypes
import json

import pytest

from ep_rt.runtime.abi import LowLatencyParams

from tests.host_path_tools import load_stub, repo_root

FIXTURE = repo_root() / "tests" / "data" / "ll_call_trace.json"


@pytest.fixture(scope="module")
def trace():
    stub = load_stub()
    with stub.stubbed():
        return json.loads(json.dumps(stub.trace_ll_sequence()))


def test_the_trace_names_every_pointer(trace):
    """A pointer the names miss would be a run-to-run address, and the comparison below would be vacuous there."""
    # The 64-bit unsigned fields are the pointers; sym_base and error are the fake Buffer's fixed constants.
    pointers = {n for n, t in LowLatencyParams._fields_ if t is ctypes.c_uint64} - {"sym_base", "error"}
    assert {"x", "topk_idx", "recv_x", "peer_bases", "workspace", "mask"} <= pointers
    for e in trace:
        for key, v in e.get("params", {}).items():
            if key in pointers:
                assert v == 0 or isinstance(v, str), f"{e['launch']}.{key} = {v:#x} is no tensor of the sequence"


def test_the_launches_and_parameters_are_those_recorded_before_the_call_plans(trace):
    expected = json.loads(FIXTURE.read_text())
    assert len(trace) == len(expected)
    for i, (got, want) in enumerate(zip(trace, expected)):
        assert got == want, f"entry {i} differs (entries before it: {expected[max(0, i - 3) : i]})"


def test_the_sequence_covers_what_it_claims(trace):
    launches = [e for e in trace if "launch" in e]
    fields = [e["params"] for e in launches]
    assert {e["launch"] for e in launches} == {
        f"ep_rt_ll_{k}" for k in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")
    }
    assert {p["hidden"] for p in fields} == {256, 512} and {p["use_fp8"] for p in fields} == {0, 1}
    assert any(p["use_ue8m0"] for p in fields) and any(p["use_logfmt"] for p in fields)
    assert any(p["zero_copy"] for p in fields) and any(p["has_remote_peers"] for p in fields)
    assert {p["buffer_idx"] for p in fields} == {0, 1} and {p["topk_idx_bits"] for p in fields} == {32, 64}
    assert any(p["mask"] for p in fields) and any(p["num_tokens"] == 0 for p in fields)
    assert {e["stream"] for e in launches} == {"comm", "compute"}
    assert any(e["config"] and e["config"]["programmatic"] for e in launches)  # eager receive: early launch
    assert any(e["config"] is None and e["launch"].endswith("recv") for e in launches)  # hook receive
