"""Buffer's public state and benchmark hooks (is_internode, ht_serial, set_kernel_timer, network_operation_counts,
nvl_barrier, internode_barrier): what ep_rt.ops.ht_args, ep_rt.testing and Buffer.runtime use instead of Buffer's private parts
(tests/package/test_layering.py holds that rule)."""

from types import SimpleNamespace

import pytest

from ep_rt import Buffer
from ep_rt.errors import EpRtError


def shell(ht=None, nvl=None, ll=None):
    buf = object.__new__(Buffer)
    buf.destroyed = True  # keeps __del__ quiet
    buf._ht, buf._nvl, buf._ll = ht, nvl, ll
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


class StandInStats:
    """transport.net_stats.NetStats without a device: counters to read and zero, each use logged."""

    def __init__(self, log, name, puts):
        self.log, self.name, self.puts = log, name, puts

    def read(self):
        self.log.append(("read", self.name))
        return {"put_signals": self.puts, "signals": 1, "quiets": 0, "fences": 0, "bytes": 64, "charged_ns": 0}

    def reset(self):
        self.log.append(("reset", self.name))
        self.puts = 0


def test_network_operation_counts_reads_each_counting_op_and_resets_after_reading():
    log = []
    inter = SimpleNamespace(net_stats=StandInStats(log, "internode", 5))
    ll = SimpleNamespace(net_stats=StandInStats(log, "low_latency", 7))
    buf = shell(inter, ll=ll)
    got = buf.network_operation_counts(reset=True)
    assert got["internode"]["put_signals"] == 5 and got["low_latency"]["put_signals"] == 7
    assert log == [("read", "internode"), ("read", "low_latency"), ("reset", "internode"), ("reset", "low_latency")]
    assert buf.network_operation_counts()["low_latency"]["put_signals"] == 0
    assert set(shell(ll=ll).network_operation_counts()) == {"low_latency"}


def test_network_operation_counts_is_none_without_counters():
    assert shell().network_operation_counts() is None  # destroyed, or no network op
    assert shell(SimpleNamespace(serial=1)).network_operation_counts(reset=True) is None  # intranode: no net_stats
    normal = SimpleNamespace(net_stats=None)  # the normal cubins
    assert shell(normal, ll=normal).network_operation_counts() is None


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
