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
    names = [k for k in off if k not in ("end", "slot_bytes")]
    assert off[names[0]] >= nbytes
    values = [off[k] for k in names] + [off["end"]]
    assert values == sorted(values) and all(v % lay.ALIGN == 0 for v in values)
    # Every region has room for its words: one network slot per node (not per rank: only rail peers talk).
    slot = off["slot_bytes"]
    assert slot >= 4 * (
        abi.EP_RT_IN_SLOT_HEADER
        + R
        + N
        + abi.EP_RT_MAX_CHANNELS
        + (R // N) * (abi.EP_RT_MAX_CHANNELS + abi.EP_RT_MAX_LOCAL_EXPERTS)
    )
    assert off["notify_recv"] - off["notify_send"] >= N * slot
    assert off["notify_words"] - off["notify_recv"] >= N * slot
    assert off["combine_words"] - off["dispatch_words"] >= N * abi.EP_RT_MAX_CHANNELS * 8
    assert off["end"] - off["hs_words"] >= abi.EP_RT_IN_HS_KINDS * N * 8


def test_nvl_area_control_part_then_records():
    R, N = 16, 2
    off = lay.nvl_control_offsets(R, N)
    names = [k for k in off if k != "slot_bytes"]
    values = [off[k] for k in names]
    assert values == sorted(values) and all(v % lay.ALIGN == 0 for v in values)
    assert off["slot_flags"] - off["slots"] >= R * off["slot_bytes"]
    assert off["relay"] - off["pub"] >= R * abi.EP_RT_MAX_CHANNELS * 4
    assert off["ready"] - off["relay"] >= R * abi.EP_RT_MAX_CHANNELS * 8
    assert off["records"] - off["ready_prefix"] >= R * 4
    p = abi.InternodeParams()
    assert lay.fill_nvl(p.nvl, off, off["records"] + 1000) == 1000
    assert lay.fill_nvl(p.nvl, off, 10) == 0
    assert p.nvl.records == off["records"] and p.nvl.slot_bytes == off["slot_bytes"]


def test_fill_gives_both_halves_and_the_capacity():
    p = abi.InternodeParams()
    ctrl = lay.control_offsets(10 << 20, 4, 2)
    cap = lay.fill(p.lay, ctrl, 10 << 20, 2, 1024)
    assert (p.lay.stage, p.lay.recv) == (0, lay.half_bytes(10 << 20))
    assert cap == p.lay.cap == lay.half_bytes(10 << 20) // (2 * 1024)
    assert p.lay.recv + 2 * cap * 1024 <= 10 << 20 <= ctrl["notify_send"]
    assert p.lay.notify_words == ctrl["notify_words"] and p.lay.end == ctrl["end"]
    assert p.lay.slot_bytes == ctrl["slot_bytes"]


@pytest.mark.parametrize("hidden,G,R", [(7168, 8, 16), (4096, 2, 4), (2048, 1, 4)])
def test_size_hints_hold_a_dispatch_and_its_combine(hidden, G, R):
    T, N = 4096, R // G
    rdma = lay.rdma_size_hint(hidden * 2, R, G, T)
    records = (
        lay.dispatch_record_bytes(hidden * 2, 0, 8),
        lay.dispatch_record_bytes(hidden, hidden // 128, 8),
        lay.combine_record_bytes(hidden, 8),
        lay.combine_record_bytes(hidden, 32),
    )
    for record in records:
        assert lay.capacity(rdma, N, record) >= T, record
    # The NVL buffer holds, after its control part, every token of every rank as a pushed record or combine row.
    nvl = lay.nvl_size_hint(hidden * 2, R, G, T)
    room = nvl - lay.nvl_control_offsets(R, N)["records"]
    for record in records + (lay.dispatch_record_bytes(hidden * 2, 0, 32),):
        assert room // record >= R * T, record


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


def test_a_relay_timeout_names_the_source_and_its_forwarder():
    """Phase 19 (the relayed notify slots): the record's peer is the source whose counts never came; the forwarder of
    this node that relays them is the rank of this node with the source's local index; either may be the one gone."""
    err = describe_kernel_error(
        abi.EP_RT_ERR_TIMEOUT, abi.EP_RT_PHASE_IN_NOTIFY_RELAY, 0, 3, -1, 5, 4, ranks_per_node=2
    )
    assert isinstance(err, CommTimeoutError)
    text = str(err)
    assert "rank 0 (node 0): timed out in internode dispatch notify" in text
    assert "counts of rank 3 (node 1), which rank 1 (node 0) relays" in text and "EP_RT_NET_TIMEOUT_S" in text


def test_a_handshake_timeout_on_my_own_node_says_the_wait_is_for_the_rails():
    """The handshake's node half waits for my node's ranks, each of which first waits for its rail peers: a timeout
    there (even one naming this rank itself, its own block 0 still waiting for the rails) must not blame the node."""
    err = describe_kernel_error(
        abi.EP_RT_ERR_TIMEOUT, abi.EP_RT_PHASE_IN_COMBINE_HANDSHAKE, 0, 0, -1, 5, 4, ranks_per_node=2
    )
    assert isinstance(err, CommTimeoutError)
    assert "waiting for its own rail peers on the other nodes" in str(err)
    err = describe_kernel_error(abi.EP_RT_ERR_TIMEOUT, abi.EP_RT_PHASE_IN_HANDSHAKE, 0, 1, -1, 5, 4, ranks_per_node=2)
    assert "waiting for rank 1 (node 0), which itself waits for its rail peers on the other nodes" in str(err)
    err = describe_kernel_error(abi.EP_RT_ERR_TIMEOUT, abi.EP_RT_PHASE_IN_HANDSHAKE, 0, 2, -1, 5, 4, ranks_per_node=2)
    assert "waiting for rank 2 (node 1)" in str(err)  # a rail peer: named as before
