"""ep_rt.buffer_plan: the mode rules of a Buffer as a pure function, every branch against a plan written out by
hand, and the errors of impossible combinations word for word (the texts Buffer raised before the plan existed)."""

import re

import pytest

from ep_rt import buffer_plan as bp
from ep_rt.buffer_plan import BufferPlan


def plan(
    num_ranks=8,
    num_nodes=1,
    num_nvl_bytes=1 << 20,
    num_rdma_bytes=0,
    low_latency_mode=False,
    allow_nvlink=True,
    explicitly_destroy=False,
    enable_shrink=False,
    timeout_s=100.0,
    rail=True,
):
    return bp.plan(
        num_ranks,
        num_nodes,
        f"{num_nodes} node(s)",
        num_nvl_bytes,
        num_rdma_bytes,
        low_latency_mode,
        allow_nvlink,
        explicitly_destroy,
        enable_shrink,
        timeout_s,
        rail,
    )


# ---- check_arguments --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (
            dict(use_fabric=True),
            NotImplementedError,
            "ep_rt does not implement fabric (MNNVL) memory handles yet (this release covers high-throughput dispatch and "
            "combine within and across nodes over a torch.distributed process group or an mpi4py communicator, and the "
            "low-latency mode)",
        ),
        (dict(num_nvl_bytes=100), ValueError, "num_nvl_bytes must be a non-negative multiple of 128, got 100"),
        (dict(num_nvl_bytes=-128), ValueError, "num_nvl_bytes must be a non-negative multiple of 128, got -128"),
        (dict(num_nvl_bytes=128.0), ValueError, "num_nvl_bytes must be a non-negative multiple of 128, got 128.0"),
        (dict(num_rdma_bytes=129), ValueError, "num_rdma_bytes must be a non-negative multiple of 128, got 129"),
        (
            dict(low_latency_mode=True),
            ValueError,
            "low_latency_mode needs num_rdma_bytes > 0 (see get_low_latency_rdma_size_hint)",
        ),
        (
            dict(low_latency_mode=True, num_rdma_bytes=1 << 20, num_qps_per_rank=0),
            ValueError,
            "num_qps_per_rank must be a positive int, got 0",
        ),
        (
            dict(low_latency_mode=True, num_rdma_bytes=1 << 20, num_qps_per_rank="24"),
            ValueError,
            "num_qps_per_rank must be a positive int, got '24'",
        ),
        # the order: fabric first, then the sizes, then the low-latency rules
        (dict(use_fabric=True, num_nvl_bytes=1), NotImplementedError, "fabric"),
        (dict(num_nvl_bytes=1, low_latency_mode=True), ValueError, "num_nvl_bytes must be"),
    ],
)
def test_check_arguments_refuses_in_buffers_words(kwargs, error, message):
    args = dict(num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24, use_fabric=False)
    with pytest.raises(error) as e:
        bp.check_arguments(**{**args, **kwargs})
    assert message in str(e.value) and (len(message) < 40 or str(e.value) == message)


def test_check_arguments_accepts_what_buffer_accepts():
    bp.check_arguments(0, 0, False, 24, False)
    bp.check_arguments(1 << 20, 256, True, 1, False)
    bp.check_arguments(128, 0, False, 0, False)  # num_qps_per_rank matters only with low_latency_mode


def test_the_not_yet_error_names_what():
    e = bp.not_yet("fabric (MNNVL) memory handles")
    assert isinstance(e, NotImplementedError)
    assert str(e).startswith("ep_rt does not implement fabric (MNNVL) memory handles yet (this release covers")


# ---- timeout_of -------------------------------------------------------------------------------------------------


def test_timeout_of():
    def never():
        raise AssertionError("the default is read only without timeout_s")

    assert bp.timeout_of(None, lambda: 42.0) == 42.0
    assert bp.timeout_of(7, never) == 7.0 and isinstance(bp.timeout_of(7, never), float)
    for bad, shown in ((0, "0.0"), (-1.5, "-1.5")):
        with pytest.raises(ValueError, match=re.escape(f"timeout_s must be positive, got {shown}")):
            bp.timeout_of(bad, never)


# ---- plan -------------------------------------------------------------------------------------------------------


def test_one_node_high_throughput_only():
    assert plan() == BufferPlan(
        ht="intranode",
        nvl_buffer=True,
        low_latency=False,
        shared_symmetric=False,
        cubins=(),
        nvshmem_world=None,
        nvshmem_allow_nvlink=True,
        timeout_s=100.0,
        internode_deadline="network",
        destroy="finalizer",
        nvshmem_teardown_local=False,
    )
    assert plan().first_session_family is None


def test_one_node_with_low_latency():
    got = plan(
        num_rdma_bytes=1 << 20, low_latency_mode=True, allow_nvlink=False, explicitly_destroy=True, timeout_s=5.0
    )
    assert got == BufferPlan(
        ht="intranode",
        nvl_buffer=True,
        low_latency=True,
        shared_symmetric=False,
        cubins=("low_latency",),
        nvshmem_world="full",
        nvshmem_allow_nvlink=False,
        timeout_s=5.0,
        internode_deadline="network",
        destroy="destroy()",
        nvshmem_teardown_local=False,
    )
    assert got.first_session_family == "low_latency"


def test_one_node_low_latency_without_nvl_buffer_still_has_the_intranode_op():
    got = plan(num_nvl_bytes=0, num_rdma_bytes=1 << 20, low_latency_mode=True, enable_shrink=True)
    assert (got.ht, got.nvl_buffer, got.low_latency, got.nvshmem_teardown_local) == ("intranode", True, True, True)


def test_internode_high_throughput_only_joins_the_rail_world():
    got = plan(num_ranks=16, num_nodes=2, num_rdma_bytes=1 << 20)
    assert got == BufferPlan(
        ht="internode",
        nvl_buffer=True,
        low_latency=False,
        shared_symmetric=False,
        cubins=("internode",),
        nvshmem_world="rail",
        nvshmem_allow_nvlink=True,
        timeout_s=100.0,
        internode_deadline="network",
        destroy="finalizer",
        nvshmem_teardown_local=False,
    )
    # kernels that cannot run in a rail world keep the full one
    assert plan(num_ranks=16, num_nodes=2, num_rdma_bytes=1 << 20, rail=False).nvshmem_world == "full"
    # allow_nvlink_for_low_latency_mode is the LL mode's rule only
    assert plan(num_ranks=16, num_nodes=2, num_rdma_bytes=1 << 20, allow_nvlink=False).nvshmem_allow_nvlink is True


def test_internode_with_low_latency_and_an_nvl_buffer():
    got = plan(
        num_ranks=16,
        num_nodes=2,
        num_rdma_bytes=1 << 20,
        low_latency_mode=True,
        allow_nvlink=False,
        enable_shrink=True,
        explicitly_destroy=True,
    )
    assert got == BufferPlan(
        ht="internode",
        nvl_buffer=True,
        low_latency=True,
        shared_symmetric=True,  # one symmetric buffer for both modes, as DeepEP's
        cubins=("internode", "low_latency"),
        nvshmem_world="full",
        nvshmem_allow_nvlink=False,
        timeout_s=100.0,
        internode_deadline="network",
        destroy="destroy()",
        nvshmem_teardown_local=True,
    )
    assert got.first_session_family == "internode"


def test_low_latency_across_nodes_without_nvl_buffer_has_no_high_throughput_mode():
    got = plan(num_ranks=16, num_nodes=2, num_nvl_bytes=0, num_rdma_bytes=1 << 20, low_latency_mode=True)
    assert got == BufferPlan(
        ht=None,
        nvl_buffer=False,
        low_latency=True,
        shared_symmetric=False,
        cubins=("low_latency",),
        nvshmem_world="full",
        nvshmem_allow_nvlink=True,
        timeout_s=100.0,
        internode_deadline="network",
        destroy="finalizer",
        nvshmem_teardown_local=False,
    )


def test_shrink_without_low_latency_changes_no_teardown():
    assert plan(enable_shrink=True).nvshmem_teardown_local is False


def test_rdma_bytes_on_one_node_without_low_latency_is_refused():
    with pytest.raises(ValueError) as e:
        plan(num_ranks=4, num_rdma_bytes=1 << 20)
    assert str(e.value) == (
        "num_rdma_bytes is for the low-latency mode and for ranks on several nodes; these 4 ranks "
        "are on one node and low_latency_mode is off: pass num_rdma_bytes=0 (nothing would use it)"
    )


def test_several_nodes_without_rdma_bytes_is_refused():
    for nvl in (1 << 20, 0):
        with pytest.raises(ValueError) as e:
            plan(num_ranks=16, num_nodes=2, num_nvl_bytes=nvl)
        assert str(e.value) == (
            "the ranks span 2 node(s): high-throughput mode across nodes needs num_rdma_bytes > 0 "
            "(see Config.get_rdma_buffer_size_hint)"
        )


def test_the_plan_is_frozen():
    with pytest.raises(Exception):
        plan().ht = "internode"


# ---- the teardown rule of each transport part -------------------------------------------------------------------


@pytest.mark.parametrize(
    "slot,collective,nvshmem_collective,failed,want",
    [
        (None, True, True, set(), True),  # error records, the internode op: collective when the teardown is
        (None, True, False, set(), True),
        (None, False, True, set(), False),
        ("nvl", True, False, set(), True),  # the NVL buffer: its own health, not NVSHMEM's
        ("nvl", True, True, {"nvl"}, False),
        ("nvl", False, True, set(), False),
        ("nvshmem", True, True, {"nvl"}, True),  # the session: every NVSHMEM user met
        ("nvshmem", True, False, set(), False),
        ("nvshmem", False, True, set(), False),
        ("low_latency", True, True, set(), True),  # a symmetric buffer: its op's health and NVSHMEM's
        ("low_latency", True, False, set(), False),
        ("low_latency", True, True, {"low_latency"}, False),
        ("internode", True, True, {"low_latency"}, True),
        ("internode", True, True, {"internode"}, False),
        ("internode", False, True, set(), False),
        # the symmetric buffer both modes share: collective only if neither op failed
        (("internode", "low_latency"), True, True, set(), True),
        (("internode", "low_latency"), True, True, {"low_latency"}, False),
        (("internode", "low_latency"), True, True, {"internode"}, False),
        (("internode", "low_latency"), True, False, set(), False),
        (("internode", "low_latency"), False, True, set(), False),
    ],
)
def test_part_destroy_collective(slot, collective, nvshmem_collective, failed, want):
    asked = []

    def slot_failed(s):
        asked.append(s)
        return s in failed

    assert bp.part_destroy_collective(slot, collective, nvshmem_collective, slot_failed) is want
    # The NVSHMEM users' slots are looked at even when the teardown is local (a recoverable error re-arms there, as
    # before); the NVL buffer's only when it is collective (its destroy looked only then).
    if isinstance(slot, tuple):  # every op's slot is asked, a failed one or not (each re-arms there)
        want_asked = list(slot)
    else:
        want_asked = [slot] if slot in ("low_latency", "internode") or (slot == "nvl" and collective) else []
    assert asked == want_asked
