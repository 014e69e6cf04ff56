"""Who the low-latency kernels reach by NVLink stores and who by NVSHMEM operations (symmetric.ll_peer_bases):
never an NVSHMEM operation to this rank itself (NETWORK.md §4: it may go through the NIC), the emulated nodes' other
ranks through NVSHMEM as on a cluster, and the ranks of this node that NVSHMEM left unmapped named for a warning."""

import pytest

from ep_rt.transport.symmetric import ll_peer_bases, unmapped_node_peers_warning
from ep_rt.transport.topology import Topology

OWN = 0x7000_0000


def _topo(rank, hosts, ranks_per_node=None):
    return Topology.from_table(rank, hosts, [f"0000:{i:02x}:00.0" for i in range(len(hosts))], ranks_per_node)


def test_one_host_all_mapped_keeps_nvshmems_bases_and_this_rank_is_its_own_buffer():
    mapped = [0x1000, 0x2000, 0x3000, 0x4000]
    bases, unmapped = ll_peer_bases(mapped, _topo(2, ["a"] * 4), OWN)
    assert bases == [0x1000, 0x2000, OWN, 0x4000] and unmapped == []


def test_this_rank_unmapped_by_nvshmem_is_still_reached_by_stores_and_not_reported():
    """With NVSHMEM_DISABLE_P2P (allow_nvlink_for_low_latency_mode=False) nothing is promised for oneself: the
    kernels must still never send an NVSHMEM operation to their own rank."""
    bases, unmapped = ll_peer_bases([0, 0, 0, 0], _topo(1, ["a"] * 4), OWN)
    assert bases == [0, OWN, 0, 0]
    assert unmapped == [0, 2, 3]  # the node's other ranks: the caller warns unless NVLink was refused on purpose


def test_a_real_cluster_keeps_other_nodes_as_nvshmem_maps_them():
    # 2 hosts x 2: nvshmem_ptr is 0 for the other host's ranks, or an MNNVL mapping, which is kept
    hosts = ["a", "a", "b", "b"]
    assert ll_peer_bases([0x1000, 0x2000, 0, 0], _topo(1, hosts), OWN) == ([0x1000, OWN, 0, 0], [])
    assert ll_peer_bases([0x1000, 0x2000, 0x3000, 0], _topo(0, hosts), OWN) == ([OWN, 0x2000, 0x3000, 0], [])


def test_emulated_nodes_send_to_the_other_nodes_through_nvshmem_although_nvshmem_maps_them():
    mapped = [0x1000, 0x2000, 0x3000, 0x4000]
    bases, unmapped = ll_peer_bases(mapped, _topo(3, ["a"] * 4, ranks_per_node=2), OWN)
    assert bases == [0, 0, 0x3000, OWN] and unmapped == []


def test_a_rank_of_this_node_left_unmapped_is_named_and_keeps_the_nvshmem_path():
    mapped = [0x1000, 0x2000, 0, 0x4000, 0, 0, 0, 0]
    bases, unmapped = ll_peer_bases(mapped, _topo(0, ["a"] * 4 + ["b"] * 4), OWN)
    assert bases == [OWN, 0x2000, 0, 0x4000, 0, 0, 0, 0] and unmapped == [2]


def test_a_table_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="3 mapped bases for 4 ranks"):
        ll_peer_bases([1, 2, 3], _topo(0, ["a"] * 4), OWN)


def test_the_warning_names_the_rank_the_peers_and_what_to_do():
    text = unmapped_node_peers_warning(5, [4, 6])
    assert "rank 5" in text and "rank(s) 4, 6 on this node" in text
    assert "the NIC" in text and "allow_nvlink_for_low_latency_mode=False" in text and "ep_rt doctor" in text
