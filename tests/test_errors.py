"""Kernel error records become exceptions whose messages name the rank, the peer and the phase."""
import pytest

from ep_rt import errors
from ep_rt.runtime import abi as params


def record(**fields):
    r = params.ErrorRecord()
    for k, v in fields.items():
        setattr(r, k, v)
    return r


def test_clear_record_is_no_error():
    assert errors.error_from_record(record()) is None


@pytest.mark.parametrize("fields,cls,words", [
    (dict(code=1, phase=2, rank=0, peer=3, channel=-1, detail0=7, detail1=6), errors.CommTimeoutError,
     ["rank 0", "rank 3", "notify", "EP_RT_TIMEOUT_S"]),
    (dict(code=1, phase=8, rank=1, peer=0, channel=-1), errors.CommTimeoutError, ["rank 1", "low-latency combine"]),
    (dict(code=1, phase=7, rank=1, peer=-1, channel=-1, detail0=300, detail1=528), errors.CommTimeoutError,
     ["rank 1", "low-latency dispatch (receiving)", "its own kernel", "300", "528", "MPS"]),
    (dict(code=2, phase=4, rank=0, peer=1, channel=0, detail0=900, detail1=800), errors.BufferTooSmallError,
     ["900", "800", "num_nvl_bytes"]),
    (dict(code=3, phase=4, rank=1, peer=1, detail0=70, detail1=64), errors.KernelError, ["num_worst_tokens=64"]),
    (dict(code=4, phase=2, rank=0, peer=1, detail0=256, detail1=8), errors.KernelError, ["same hidden size"]),
    (dict(code=5, phase=9, rank=0, peer=-1, detail0=300, detail1=288), errors.KernelError, ["300", "num_experts is 288"]),
    (dict(code=2, phase=9, rank=0, peer=-1, detail0=129, detail1=128), errors.KernelError,
     ["num_max_dispatch_tokens_per_rank"]),
])
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
    rec.code = errors.ERR_TIMEOUT
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
    buf._ht = object()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="num_worst_tokens"):
        buf.dispatch(torch.zeros(1, 8, dtype=torch.bfloat16))
    buf.destroyed = True
