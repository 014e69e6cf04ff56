"""CPU tests: importing without a GPU, Config validation and tables, buffer layout arithmetic."""

import subprocess
import sys

import pytest

import ep_rt
from ep_rt import Buffer, Config
from ep_rt.runtime import abi as params
from ep_rt.transport import nvl_layout as buffer_layout
from ep_rt.transport.ll_layout import rdma_size_hint


def test_import_touches_no_driver():
    code = (
        "import ep_rt, ep_rt.runtime.driver as d; "
        "assert d._cu.cache_info().currsize == 0 and d._initialised.cache_info().currsize == 0; "
        "print(ep_rt.topk_idx_t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "torch.int64"


def test_public_surface():
    for name in ("Buffer", "Config", "EventOverlap", "EventHandle", "topk_idx_t"):
        assert hasattr(ep_rt, name)
    assert Buffer.num_sms == 20


def test_config_defaults_and_deepep_rounding():
    c = Config()
    assert (c.num_sms, c.num_max_nvl_chunked_send_tokens, c.num_max_nvl_chunked_recv_tokens) == (20, 6, 256)
    assert Config(24, 6, 256, 6, 128).num_max_rdma_chunked_recv_tokens == 132  # rounded up to a multiple of 6
    with pytest.raises(Exception):
        c.num_sms = 3  # frozen


@pytest.mark.parametrize(
    "args,match",
    [
        ((0,), "num_sms"),
        ((200,), "num_sms"),
        ((20, 0, 256), "NVL chunk"),
        ((20, 256, 256), "send_tokens must be <"),
        ((20, 6, 256, 0, 128), "RDMA"),
        ((20, 6, 256, 100, 50), "half"),
        ((20.0,), "int"),
        ((True,), "int"),
    ],
)
def test_config_validation(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Config(*args)


def test_tuned_tables():
    for r, nvl_send in ((2, 24), (4, 6), (8, 6)):
        assert Buffer.get_dispatch_config(r).num_max_nvl_chunked_send_tokens == nvl_send
    assert Buffer.get_combine_config(2).num_max_nvl_chunked_send_tokens == 10
    assert Buffer.get_combine_config(8).num_max_nvl_chunked_send_tokens == 4
    assert Buffer.get_dispatch_config(2).num_sms == Buffer.num_sms
    with pytest.raises(ValueError, match="multiple of the ranks per node"):
        Buffer.get_dispatch_config(12, num_ranks_per_node=8)


def test_set_num_sms_rules():
    old = Buffer.num_sms
    try:
        Buffer.set_num_sms(24)
        assert Buffer.get_dispatch_config(2).num_sms == 24
        with pytest.raises(ValueError):
            Buffer.set_num_sms(23)
    finally:
        Buffer.num_sms = old


def test_nvl_hint_holds_the_workload():
    hint = Config(24).get_nvl_buffer_size_hint(7168 * 2, 2, 4096)
    data = hint
    dispatch_cap = buffer_layout.DispatchRows(7168 * 2, 7168 * 2 // 128, 32).fill(params.DispatchRegion(), data)
    combine_cap = buffer_layout.CombineRows(7168, 32).fill(params.CombineRegion(), data)
    assert dispatch_cap >= 2 * 4096 and combine_cap >= 2 * 4096
    assert hint % 128 == 0
    with pytest.raises(ValueError):
        Config().get_nvl_buffer_size_hint(100, 2)
    with pytest.raises(ValueError, match="multiple of the ranks per node"):
        Config().get_nvl_buffer_size_hint(128, 9, num_ranks_per_node=8)  # 9 ranks are not nodes of 8


def test_soa_regions_do_not_overlap_and_fit():
    region = params.DispatchRegion()
    rows = buffer_layout.DispatchRows(hidden_bytes=7168, num_scales=56, num_topk=8)
    cap = rows.fill(region, 50 * (1 << 20))
    spans = [
        (region.x, 7168),
        (region.scales, 4 * 56),
        (region.topk_idx, 64),
        (region.topk_weights, 32),
        (region.src_idx, 4),
    ]
    ends = [off + w * cap for off, w in spans]
    for (off, _), end, (nxt, _) in zip(spans, ends, spans[1:]):
        assert off % 128 == 0 and end <= nxt
    assert ends[-1] <= 50 * (1 << 20)


def test_control_region_layout():
    offs = buffer_layout.CONTROL_OFFSETS
    assert offs["notify_slots"] == 0
    assert offs["barrier_flags"] >= params.EP_RT_MAX_NVL_RANKS * params.EP_RT_NOTIFY_SLOT_BYTES
    assert buffer_layout.CONTROL_BYTES % 4096 == 0 and buffer_layout.CONTROL_BYTES > offs["error_claim"]
    # the notify slot holds the largest per-expert table
    assert params.EP_RT_NOTIFY_EXPERT_COUNTS + params.EP_RT_MAX_LOCAL_EXPERTS <= params.EP_RT_NOTIFY_SLOT_BYTES // 4


def test_low_latency_size_hint_matches_deepep_example():
    assert rdma_size_hint(128, 7168, 2, 288) == 2146961792
    assert Buffer.get_low_latency_rdma_size_hint(128, 7168, 2, 288) == 2146961792


def test_sm90_compiled_reads_the_manifest():
    assert Buffer.is_sm90_compiled()
