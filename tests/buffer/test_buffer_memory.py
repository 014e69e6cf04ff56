"""ep_rt.buffer_memory: a Buffer's device memory against DeepEP V1's for the same arguments (issue 22 item 2), on
every layout a Buffer accepts up to 256 ranks, in every mode, with the sizes DeepEP's clients pass (the two-argument
hints, the LL hint at DeepEP's reference shapes); and the parts, term by term, on two layouts."""

import pytest

from ep_rt import Buffer, buffer_memory, buffer_plan, deepep_hints
from ep_rt.runtime import abi
from ep_rt.transport import ll_layout, nvl_layout


def _plan(R, N, nvl, rdma, ll):
    return buffer_plan.plan(R, N, f"{N} nodes", nvl, rdma, ll, False, True, False, 100.0, True)


def _layouts():
    yield from ((R, 1) for R in range(1, 9))
    for G in (1, 2, 4, 8):
        for N in (2, 3, 4, 8, 16, 20, 32, 64):
            if G * N <= 256:
                yield G * N, N


MODES = {
    # (NVL buffer, RDMA buffer, low_latency_mode): DeepEP's ways to make a Buffer
    "high throughput": (True, True, False),
    "low latency": (False, True, True),
    "low latency with an NVL buffer (both modes across nodes)": (True, True, True),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hidden", [4096, 7168])
def test_no_buffer_takes_more_device_memory_than_deepeps(mode, hidden):
    want_nvl, _, ll = MODES[mode]
    checked = 0
    for R, N in _layouts():
        if want_nvl and ll and N == 1:
            continue  # (one node: the same Buffer as "low latency" with an NVL buffer of its own)
        # the two-argument hints DeepEP's clients call (ep_rt's: DeepEP's where nodes are of 8), on this node size
        config = Buffer.get_dispatch_config(R, num_ranks_per_node=R // N)
        nvl = config.get_nvl_buffer_size_hint(hidden * 2, R, num_ranks_per_node=R // N) if want_nvl else 0
        rdma = config.get_rdma_buffer_size_hint(hidden * 2, R, num_ranks_per_node=R // N)
        if ll:  # the LL hint at DeepEP's reference shape: 128 tokens, top-8, about 288 experts (a multiple of R)
            rdma = ll_layout.rdma_size_hint(128, hidden, R, R * -(-288 // R))
        plan = _plan(R, N, nvl, rdma, ll)
        for shrink in (False, True) if ll else (False,):
            ours = buffer_memory.ep_rt_device_bytes(plan, nvl, rdma, R, N, enable_shrink=shrink)
            theirs = buffer_memory.deepep_device_bytes(nvl, rdma)
            assert ours["total"] <= theirs["total"], (R, N, mode, ours, theirs)
            # ep_rt's own additions, beyond the caller's sizes, stay below DeepEP's 32 MiB workspace alone
            assert ours["total"] - nvl - rdma < buffer_memory.DEEPEP_WORKSPACE_BYTES, (R, N, mode, ours)
        checked += 1
    assert checked > 20


def test_the_parts_term_by_term():
    # One node of 8, LL only (DeepEP's LL Buffer: num_nvl_bytes 0): the node's NVL control area, the symmetric
    # buffer (num_rdma_bytes, then the LL control area), the LL op's send slots and shrink mask.
    rdma = ll_layout.rdma_size_hint(128, 7168, 8, 288)
    plan = _plan(8, 1, 0, rdma, True)
    parts = buffer_memory.ep_rt_device_bytes(plan, 0, rdma, 8, 1, enable_shrink=True)
    ll_end = ll_layout.control_offsets(rdma, 8)["end"]
    assert parts["nvl"] == nvl_layout.CONTROL_BYTES
    assert parts["symmetric"] == ll_end and 4 * 2**20 < ll_end - rdma < 4.1 * 2**20
    assert parts["op state"] == (abi.EP_RT_LL_WS_COUNTERS + abi.EP_RT_LL_MAX_SIGNALS) * 4 + 8 * 4 + 8 * 8
    assert parts["total"] == parts["nvl"] + parts["symmetric"] + parts["op state"]
    # DeepEP: no NVL allocation at all without num_nvl_bytes, the 32 MiB workspace always.
    assert buffer_memory.deepep_device_bytes(0, rdma) == {
        "nvl": 0,
        "rdma": rdma,
        "workspace": 32 * 2**20,
        "total": rdma + 32 * 2**20,
    }
    # 2 nodes of 8 with both modes: one symmetric buffer (internode control, then LL control after it).
    nvl, rdma2 = deepep_hints.client_sizes(14336, 16)
    shared = _plan(16, 2, nvl, rdma2, True)
    assert shared.shared_symmetric
    apart = (
        buffer_memory.symmetric_bytes(_plan(16, 2, nvl, rdma2, False), rdma2, 16, 2)
        + ll_layout.control_offsets(rdma2, 16)["end"]
    )
    assert buffer_memory.symmetric_bytes(shared, rdma2, 16, 2) < apart  # num_rdma_bytes once, not twice
