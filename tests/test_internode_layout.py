"""The internode symmetric-buffer layout, size hints, handle checks and error messages (CPU only)."""
import pytest
import torch

from ep_rt import reference
from ep_rt.errors import BufferTooSmallError, CommTimeoutError, describe_kernel_error
from ep_rt.handles import InternodeHandle, IntranodeHandle
from ep_rt.ops import ht_args
from ep_rt.runtime import abi
from ep_rt.transport import internode_layout as lay


def test_control_area_follows_the_data_and_is_aligned():
    R, N, nbytes = 16, 2, 1 << 20
    off = lay.control_offsets(nbytes, R, N)
    names = [k for k in off if k != "end"]
    assert off[names[0]] >= nbytes
    values = [off[k] for k in names] + [off["end"]]
    assert values == sorted(values) and all(v % lay.ALIGN == 0 for v in values)
    # Every region has room for its words.
    assert off["notify_recv"] - off["notify_send"] >= R * abi.EP_RT_IN_NOTIFY_SLOT_BYTES
    assert off["combine_words"] - off["dispatch_words"] >= N * abi.EP_RT_MAX_CHANNELS * 8
    assert off["end"] - off["barrier_words"] >= R * 8


def test_fill_gives_both_halves_and_the_capacity():
    p = abi.InternodeParams()
    ctrl = lay.control_offsets(10 << 20, 4, 2)
    cap = lay.fill(p.lay, ctrl, 10 << 20, 2, 1024)
    assert (p.lay.stage, p.lay.recv) == (0, lay.half_bytes(10 << 20))
    assert cap == p.lay.cap == lay.half_bytes(10 << 20) // (2 * 1024)
    assert p.lay.recv + 2 * cap * 1024 <= 10 << 20 <= ctrl["notify_send"]
    assert p.lay.notify_words == ctrl["notify_words"] and p.lay.end == ctrl["end"]


@pytest.mark.parametrize("hidden,G,R", [(7168, 8, 16), (4096, 2, 4), (2048, 1, 4)])
def test_size_hints_hold_a_dispatch_and_its_combine(hidden, G, R):
    T, N = 4096, R // G
    rdma = lay.rdma_size_hint(hidden * 2, R, G, T)
    for record in (lay.dispatch_record_bytes(hidden * 2, 0, 8), lay.dispatch_record_bytes(hidden, hidden // 128, 8),
                   lay.combine_record_bytes(hidden, 8), lay.combine_record_bytes(hidden, 32)):
        assert lay.capacity(rdma, N, record) >= T, record
    nvl = lay.nvl_size_hint(hidden * 2, R, T)
    assert nvl // lay.combine_record_bytes(hidden, 32) >= R * T


def test_records_are_16_byte_multiples():
    assert lay.dispatch_record_bytes(7168 * 2, 0, 8) == 7168 * 2 + 64 + 8 + 8
    assert lay.dispatch_record_bytes(16, 1, 1) % 16 == 0
    assert lay.combine_record_bytes(8, 1) == 32


def _handle(R=4, G=2, T=16, C=3, E=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(T, 64, generator=g).to(torch.bfloat16) for _ in range(R)]
    idxs = [torch.randint(0, E, (T, 4), generator=g) for _ in range(R)]
    ws = [torch.rand(T, 4, generator=g) for _ in range(R)]
    ref = reference.internode_dispatch(xs, idxs, ws, E, C, G)
    return InternodeHandle(*ref[0]["handle"])


def test_internode_handle_checks_shapes_and_kind():
    h = _handle()
    assert ht_args.check_internode_handle(h, 4, 2, torch.device("cpu")) is h
    rebuilt = ht_args.check_internode_handle(tuple(h), 4, 2, torch.device("cpu"))
    assert isinstance(rebuilt, InternodeHandle)
    with pytest.raises(ValueError, match="columns"):
        ht_args.check_internode_handle(h, 8, 4, torch.device("cpu"))
    bad = list(h)
    bad[4] = bad[4][:1]
    with pytest.raises(ValueError, match="recv_rdma_rank_prefix_sum"):
        ht_args.check_internode_handle(tuple(bad), 4, 2, torch.device("cpu"))
    intra = IntranodeHandle(*[torch.zeros(1)] * 6)
    with pytest.raises(ValueError, match="intranode"):
        ht_args.check_internode_handle(intra, 4, 2, torch.device("cpu"))


def test_internode_errors_name_rank_node_peer_and_phase():
    err = describe_kernel_error(abi.EP_RT_ERR_TIMEOUT, abi.EP_RT_PHASE_IN_NOTIFY, 0, 3, -1, 5, 4, ranks_per_node=2)
    assert isinstance(err, CommTimeoutError)
    msg = str(err)
    assert "rank 0 (node 0)" in msg and "rank 3 (node 1)" in msg and "notify" in msg and "EP_RT_NET_TIMEOUT_S" in msg
    cap = describe_kernel_error(abi.EP_RT_ERR_CAPACITY, abi.EP_RT_PHASE_IN_NOTIFY, 1, -1, -1, 900, 800, 2)
    assert isinstance(cap, BufferTooSmallError) and "num_rdma_bytes" in str(cap)


def test_a_combine_dropped_past_the_rdma_area_is_a_buffer_error_naming_the_channel():
    err = describe_kernel_error(abi.EP_RT_ERR_CAPACITY, abi.EP_RT_PHASE_IN_COMBINE_FORWARD, 2, -1, 5, 300, 19, 2)
    assert isinstance(err, BufferTooSmallError)
    msg = str(err)
    assert "rank 2 (node 1)" in msg and "channel 5" in msg and "300 tokens" in msg and "num_rdma_bytes" in msg
