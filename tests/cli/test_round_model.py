"""The round model behind the README's table (ep_rt/cli/round_model.py): buffers of the one-pass hints take one
pass; smaller ones take the rounds the ops would choose."""

import pytest

from ep_rt import Config
from ep_rt.cli import round_model
from ep_rt.transport import internode_layout as lay


@pytest.mark.parametrize("R,G", [(8, 8), (16, 8), (32, 8), (16, 4), (64, 8)])
def test_one_pass_hints_take_one_pass(R, G):
    c = Config()
    nvl, rdma = c.get_nvl_buffer_size_hint(7168 * 2, R, 4096, G), c.get_rdma_buffer_size_hint(7168 * 2, R, 4096, G)
    assert round_model.rounds(nvl, rdma, R, G, 7168, 4096) == 1


def test_one_node_below_the_received_rows_takes_the_least_rounds():
    """8 ranks, room for 8 x 1024 rows: 4096 tokens of top-8 of 256 reach about 65 % of the 32768 rows, so more
    than one pass, and on one node the rounds are those of the worst case: 1024 tokens a round, 4 rounds."""
    from ep_rt.transport import nvl_layout

    nvl = nvl_layout.nvl_bytes_for(7168 * 2, 8 * 1024)
    assert round_model.rounds(nvl, 0, 8, 8, 7168, 4096) == 4


def test_across_nodes_rounds_follow_the_counts_not_the_worst_case():
    """64 ranks in nodes of 8 with room for 8 % of the rows a rank could receive: a token reaches about 7.5 of the
    64 ranks (12 %), so a round sized from the counts holds about 60 % of the tokens: 2 rounds, where rounds sized
    for the worst case (every token to this rank) take 13."""
    R, N, T = 64, 8, 4096
    record = max(lay.dispatch_record_bytes(7168 * 2, 0, 8), lay.combine_record_bytes(7168, 8))
    nvl = lay.nvl_control_offsets(R, N)["records"] + int(0.08 * R * T) * record
    rdma = lay.rdma_bytes_for(record, N, T)  # whole streams
    assert lay.rounds_for(T, (nvl - lay.nvl_control_offsets(R, N)["records"]) // record, R, T).num_rounds == 13
    assert round_model.rounds(nvl, rdma, R, 8, 7168, T) == 2


def test_less_than_one_round_is_an_error():
    with pytest.raises(ValueError, match="less than one round"):
        round_model.rounds(1 << 16, 1 << 20, 16, 8, 7168, 4096)
