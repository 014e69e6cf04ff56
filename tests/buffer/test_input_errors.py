"""Bad expert ids without a device sync (issue 23 item 1): the layout family's kernels report an id outside
[-1, num_experts) into the Buffer's "input" error record; the host raises it at the end of a call, after every kernel
of that call has launched (so the peers' calls complete), and the Buffer stays usable. On the CPU, with CUDA stubbed
(tests/host_trace.py): a record written here stands for the kernel's."""

import pytest
import torch

from ep_rt.errors import KernelError
from ep_rt.runtime import abi
from ep_rt.transport.error_record import INPUT_SLOT

from .. import host_trace


def _launched(trace, start):
    return [e[1] for e in trace.events[start:] if e[0] in ("launch", "launch_ex")]


def _kernel_reports(buf, bad_id, phase=abi.EP_RT_PHASE_DISPATCH_IDS):
    rec = buf._errors.record(INPUT_SLOT)
    rec.phase, rec.rank, rec.peer, rec.channel = phase, buf.rank, -1, -1
    rec.detail0, rec.detail1 = bad_id, host_trace.E
    rec.code = abi.EP_RT_ERR_BAD_EXPERT


@pytest.mark.parametrize("scenario", ["intranode", "internode"])
def test_a_bad_id_is_raised_at_the_end_of_the_dispatch_after_all_its_launches(scenario):
    with host_trace.driven(scenario) as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        start = len(trace.events)
        _kernel_reports(buf, host_trace.E + 3)
        with pytest.raises(
            KernelError, match=f"dispatch \\(checking topk_idx\\): topk_idx holds expert id {host_trace.E + 3}"
        ):
            buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        launched = _launched(trace, start)
        assert launched[0] == "ep_rt_check_topk_idx" and len(launched) >= 3, launched  # then the whole dispatch
        recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)  # re-armed
        buf.combine(recv_x, handle, topk_weights=recv_w)
        buf.destroy()


def test_the_check_is_launched_before_the_notify_with_the_ids_and_only_where_there_are_ids(monkeypatch):
    with host_trace.driven("intranode") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        start = len(trace.events)
        recv_x, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        assert _launched(trace, start)[:2] == ["ep_rt_check_topk_idx", "ep_rt_intranode_notify"]
        p = buf._layout.checker.params
        assert p.topk_idx == idx.data_ptr() and p.num_tokens == idx.size(0) and p.num_topk == idx.size(1)
        assert p.num_experts == host_trace.E and p.topk_idx_bits == 64 and p.error == buf._errors.device_ptr(INPUT_SLOT)
        assert p.error_phase == abi.EP_RT_PHASE_DISPATCH_IDS and p.error_claim == buf._layout.claim.data_ptr()
        start = len(trace.events)
        buf.dispatch(x, handle=handle)  # cached: no ids
        buf.dispatch(x, **common)  # no top-k
        assert "ep_rt_check_topk_idx" not in _launched(trace, start)
        monkeypatch.setenv("EP_RT_CHECK_VALUES", "0")
        start = len(trace.events)
        buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        buf.get_dispatch_layout(idx, host_trace.E)
        assert "ep_rt_check_topk_idx" not in _launched(trace, start)
        assert buf._layout.kernel.params.error == 0  # the layout kernel does not check either
        monkeypatch.delenv("EP_RT_CHECK_VALUES")
        buf.get_dispatch_layout(idx, host_trace.E)
        lp = buf._layout.kernel.params
        assert lp.error == buf._errors.device_ptr(INPUT_SLOT) and lp.error_phase == abi.EP_RT_PHASE_LAYOUT_IDS
        buf.destroy()


def test_the_layouts_report_is_raised_by_the_next_call_to_end_and_never_at_a_calls_start():
    """get_dispatch_layout cannot see its own report without a sync: a later call raises it at its end, after its
    kernels launched (a raise at a call's start would leave the peers of a collective call waiting)."""
    with host_trace.driven("intranode") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        _kernel_reports(buf, -5, phase=abi.EP_RT_PHASE_LAYOUT_IDS)
        start = len(trace.events)
        with pytest.raises(
            KernelError, match="get_dispatch_layout \\(checking topk_idx\\): topk_idx holds expert id -5"
        ):
            buf.dispatch(x, topk_idx=idx, topk_weights=w, **common)
        assert "ep_rt_intranode_dispatch" in _launched(trace, start)
        buf.raise_if_failed()  # reported once, then re-armed
        buf.destroy()


def test_inside_a_capture_the_report_waits_for_a_call_outside_it(monkeypatch):
    with host_trace.driven("intranode") as (trace, make):
        buf = make()
        x, idx, w, common = host_trace.ht_inputs(buf)
        _kernel_reports(buf, host_trace.E)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        buf.dispatch(x, topk_idx=idx, topk_weights=w, num_worst_tokens=32, **common)  # re-arming would synchronise
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        with pytest.raises(KernelError, match="topk_idx holds expert id"):
            buf.raise_if_failed()
        buf.destroy()
