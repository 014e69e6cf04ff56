"""DeepEP V1's tuned config tables (intranode 2/4/8 ranks, internode 16 to 160 ranks) and the default rows for
node counts the tables lack."""

import pytest

from ep_rt import config_tables as t
from ep_rt.config import Config, table_config

# (dispatch, combine) as (nvl_send, nvl_recv, rdma_send, rdma_recv), read off DeepEP V1 (567632d)
# deep_ep/buffer.py get_dispatch_config / get_combine_config.
V1 = {
    2: ((24, 256, 6, 128), (10, 256, 6, 128)),
    4: ((6, 256, 6, 128), (9, 256, 6, 128)),
    8: ((6, 256, 6, 128), (4, 256, 6, 128)),
    16: ((36, 288, 20, 128), (4, 288, 12, 128)),
    24: ((32, 288, 8, 128), (1, 288, 8, 128)),
    32: ((32, 288, 8, 128), (1, 288, 8, 128)),
    48: ((32, 288, 8, 128), (1, 288, 8, 128)),
    64: ((32, 288, 8, 128), (1, 288, 8, 128)),
    96: ((20, 480, 12, 128), (1, 480, 8, 128)),
    128: ((20, 560, 12, 128), (1, 560, 8, 128)),
    144: ((32, 720, 12, 128), (2, 720, 8, 128)),
    160: ((28, 720, 12, 128), (2, 720, 8, 128)),
}


@pytest.mark.parametrize("num_ranks", sorted(V1))
def test_deepeps_rows_by_rank_count(num_ranks):
    for kind, want in zip(("dispatch", "combine"), V1[num_ranks]):
        row = t.lookup(kind, num_ranks)
        assert (row.num_ranks, *row[2:]) == (num_ranks, *want)
        c = table_config(kind, num_ranks, 24)
        assert (
            c.num_sms,
            c.num_max_nvl_chunked_send_tokens,
            c.num_max_nvl_chunked_recv_tokens,
            c.num_max_rdma_chunked_send_tokens,
        ) == (24, *want[:3])


def test_the_table_holds_exactly_deepeps_rows():
    assert {(r.kind, r.num_ranks): r[2:] for r in t.ROWS} == {
        (k, n): v for n, pair in V1.items() for k, v in zip(("dispatch", "combine"), pair)
    }


@pytest.mark.parametrize("num_nodes", range(2, 41))
def test_every_internode_row_passes_deepeps_config_and_combine_checks(num_nodes):
    for kind in ("dispatch", "combine"):
        r = t.lookup(kind, 8 * num_nodes)
        Config(20, r.nvl_send, r.nvl_recv, r.rdma_send, r.rdma_recv)  # DeepEP's Config assertions
    c = t.lookup("combine", 8 * num_nodes)
    assert t.deepep_combine_problems(num_nodes, c.nvl_send, c.nvl_recv, c.rdma_send) == []


def test_node_counts_deepep_lacks_take_the_nearest_smaller_row():
    # 5 nodes: 4 nodes' row (32 ranks); the combine's NVL receive size becomes a multiple of 5
    d, c = t.lookup("dispatch", 40), t.lookup("combine", 40)
    assert d[2:] == V1[32][0] and d.num_ranks == 40
    assert (c.nvl_send, c.rdma_send, c.rdma_recv) == (1, 8, 128) and c.nvl_recv == 290
    assert t.lookup("dispatch", 80)[2:] == V1[64][0]  # 10 nodes -> 8 nodes' row
    assert t.lookup("dispatch", 112)[2:] == V1[96][0]  # 14 nodes -> 12
    # beyond DeepEP's 20 nodes: the 20-node row
    assert t.lookup("dispatch", 256)[2:] == V1[160][0] and t.lookup("combine", 256).nvl_recv % 32 == 0


def test_rows_by_node_count_for_nodes_of_fewer_gpus():
    # 2 nodes of 2 GPUs (emulated or real): DeepEP's 2-node row; 4 ranks on one node stay intranode
    assert t.lookup("dispatch", 4, num_nodes=2)[2:] == V1[16][0]
    assert t.lookup("dispatch", 4, num_nodes=2).num_ranks == 4
    assert t.lookup("combine", 8, num_nodes=4)[2:] == V1[32][1]
    assert t.lookup("dispatch", 4, num_nodes=1)[2:] == V1[4][0] == t.lookup("dispatch", 4)[2:]
    assert t.lookup("dispatch", 12, num_nodes=3)[2:] == V1[24][0]
    assert t.lookup("dispatch", 16, num_nodes=16)[2:] == V1[128][0]  # 16 one-GPU nodes


def test_one_node_counts_deepep_lacks_take_the_next_larger_row():
    # 1 -> 2, 3 -> 4, 5..7 -> 8 (module docstring); the row keeps the caller's rank count
    for num_ranks, tuned in ((1, 2), (3, 4), (5, 8), (6, 8), (7, 8)):
        for kind, want in zip(("dispatch", "combine"), V1[tuned]):
            row = t.lookup(kind, num_ranks)
            assert (row.num_ranks, *row[2:]) == (num_ranks, *want)
            assert t.lookup(kind, num_ranks, num_nodes=1) == row


@pytest.mark.parametrize(
    "args,match",
    [
        (("dispatch", 12), "not whole nodes of 8"),  # more than 8 ranks, not whole nodes of 8, no node count
        (("dispatch", 16, 1), "one node holds 1..8"),  # one node of 16 ranks
        (("combine", 18, 2), "a node holds at most 8"),  # 2 nodes of 9
        (("dispatch", 12, 5), "dividing"),
        (("dispatch", 0), "positive"),
        (("layout", 8), "kind"),
    ],
)
def test_what_has_no_row(args, match):
    with pytest.raises(ValueError, match=match):
        t.lookup(*args)


def test_deepeps_combine_checks_catch_bad_rows():
    assert t.deepep_combine_problems(5, 1, 288, 8)  # 288 is not a multiple of 5
    assert t.deepep_combine_problems(2, 4, 24, 12)  # each node's share (12) does not exceed the chunk (12)
    assert t.deepep_combine_problems(2, 4, 288, 6)  # rdma_send below the 12 forwarder warps of 2 nodes
    assert t.combine_nvl_recv(5, 1, 288, 8) == 290
