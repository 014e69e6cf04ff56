"""Kernel error records become exceptions whose messages name the rank, the peer and the phase."""

import ast
import re

import pytest

from ep_rt import errors
from ep_rt.runtime import abi as params

from ..repo import REPO


def record(**fields):
    r = params.ErrorRecord()
    for k, v in fields.items():
        setattr(r, k, v)
    return r


def test_clear_record_is_no_error():
    assert errors.error_from_record(record()) is None


@pytest.mark.parametrize(
    "fields,cls,words",
    [
        (
            dict(code=1, phase=2, rank=0, peer=3, channel=-1, detail0=7, detail1=6),
            errors.CommTimeoutError,
            ["rank 0", "rank 3", "notify", "EP_RT_TIMEOUT_S"],
        ),
        (dict(code=1, phase=8, rank=1, peer=0, channel=-1), errors.CommTimeoutError, ["rank 1", "low-latency combine"]),
        (
            dict(code=1, phase=7, rank=1, peer=-1, channel=-1, detail0=300, detail1=528),
            errors.CommTimeoutError,
            ["rank 1", "low-latency dispatch (receiving)", "its own kernel", "300", "528", "MPS"],
        ),
        (
            dict(code=2, phase=4, rank=0, peer=1, channel=0, detail0=900, detail1=800),
            errors.BufferTooSmallError,
            ["900", "800", "num_nvl_bytes"],
        ),
        (dict(code=3, phase=4, rank=1, peer=1, detail0=70, detail1=64), errors.KernelError, ["num_worst_tokens=64"]),
        (dict(code=4, phase=2, rank=0, peer=1, detail0=256, detail1=8), errors.KernelError, ["same hidden size"]),
        (
            dict(code=5, phase=9, rank=0, peer=-1, detail0=300, detail1=288),
            errors.KernelError,
            ["300", "num_experts is 288"],
        ),
        (
            dict(code=2, phase=9, rank=0, peer=-1, detail0=129, detail1=128),
            errors.KernelError,
            ["num_max_dispatch_tokens_per_rank"],
        ),
    ],
)
def test_messages(fields, cls, words):
    e = errors.error_from_record(record(**fields))
    assert isinstance(e, cls)
    for w in words:
        assert w in str(e), (w, str(e))


def test_buffer_raise_if_failed_checks_every_part_and_parts_fail_alone():
    from ep_rt import Buffer
    from ep_rt.transport.error_record import ErrorRecords

    buf = object.__new__(Buffer)
    buf.destroyed = False
    buf._errors = records = ErrorRecords(mapped=False)
    buf.raise_if_failed()  # all clear
    rec = records.record("low_latency")
    rec.phase, rec.rank, rec.peer, rec.detail0, rec.detail1 = 7, 0, 1, 3, 2
    rec.code = params.EP_RT_ERR_TIMEOUT
    with pytest.raises(errors.CommTimeoutError, match="waiting for rank 1"):
        buf.raise_if_failed()
    records.raise_if_failed("nvl")  # the NVL part keeps working
    with pytest.raises(errors.CommTimeoutError):
        records.raise_if_failed("low_latency")
    buf.destroyed = True  # keeps __del__ quiet


def test_dispatch_without_num_worst_tokens_refuses_graph_capture(monkeypatch):
    """Sizing the outputs from the routing needs a host read, which a graph cannot replay: a clear error."""
    from types import SimpleNamespace

    import torch

    from ep_rt import Buffer

    buf = object.__new__(Buffer)
    buf.destroyed = False
    buf._nvl = SimpleNamespace(raise_if_failed=lambda: None)
    buf._ht = SimpleNamespace(raise_if_failed=lambda: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="num_worst_tokens"):
        buf.dispatch(torch.zeros(1, 8, dtype=torch.bfloat16))
    buf.destroyed = True


# --- one source for the kernel interface: params.h's codes and phases, abi.py's names, errors.py's words ---
PARAMS_H = REPO / "kernels_src" / "include" / "ep_rt" / "params.h"
ERRORS_PY = REPO / "ep_rt" / "errors.py"


def header_codes_and_phases(text):
    """{name: value} of every `#define EP_RT_ERR_* N` and `#define EP_RT_PHASE_* N` in a header."""
    return {
        name: int(value)
        for name, value in re.findall(r"^[ \t]*#[ \t]*define[ \t]+(EP_RT_(?:ERR|PHASE)_\w+)[ \t]+(\d+)\b", text, re.M)
    }


def missing_words(text):
    problems = []
    for name, value in sorted(header_codes_and_phases(text).items()):
        if getattr(params, name, None) != value:
            problems.append(f"{name} = {value} in params.h, {getattr(params, name, None)} in ep_rt/runtime/abi.py")
        table = errors.ERROR_CODES if name.startswith("EP_RT_ERR_") else errors.PHASES
        if not table.get(value):
            problems.append(
                f"{name} ({value}) has no words in ep_rt/errors.py "
                f"({'ERROR_CODES' if table is errors.ERROR_CODES else 'PHASES'})"
            )
    return problems


def test_every_code_and_phase_of_params_h_has_words_in_errors_py():
    found = header_codes_and_phases(PARAMS_H.read_text(encoding="utf-8"))
    # the parse itself must have found them: 6 codes and 19 phases as of this writing
    assert sum(n.startswith("EP_RT_ERR_") for n in found) >= 6
    assert sum(n.startswith("EP_RT_PHASE_") for n in found) >= 19
    assert missing_words(PARAMS_H.read_text(encoding="utf-8")) == []
    # and no words for a number params.h does not define
    assert set(errors.PHASES) == {v for n, v in found.items() if n.startswith("EP_RT_PHASE_")}
    assert set(errors.ERROR_CODES) == {v for n, v in found.items() if n.startswith("EP_RT_ERR_")}
    assert errors.INTERNODE_PHASES == {v for n, v in found.items() if n.startswith("EP_RT_PHASE_IN_")}


def test_a_new_phase_or_code_without_words_fails_the_check():
    text = PARAMS_H.read_text(encoding="utf-8")
    text += "\n#define EP_RT_PHASE_IN_SOMETHING_NEW 97\n#define EP_RT_ERR_NEW 98\n"
    problems = missing_words(text)
    assert any("EP_RT_PHASE_IN_SOMETHING_NEW (97) has no words" in p for p in problems), problems
    assert any("EP_RT_ERR_NEW (98) has no words" in p for p in problems), problems
    assert any("EP_RT_PHASE_IN_SOMETHING_NEW = 97 in params.h, None in ep_rt/runtime/abi.py" in p for p in problems)


def test_every_error_code_has_a_message_of_its_own():
    """No code of params.h falls through to the catch-all 'kernel error code N' message, in any phase."""
    for code in set(errors.ERROR_CODES) - {params.EP_RT_ERR_NONE}:
        for phase in errors.PHASES:
            for peer in (-1, 1):
                for ranks_per_node in (None, 2):
                    text = str(errors.describe_kernel_error(code, phase, 0, peer, -1, 3, 2, ranks_per_node))
                    assert "kernel error code" not in text, (code, phase, peer, ranks_per_node, text)
                    assert errors.PHASES[phase] in text, (code, phase, text)


def test_the_decoder_writes_no_code_or_phase_number():
    """errors.py names codes and phases by their abi.py mirrors: no comparison of `code` / `phase` with a number, no
    number above 1 anywhere (0 and 1 remain for signs and indexes)."""
    tree = ast.parse(ERRORS_PY.read_text(encoding="utf-8"))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value > 1:
            problems.append(f"line {node.lineno}: the number {node.value}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(
                isinstance(s, ast.Name)
                and s.id in ("code", "phase")
                or isinstance(s, ast.Attribute)
                and s.attr in ("code", "phase")
                for s in sides
            )
            numbers = [c for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant) and type(c.value) is int]
            if named and numbers:
                problems.append(f"line {node.lineno}: compares code / phase with {[c.value for c in numbers]}")
    assert problems == [], problems


def test_peer_may_be_gone_sees_a_recorded_or_host_timeout_and_rearms_nothing():
    """Buffer.destroy() skips NVSHMEM's collective teardown when a peer already timed out (issue 25 item 5): a
    kernel's timeout record or a host-side timeout counts, a recoverable error does not, and looking re-arms
    nothing (the part's own teardown rule still sees the recoverable error)."""
    from ep_rt.transport.error_record import ErrorRecords

    records = ErrorRecords(mapped=False)
    assert not records.peer_may_be_gone()
    bad = records.record("nvl")
    bad.phase, bad.rank, bad.peer, bad.detail0, bad.detail1 = 0, 0, 1, 3, 2
    bad.code = params.EP_RT_ERR_BAD_EXPERT  # recoverable: the call completed everywhere
    records.on_rearm("nvl", lambda: None)
    assert not records.peer_may_be_gone()
    assert bad.code == params.EP_RT_ERR_BAD_EXPERT  # not re-armed by looking
    rec = records.record("low_latency")
    rec.phase, rec.rank, rec.peer, rec.detail0, rec.detail1 = 7, 0, 1, 3, 2
    rec.code = params.EP_RT_ERR_TIMEOUT
    assert records.peer_may_be_gone()
    host = ErrorRecords(mapped=False)
    host.fail("internode", errors.CommTimeoutError("rank 0: host timed out waiting for rank 3"))
    assert host.peer_may_be_gone()


def test_a_recoverable_error_is_seen_once_then_the_next_one_too():
    """check() reads each slot's code word through a view made once (the hot path): a record written after
    that, re-armed, and written again is still seen each time, and a host-set failure wins over a clear record."""
    from ep_rt.transport.error_record import ErrorRecords

    records = ErrorRecords(mapped=False)
    rearmed = []
    records.on_rearm("low_latency", lambda: rearmed.append(1))
    assert records.check("low_latency") is None  # (the view is made here)
    for n in (1, 2):
        rec = records.record("low_latency")
        rec.phase, rec.rank, rec.peer, rec.detail0, rec.detail1 = 0, 0, 1, 300, 288
        rec.code = params.EP_RT_ERR_BAD_EXPERT
        import torch

        sync = torch.cuda.synchronize
        torch.cuda.synchronize = lambda *a: None  # (the re-arm syncs; no GPU here)
        try:
            assert isinstance(records.check("low_latency"), errors.EpRtError)
        finally:
            torch.cuda.synchronize = sync
        assert records.check("low_latency") is None and len(rearmed) == n
    records.fail("low_latency", errors.CommTimeoutError("rank 0: host timed out waiting for rank 1"))
    assert isinstance(records.check("low_latency"), errors.CommTimeoutError)
    records.destroy(collective=False)
    assert records.check("nvl") is None
