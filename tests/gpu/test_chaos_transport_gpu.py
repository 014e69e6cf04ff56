"""The chaos transport (kernels_src/include/ep_rt/net.cuh, EP_RT_CHAOS_TRANSPORT=1, docs/CHAOS_TRANSPORT.md): network
puts delivered late, split and reordered at the sender's flush, each signal after its own data. On one host the
network is emulated (EP_RT_RANKS_PER_NODE): the ranks share one GPU or several, with a gloo group when they share.

  * the probe kernel shows that the chaos transport catches what NVSHMEM over P2P hides (a send area rewritten
    before its destination acknowledged it, puts and signals assumed to land in issue order) and keeps what it must (a signal after its
    own data, every put delivered, also past a full queue);
  * the whole LL suite passes with its remote puts going through the chaos transport (2 nodes x 1 and 2 x 2)."""

import pytest

from ep_rt.testing.spawn import run_ranks

from . import chaos_workers
from .conftest import gpus

P = chaos_workers.PROBE


@gpus(1)
def test_probe_over_p2p_puts_land_at_once_and_in_order():
    """NVSHMEM over P2P (the default variant): every put is a copy at once, in issue order, so the probe's bug (a
    source rewritten before its destination acknowledged it) passes unseen."""
    env = {"EP_RT_RANKS_PER_NODE": "1", "EP_RT_CHAOS_TRANSPORT": "0"}
    for rank, res in enumerate(run_ranks(chaos_workers.net_probe, 2, env=env, timeout_s=300)):
        assert res["variant"] == "default", res
        assert res["late_old"] == P["late"] // 4 and res["late_new"] == 0, (rank, res)  # the bug passes unseen
        assert res["order_second_last"] == P["pairs"] and res["order_first_last"] == 0, (rank, res)
        assert res["flood_ok"] == P["flood"], (rank, res)
        # A signal op issued after a put-with-signal lands after its data over P2P; a put_signal's own signal too.
        assert res["overtake"] == {101: P["pairs"]} and res["own"] == {101: P["pairs"]}, (rank, res)
        assert res["sink"] == chaos_workers.PROBE_SIGNALS, (rank, res)


@gpus(1)
def test_probe_under_chaos_puts_land_late_and_reordered():
    env = {"EP_RT_RANKS_PER_NODE": "1", "EP_RT_CHAOS_TRANSPORT": "1"}
    for rank, res in enumerate(run_ranks(chaos_workers.net_probe, 2, env=env, timeout_s=300)):
        assert res["variant"] == "chaos", res
        # The source was read at the flush, after the rewrite: every word is the rewritten one (the bug is caught).
        assert res["late_new"] == P["late"] // 4 and res["late_old"] == 0, (rank, res)
        # Two puts to one place land in either order (each order has chance 1/2 per
        # pair; 64 pairs), and every pair landed whole.
        assert res["order_second_last"] > 0 and res["order_first_last"] > 0, (rank, res)
        assert res["order_second_last"] + res["order_first_last"] == P["pairs"], (rank, res)
        # A separate signal overtakes another put's data, sometimes; it never gets lost.
        assert set(res["overtake"]) == {100, 101} and sum(res["overtake"].values()) == P["pairs"], (rank, res)
        # A put_signal's signal comes after its own data, always.
        assert res["own"] == {101: P["pairs"]}, (rank, res)
        # More puts than a queue holds: the excess is delivered at once, the rest at the flush; all arrive.
        assert res["flood_ok"] == P["flood"], (rank, res)
        assert res["sink"] == chaos_workers.PROBE_SIGNALS, (rank, res)  # no signal lost
        # The cost mode: every operation counted, the one quiet charged a sweep of this 2-PE world.
        st = res["stats"]
        assert st["put_signals"] == chaos_workers.PROBE_SIGNALS + P["pairs"], (rank, st)  # + the own-word pairs
        assert st["signals"] == P["pairs"] and st["quiets"] == 1 and st["fences"] == 0, (rank, st)
        assert res["sweep_ns"] > 0 and st["charged_ns"] == res["sweep_ns"], (rank, st, res["sweep_ns"])


@gpus(1)
@pytest.mark.parametrize("num_ranks,ranks_per_node", [(2, 1), (4, 2)])
def test_low_latency_suite_under_the_chaos_transport(num_ranks, ranks_per_node):
    """The LL suite on emulated nodes with the chaos variant: the staging areas, credits, arrival counts and signals of the put path
    must hold up when puts land late and out of order (P2P alone cannot show that; see the probe above)."""
    env = {"EP_RT_RANKS_PER_NODE": str(ranks_per_node), "EP_RT_CHAOS_TRANSPORT": "1", "NVSHMEM_QP_DEPTH": "4096"}
    results = run_ranks(chaos_workers.ll_suite, num_ranks, env=env, timeout_s=1200)
    problems = []
    for rank, res in enumerate(results):
        assert "/chaos/" in res["cubin"], res["cubin"]
        assert res["remote_peers"] == num_ranks - ranks_per_node, res["remote_peers"]
        assert len(res["cases"]) >= 20
        for name, checks, failures in res["cases"]:
            assert checks > 0, name
            problems += [f"rank {rank} {name}: {f}" for f in failures]
    assert not problems, "\n".join(problems[:40]) + f"\n(seed {results[0]['seed']})"


def _check_counts(results, calls):
    problems = []
    for res in results:
        for call in calls:
            got, want = res[call]
            for key, value in want.items():
                if got[key] != value:
                    problems.append(f"rank {res['rank']} {call}: {key} {got[key]}, the design says {value}")
            if got["quiets"] or got["fences"]:  # neither flavour quiets or fences (net.cuh)
                problems.append(
                    f"rank {res['rank']} {call} ({res['flavour']}): {got['quiets']} quiets, {got['fences']} fences"
                )
    return problems


@pytest.mark.net_counts
@gpus(1)
def test_internode_network_operations_per_call_are_the_designs():
    """Issue 21: the chaos build counts every network operation; one internode dispatch, cached dispatch and combine
    on 2 nodes x 2 issue exactly: notify one slot to the other node's rail peer, each (channel, node) stream in
    min(count, 8) put-with-signals (a bare signal when empty), one handshake signal per other node, no quiet, no
    fence."""
    env = {"EP_RT_RANKS_PER_NODE": "2", "EP_RT_CHAOS_TRANSPORT": "1"}  # (the flavour: as the step sets it)
    results = run_ranks(chaos_workers.net_ops, 4, env=env, timeout_s=600)
    assert not _check_counts(results, ("dispatch", "cached", "combine")), _check_counts(
        results, ("dispatch", "cached", "combine")
    )


@pytest.mark.net_counts
@gpus(1)
def test_low_latency_network_operations_per_call_are_the_designs():
    """One LL dispatch and combine on 2 nodes x 2: one put-with-signal per message for a rank of another node, one
    count signal per (local expert, other-node rank) and one credit per other-node rank; no quiet, no fence."""
    env = {"EP_RT_RANKS_PER_NODE": "2", "EP_RT_CHAOS_TRANSPORT": "1"}
    results = run_ranks(chaos_workers.net_ops_ll, 4, env=env, timeout_s=600)
    assert not _check_counts(results, ("dispatch", "combine")), _check_counts(results, ("dispatch", "combine"))
