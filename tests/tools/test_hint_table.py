"""The README's table of buffer sizes against DeepEP's is what tools/hint_table.py prints, and DeepEP's formulas
(ep_rt/deepep_hints.py) give the sizes issue 22 quotes for DeepEP (0.35, 0.35 and 0.88 GiB of NVL buffer at hidden
7168 for 16, 64 and 160 ranks)."""

from ep_rt import config_tables, deepep_hints

from ..repo import REPO, load_tool


def _tool():
    return load_tool("hint_table.py", "hint_table")


def test_the_readme_holds_the_current_table():
    assert _tool().table() in (REPO / "README.md").read_text()


def test_deepeps_nvl_hint_is_what_its_clients_get():
    gib = [round(deepep_hints.client_sizes(2 * 7168, R)[0] / 2**30, 2) for R in (16, 64, 160)]
    assert gib == [0.35, 0.35, 0.88]
    # The formula term by term for DeepEP's 16-rank dispatch row (10 channels, 8 NVL peers, 288 tokens).
    row = config_tables.lookup("dispatch", 16)
    C, N, B = 10, 8, 288
    want = C * N * (2 * 2 + 3) * 4 + C * N * B * (14336 + 8 + 128 * 8 + 128 * 4 + 128 * 4)
    assert deepep_hints.nvl_hint(row, 14336, 16) == (want + 127) // 128 * 128
    assert deepep_hints.rdma_hint(row, 14336, 8) == 0  # one node: no RDMA buffer


def test_deepeps_rdma_hint_rounds_its_receive_size_up_to_the_send_chunk():
    row = config_tables.Row("dispatch", 16, 36, 288, 20, 130)  # 130 tokens -> 140, a multiple of 20
    C, Rr, Br = 10, 2, 140
    want = C * Rr * 18 * 2 * 4 + 2 * C * Rr * Br * (14336 + 8 + 128 * 8 + 128 * 4 + 128 * 4 + 16)
    assert deepep_hints.rdma_hint(row, 14336, 16) == (want + 127) // 128 * 128
