"""buffer.runtime answers the methods of DeepEP V1's C++ runtime that Python code calls, with DeepEP's meaning and
ep_rt's node size; Buffer.internode_dispatch / internode_combine show DeepEP's parameters. On the CPU: a Buffer
shell with the state a constructed one has (Topology, device, parts), the driver stubbed."""

import gc
import inspect
import weakref
from types import SimpleNamespace

import pytest
import torch

from ep_rt import Buffer
from ep_rt.errors import EpRtError
from ep_rt.runtime import driver
from ep_rt.transport.topology import Topology

# The methods deep_ep_cpp.Buffer binds (deepseek-ai/DeepEP@567632d csrc/deep_ep.cpp, PYBIND11_MODULE), copied by
# hand from there.
DEEP_EP_CPP_METHODS = [
    "is_available",
    "get_num_rdma_ranks",
    "get_rdma_rank",
    "get_root_rdma_rank",
    "get_local_device_id",
    "get_local_ipc_handle",
    "get_local_nvshmem_unique_id",
    "get_local_buffer_tensor",
    "get_comm_stream",
    "sync",
    "destroy",
    "get_dispatch_layout",
    "intranode_dispatch",
    "intranode_combine",
    "internode_dispatch",
    "internode_combine",
    "clean_low_latency_buffer",
    "low_latency_dispatch",
    "low_latency_combine",
    "low_latency_update_mask_buffer",
    "low_latency_query_mask_buffer",
    "low_latency_clean_mask_buffer",
    "get_next_low_latency_combine_buffer",
]
# deep_ep/buffer.py (same commit): the parameters of Buffer.internode_dispatch and internode_combine, in order.
DEEP_EP_INTERNODE_DISPATCH = [
    "self",
    "x",
    "handle",
    "num_tokens_per_rank",
    "num_tokens_per_rdma_rank",
    "is_token_in_rank",
    "num_tokens_per_expert",
    "topk_idx",
    "topk_weights",
    "expert_alignment",
    "num_worst_tokens",
    "config",
    "previous_event",
    "async_finish",
    "allocate_on_comm_stream",
]
DEEP_EP_INTERNODE_COMBINE = [
    "self",
    "x",
    "handle",
    "topk_weights",
    "bias",
    "config",
    "previous_event",
    "async_finish",
    "allocate_on_comm_stream",
]


def shell(rank, num_ranks, ranks_per_node=None, hosts=None, internode=True, nvl=True):
    """A Buffer as its constructor leaves it, without the GPU parts."""
    buf = object.__new__(Buffer)
    hosts = hosts or ["h"] * num_ranks
    buf.topology = Topology.from_table(rank, hosts, [f"0000:{i:02x}:00.0" for i in range(num_ranks)], ranks_per_node)
    buf.destroyed = False
    buf.device_index = 3
    buf.comm_stream = object()
    buf._ht = SimpleNamespace(is_internode=internode)
    buf._nvl = SimpleNamespace(local_ptr=0xABC000) if nvl else None
    buf.explicitly_destroy = True
    return buf


def test_every_method_of_deep_eps_cpp_runtime_is_there():
    rt = shell(0, 2, internode=False).runtime
    missing = [m for m in DEEP_EP_CPP_METHODS if not callable(getattr(rt, m, None))]
    assert not missing, missing


@pytest.mark.parametrize(
    "rank,num_ranks,per_node,hosts,want",
    [
        # 8 ranks as 4 emulated nodes of 2: DeepEP's rank // 8 would say one node; ep_rt's node size is 2
        (5, 8, 2, None, (4, 2, 1)),
        # 16 ranks on two hosts of 8 (DeepEP's shape): the same answers as DeepEP
        (11, 16, None, ["a"] * 8 + ["b"] * 8, (2, 1, 3)),
        # 4 hosts of 2 GPUs each
        (6, 8, None, [h for h in "abcd" for _ in range(2)], (4, 3, 0)),
    ],
)
def test_rdma_ranks_are_nodes_of_topologys_size(rank, num_ranks, per_node, hosts, want):
    rt = shell(rank, num_ranks, per_node, hosts).runtime
    assert (rt.get_num_rdma_ranks(), rt.get_rdma_rank(), rt.get_root_rdma_rank(True)) == want
    assert rt.get_root_rdma_rank(False) == 0


def test_one_node():
    rt = shell(1, 4, internode=False).runtime
    assert (rt.get_num_rdma_ranks(), rt.get_rdma_rank(), rt.get_root_rdma_rank(True)) == (1, 0, 1)
    assert rt.is_available() and not rt.is_internode_available()
    assert rt.get_local_device_id() == 3


def test_availability_follows_the_buffers_life():
    buf = shell(0, 4, 2)
    rt = buf.runtime
    assert rt.is_available() and rt.is_internode_available()
    buf.destroyed = True
    assert not rt.is_available() and not rt.is_internode_available()


def test_comm_stream_ipc_handle_and_buffer_tensor(monkeypatch):
    buf = shell(0, 2, internode=False)
    rt = buf.runtime
    assert rt.get_comm_stream() is buf.comm_stream
    monkeypatch.setattr(driver, "ipc_get_handle", lambda ptr: ptr.to_bytes(8, "little") * 8)
    handle = rt.get_local_ipc_handle()
    assert isinstance(handle, bytearray) and bytes(handle) == (0xABC000).to_bytes(8, "little") * 8
    assert rt.get_local_ipc_handle.__doc__ and "control region" in rt.get_local_ipc_handle.__doc__
    buf._nvl = None  # a low-latency Buffer across nodes has no NVL buffer: zeros, as DeepEP's
    assert rt.get_local_ipc_handle() == bytearray(64)
    calls = []
    buf.get_local_buffer_tensor = lambda *args: calls.append(args) or "view"
    assert rt.get_local_buffer_tensor(torch.int32, 256, True) == "view"
    assert calls == [(torch.int32, None, 256, True)]  # DeepEP's C++ order (dtype, offset, use_rdma) mapped


def test_forwarded_low_latency_helpers_and_destroy():
    buf = shell(0, 2, internode=False)
    seen = []
    for name in (
        "clean_low_latency_buffer",
        "low_latency_update_mask_buffer",
        "low_latency_query_mask_buffer",
        "low_latency_clean_mask_buffer",
        "destroy",
    ):
        setattr(buf, name, lambda *args, _n=name: seen.append((_n, args)))
    rt = buf.runtime
    rt.clean_low_latency_buffer(128, 7168, 288)
    rt.low_latency_update_mask_buffer(1, True)
    rt.low_latency_query_mask_buffer("status")
    rt.low_latency_clean_mask_buffer()
    rt.destroy()
    assert seen == [
        ("clean_low_latency_buffer", (128, 7168, 288)),
        ("low_latency_update_mask_buffer", (1, True)),
        ("low_latency_query_mask_buffer", ("status",)),
        ("low_latency_clean_mask_buffer", ()),
        ("destroy", ()),
    ]


@pytest.mark.parametrize(
    "name",
    [
        "sync",
        "get_local_nvshmem_unique_id",
        "intranode_dispatch",
        "internode_combine",
        "low_latency_dispatch",
        "get_next_low_latency_combine_buffer",
    ],
)
def test_what_ep_rt_cannot_answer_raises_naming_the_method(name):
    rt = shell(0, 2).runtime
    with pytest.raises(NotImplementedError, match=rf"buffer\.runtime\.{name}\(\)"):
        getattr(rt, name)(1, 2, 3)


def test_the_buffer_keeps_no_runtime_object():
    """No reference cycle: a Buffer nobody holds is freed at once (its implicit teardown runs then), not whenever
    the cycle collector comes."""
    buf = shell(0, 2)
    assert buf.runtime.is_available()
    ref = weakref.ref(buf)
    gc.disable()
    try:
        del buf
        assert ref() is None
    finally:
        gc.enable()


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_internode_entry_points_show_deep_eps_parameters():
    assert _params(Buffer.internode_dispatch) == DEEP_EP_INTERNODE_DISPATCH == _params(Buffer.dispatch)
    assert _params(Buffer.internode_combine) == DEEP_EP_INTERNODE_COMBINE == _params(Buffer.combine)
    defaults = {n: p.default for n, p in inspect.signature(Buffer.internode_dispatch).parameters.items()}
    assert defaults["expert_alignment"] == 1 and defaults["num_worst_tokens"] == 0 and defaults["handle"] is None


def test_internode_entry_points_forward_every_argument():
    buf = shell(0, 4, 2)
    got = {}
    buf.dispatch = lambda *args: got.setdefault("dispatch", args)
    buf.combine = lambda *args: got.setdefault("combine", args)
    values = {n: object() for n in DEEP_EP_INTERNODE_DISPATCH[1:]}
    buf.internode_dispatch(**values)
    assert got["dispatch"] == tuple(values[n] for n in DEEP_EP_INTERNODE_DISPATCH[1:])
    values = {n: object() for n in DEEP_EP_INTERNODE_COMBINE[1:]}
    buf.internode_combine(**values)
    assert got["combine"] == tuple(values[n] for n in DEEP_EP_INTERNODE_COMBINE[1:])
    one_node = shell(0, 2, internode=False)
    with pytest.raises(EpRtError, match="several nodes"):
        one_node.internode_dispatch(torch.zeros(1))
