"""Buffer's public state and benchmark hooks (is_internode, ht_serial, set_kernel_timer, nvl_barrier,
internode_barrier): what ep_rt.ops.ht_args, ep_rt.testing and Buffer.runtime use instead of Buffer's private parts
(tests/package/test_layering.py holds that rule)."""

from types import SimpleNamespace

import pytest

from ep_rt import Buffer
from ep_rt.errors import EpRtError


def shell(ht=None, nvl=None):
    buf = object.__new__(Buffer)
    buf.destroyed = True  # keeps __del__ quiet
    buf._ht, buf._nvl = ht, nvl
    return buf


def test_is_internode_and_ht_serial_follow_the_high_throughput_op():
    assert shell().is_internode is False and shell().ht_serial is None
    intra = shell(SimpleNamespace(is_internode=False, serial=4))
    assert intra.is_internode is False and intra.ht_serial == 4
    inter = shell(SimpleNamespace(is_internode=True, serial=9))
    assert inter.is_internode is True and inter.ht_serial == 9
    assert shell(SimpleNamespace(serial=1)).is_internode is False  # an op without the flag is intranode


def test_set_kernel_timer_sets_and_clears_the_ops_timer():
    op = SimpleNamespace(timer=None)
    buf = shell(op)
    timer = object()
    buf.set_kernel_timer(timer)
    assert op.timer is timer
    buf.set_kernel_timer(None)
    assert op.timer is None
    with pytest.raises(EpRtError, match="no high-throughput mode"):
        shell().set_kernel_timer(timer)


def test_the_barrier_hooks_call_the_right_barrier():
    calls = []
    nvl = SimpleNamespace(barrier=lambda stream, synchronize: calls.append(("nvl", stream, synchronize)))
    op = SimpleNamespace(is_internode=True, barrier=lambda stream: calls.append(("internode", stream)))
    buf = shell(op, nvl)
    buf.nvl_barrier("s", synchronize=False)
    buf.nvl_barrier("t")
    buf.internode_barrier("u")
    assert calls == [("nvl", "s", False), ("nvl", "t", True), ("internode", "u")]
    with pytest.raises(EpRtError, match="no NVL buffer"):
        shell(op).nvl_barrier("s")
    with pytest.raises(EpRtError, match="several nodes"):
        shell(SimpleNamespace(is_internode=False), nvl).internode_barrier("s")
