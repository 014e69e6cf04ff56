"""Configs and size hints for every rank count and node size (issue 22 item 3): DeepEP's rows where it has them,
the documented defaults elsewhere, the node size from the Buffer's Topology (dispatch with config=None) or, for the
static calls, from num_ranks_per_node / EP_RT_RANKS_PER_NODE / LOCAL_WORLD_SIZE / 8, and hints with which a Buffer
of that topology accepts calls of the documented size. The expected rows are the literals of DeepEP V1 (567632d)
in test_config_tables.V1, never the code's own lookup."""

from types import SimpleNamespace

import pytest
import torch

import ep_rt.buffer as buffer_mod
from ep_rt import Buffer, Config, config
from ep_rt.runtime import abi
from ep_rt.testing import bad_inputs
from ep_rt.transport import internode_layout as lay, nvl_layout, nvshmem
from ep_rt.transport.topology import Topology

from ..fake_dist import MIRROR, FakeGroup
from .test_buffer_setup import no_gpu, use_topology  # noqa: F401 (a fixture)
from ..api.test_config_tables import V1

RANK_COUNTS = sorted(set(range(1, 17)) | {6, 12, 20, 24, 48, 160})
NODE_SIZES = (1, 2, 4, 8)
DEEPEP_NODES = sorted(n // 8 for n in V1 if n > 8)  # node counts DeepEP has rows for: 2, 3, 4, ..., 20
ONE_NODE_DEFAULT = {1: 2, 3: 4, 5: 8, 6: 8, 7: 8}  # the README's rule: the next rank count DeepEP has
KINDS = ("dispatch", "combine")
T = 4096  # the hints' documented tokens per rank


@pytest.fixture(autouse=True)
def no_node_size_in_env(monkeypatch):
    for name in ("EP_RT_RANKS_PER_NODE", "LOCAL_WORLD_SIZE", "EP_RT_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)


def shape(R, G):
    """(nodes, ranks per node) of R ranks in nodes of G, or None when that is impossible."""
    if G >= R:
        return 1, R
    return (R // G, G) if R % G == 0 else None


def as_tuple(c: Config):
    return (c.num_max_nvl_chunked_send_tokens, c.num_max_nvl_chunked_recv_tokens, c.num_max_rdma_chunked_send_tokens)


def row(values):
    """The Config of a DeepEP row with Buffer.num_sms (Config rounds the RDMA receive size as DeepEP's does)."""
    return Config(Buffer.num_sms, *values)


def deepep_combine_ok(N, nvl_send, nvl_recv, rdma_send):
    """DeepEP V1's host checks on an internode combine Config (deep_ep.cpp internode_combine, internode.cu), written
    here from its source rather than taken from config_tables."""
    wpf = max(24 // N, 1)
    share = nvl_recv // N
    return nvl_recv % N == 0 and share > max(rdma_send, nvl_send) and share - wpf >= nvl_send and rdma_send >= wpf


def expected(kind, N, R):
    """The row the README promises, from DeepEP's literals: (nvl_send, nvl_recv, rdma_send, rdma_recv)."""
    k = KINDS.index(kind)
    if N == 1:
        return V1[R if R in (2, 4, 8) else ONE_NODE_DEFAULT[R]][k]
    if N in DEEPEP_NODES:
        return V1[8 * N][k]
    base = V1[8 * max([n for n in DEEPEP_NODES if n < N])][k]
    if kind == "dispatch":
        return base
    nvl_recv = base[1]  # the smallest receive size from DeepEP's own that its combine checks accept
    while not deepep_combine_ok(N, base[0], nvl_recv, base[2]):
        nvl_recv += 1
    return base[0], nvl_recv, base[2], base[3]


# ---- configs ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("R", RANK_COUNTS)
@pytest.mark.parametrize("G", NODE_SIZES)
def test_every_rank_count_and_node_size_gets_its_row(R, G):
    s = shape(R, G)
    for kind, get in zip(KINDS, (Buffer.get_dispatch_config, Buffer.get_combine_config)):
        if s is None:
            with pytest.raises(
                ValueError,
                match=rf"num_ranks \({R}\) must be a multiple of the ranks per node "
                rf"\({G}: num_ranks_per_node={G}\)",
            ):
                get(R, num_ranks_per_node=G)
            continue
        N, _ = s
        c = get(R, num_ranks_per_node=G)
        assert c.num_sms == Buffer.num_sms
        assert c == row(expected(kind, N, R)), (kind, R, G)
        if N > 1 and kind == "combine":
            assert deepep_combine_ok(N, *as_tuple(c))


def test_deepeps_own_rows_in_nodes_of_8_are_its_literals():
    """The rank counts DeepEP V1 tunes, as DeepEP reads them (8 GPUs per node), with and without the keyword."""
    for R, (d, c) in V1.items():
        for kw in ({}, {"num_ranks_per_node": 8}):
            assert Buffer.get_dispatch_config(R, **kw) == row(d)
            assert Buffer.get_combine_config(R, **kw) == row(c)
    # a few by hand: 3 nodes of 4 GPUs = DeepEP's 3-node (24-rank) row; 2 x 4 = its 2-node row
    assert Buffer.get_dispatch_config(12, num_ranks_per_node=4) == Config(Buffer.num_sms, 32, 288, 8, 128)
    assert Buffer.get_combine_config(12, num_ranks_per_node=4) == Config(Buffer.num_sms, 1, 288, 8, 128)
    assert Buffer.get_dispatch_config(8, num_ranks_per_node=4) == Config(Buffer.num_sms, 36, 288, 20, 128)
    assert Buffer.get_combine_config(6, num_ranks_per_node=2) == Config(Buffer.num_sms, 1, 288, 8, 128)
    assert Buffer.get_dispatch_config(6) == Config(Buffer.num_sms, 6, 256, 6, 128)  # one node of 6: 8 ranks' row
    assert Buffer.get_combine_config(1) == Config(Buffer.num_sms, 10, 256, 6, 128)  # one rank: 2 ranks' row
    # 5 nodes of 4: no DeepEP row; 4 nodes' row, the combine's receive size 288 -> 290 (a multiple of 5)
    assert Buffer.get_combine_config(20, num_ranks_per_node=4) == Config(Buffer.num_sms, 1, 290, 8, 128)


def test_the_node_size_without_the_keyword(monkeypatch):
    # nothing set: DeepEP's 8 per node; 12 ranks are not whole nodes of 8, so the largest host size that fits: 3 x 4
    assert Buffer.get_dispatch_config(16) == row(V1[16][0])
    assert Buffer.get_dispatch_config(12) == row(V1[24][0])
    # torchrun on hosts of 4 GPUs: 12 ranks are 3 nodes
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert Buffer.get_dispatch_config(12) == row(V1[24][0])
    assert Buffer.get_combine_config(16) == row(V1[32][1])  # 4 nodes of 4, not 2 of 8
    assert Buffer.get_dispatch_config(2) == row(V1[2][0])  # a group inside one host
    assert Buffer.get_dispatch_config(6) == row(V1[24][0])  # a subgroup, at most 4 a host: 3 nodes of 2
    # EP_RT_RANKS_PER_NODE wins over LOCAL_WORLD_SIZE (the Topology uses it too), the keyword over both
    monkeypatch.setenv("EP_RT_RANKS_PER_NODE", "2")
    assert Buffer.get_dispatch_config(6) == row(V1[24][0])  # 3 nodes of 2
    assert Buffer.get_dispatch_config(6, num_ranks_per_node=8) == row(V1[8][0])  # one node of 6
    monkeypatch.setenv("EP_RT_RANKS_PER_NODE", "16")
    with pytest.raises(ValueError, match="EP_RT_RANKS_PER_NODE=16, but an ep_rt node holds at most 8"):
        Buffer.get_dispatch_config(32)
    monkeypatch.delenv("EP_RT_RANKS_PER_NODE")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")  # 16 processes on one host: an ep_rt node holds 8 of them at most
    assert Buffer.get_dispatch_config(8) == row(V1[8][0])
    assert Buffer.get_dispatch_config(32) == row(V1[32][0])  # 4 nodes of 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE must be a positive int"):
        Buffer.get_dispatch_config(8)


@pytest.mark.parametrize("bad", [0, 9, -1, True, 4.0, "4"])
def test_a_bad_node_size_is_refused_by_name(bad):
    for call in (
        lambda: Buffer.get_dispatch_config(8, num_ranks_per_node=bad),
        lambda: Buffer.get_combine_config(8, num_ranks_per_node=bad),
        lambda: Config().get_nvl_buffer_size_hint(256, 8, num_ranks_per_node=bad),
        lambda: Config().get_rdma_buffer_size_hint(256, 8, num_ranks_per_node=bad),
    ):
        with pytest.raises(ValueError, match=r"num_ranks_per_node must be an int in 1\.\.8"):
            call()


def test_the_tuned_file_still_wins_for_its_rank_count(tmp_path, monkeypatch):
    from ep_rt import config_file

    path = tmp_path / "tuned.json"
    config_file.write(path, [config_file.entry("dispatch", 12, Config(32, 6, 256, 6, 128))], {})
    monkeypatch.setenv("EP_RT_CONFIG_FILE", str(path))
    assert Buffer.get_dispatch_config(12, num_ranks_per_node=4) == Config(32, 6, 256, 6, 128)
    assert Buffer.get_combine_config(12, num_ranks_per_node=4) == Config(
        Buffer.num_sms, 1, 288, 8, 128
    )  # not in the file


def test_the_catalogue_cases_of_impossible_shapes_raise_their_message():
    cases = {c.name: c for c in bad_inputs.CASES}
    for name in ("dispatch config for 12 ranks in nodes of 8", "nvl hint 9 ranks", "combine config for 0 ranks"):
        case = cases[name]
        with pytest.raises(case.error, match=case.match):
            case.call(None)


# ---- no node size stated: the documented guess, never an error -------------------------------------------------

HOST_SIZES = (8, 4, 2, 1)  # GPUs per host that the guess picks from (the README's rule)


def guessed_node_size(R, lws=None):
    """The README's rule when neither num_ranks_per_node nor EP_RT_RANKS_PER_NODE is set: torchrun's
    LOCAL_WORLD_SIZE where it fits the group (at most 8, and the group inside one host or whole hosts), else one node
    when the group fits in one (8 ranks, or LOCAL_WORLD_SIZE's host, at most), else the largest of 8, 4, 2, 1 ranks
    per node (no more than LOCAL_WORLD_SIZE) that divides the rank count."""
    if lws is not None and lws <= 8 and (R <= lws or R % lws == 0):
        return min(R, lws)
    cap = min(lws or 8, 8)
    if R <= cap:
        return R
    return max(g for g in HOST_SIZES if g <= cap and R % g == 0)


@pytest.mark.parametrize("lws", [None, 1, 2, 3, 4, 6, 8, 16])
def test_configs_without_a_node_size_never_raise(monkeypatch, lws):
    """Every positive rank count gets a Config that passes DeepEP's checks (Config's own, the internode combine's):
    the row of the guessed node size."""
    if lws is not None:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(lws))
    for R in range(1, 321):
        G = guessed_node_size(R, lws)
        N = R // G
        for kind, get in zip(KINDS, (Buffer.get_dispatch_config, Buffer.get_combine_config)):
            c = get(R)
            assert c == get(R, num_ranks_per_node=G) == row(expected(kind, N, R)), (kind, R, lws)
            if N > 1 and kind == "combine":
                assert deepep_combine_ok(N, *as_tuple(c))


def test_the_reported_rank_counts_without_a_node_size():
    """Issue 22: 6, 12 and 20 ranks (3 nodes of 2 or 4, 5 of 4) with nothing in the environment."""
    assert Buffer.get_dispatch_config(6) == row(V1[8][0])  # one node of 6: 8 ranks' row
    assert Buffer.get_combine_config(6) == row(V1[8][1])
    assert Buffer.get_dispatch_config(12) == row(V1[24][0])  # 3 nodes of 4
    assert Buffer.get_combine_config(12) == row(V1[24][1])
    assert Buffer.get_dispatch_config(20) == row(V1[32][0])  # 5 nodes of 4: 4 nodes' row
    assert Buffer.get_combine_config(20) == Config(Buffer.num_sms, 1, 290, 8, 128)
    assert Buffer.get_dispatch_config(10) == row(V1[32][0])  # 5 nodes of 2
    assert Buffer.get_dispatch_config(9) == row(V1[64][0])  # 9 nodes of 1: 8 nodes' row
    c = Config()
    for R, G in ((12, 4), (20, 4), (10, 2), (9, 1), (36, 4)):
        rdma = c.get_rdma_buffer_size_hint(7168 * 2, R)
        assert rdma == c.get_rdma_buffer_size_hint(7168 * 2, R, num_ranks_per_node=G) > 0
        assert c.get_nvl_buffer_size_hint(7168 * 2, R) == c.get_nvl_buffer_size_hint(7168 * 2, R, num_ranks_per_node=G)
    assert c.get_rdma_buffer_size_hint(7168 * 2, 6) == 0  # one node


@pytest.mark.parametrize("lws", [None, 1, 2, 3, 4, 6, 8, 16])
def test_two_argument_hints_without_a_node_size_follow_the_guess(monkeypatch, lws):
    """The hints take the configs' node size; beyond the internode kernels' limits they raise (no Buffer of that
    shape exists), nothing else does."""
    if lws is not None:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(lws))
    c = Config()
    for R in range(1, 321):
        G = guessed_node_size(R, lws)
        if R > 256 or R // G > 64:
            with pytest.raises(ValueError, match="at most 256 ranks and 64 nodes"):
                c.get_rdma_buffer_size_hint(7168 * 2, R)
            continue
        rdma = c.get_rdma_buffer_size_hint(7168 * 2, R)
        assert rdma == c.get_rdma_buffer_size_hint(7168 * 2, R, num_ranks_per_node=G), (R, lws)
        assert (rdma == 0) == (G == R)
        assert c.get_nvl_buffer_size_hint(7168 * 2, R) == c.get_nvl_buffer_size_hint(7168 * 2, R, num_ranks_per_node=G)


@pytest.mark.parametrize("nodes,G", [(2, 4), (3, 4), (3, 2), (5, 4), (4, 2)])
def test_two_argument_hints_under_torchrun_take_its_node_size(monkeypatch, nodes, G):
    """2 x 4 with LOCAL_WORLD_SIZE=4 (the reported case: the 8-per-node RDMA hint is 0) and its kin: the two-argument
    hints are those of nodes of G, which hold a round of every documented record (a token from each rank); the
    one-pass hints hold each (rank -> node) stream of T records and every row a rank receives."""
    R = nodes * G
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(G))
    c = Config()
    nvl, rdma = c.get_nvl_buffer_size_hint(7168 * 2, R), c.get_rdma_buffer_size_hint(7168 * 2, R)
    assert (nvl, rdma) == (
        c.get_nvl_buffer_size_hint(7168 * 2, R, num_ranks_per_node=G),
        c.get_rdma_buffer_size_hint(7168 * 2, R, num_ranks_per_node=G),
    )
    assert rdma > 0
    whole_nvl, whole_rdma = c.get_nvl_buffer_size_hint(7168 * 2, R, T), c.get_rdma_buffer_size_hint(7168 * 2, R, T)
    control = lay.nvl_control_offsets(R, nodes)["records"]
    for hidden_bytes, S, K in RECORDS.values():
        for record in (lay.dispatch_record_bytes(hidden_bytes, S, K), lay.combine_record_bytes(7168, K)):
            assert lay.capacity(rdma, nodes, record) >= 1 and (nvl - control) // record >= R, (R, G, record)
            assert lay.capacity(whole_rdma, nodes, record) >= T, (R, G, record)
            assert (whole_nvl - control) // record >= R * T, (R, G, record)


def test_a_stated_node_size_that_does_not_fit_still_raises(monkeypatch):
    """num_ranks_per_node= and EP_RT_RANKS_PER_NODE say what the nodes are (a Buffer's Topology takes the latter and
    refuses a group it does not divide): no guess replaces them."""
    with pytest.raises(ValueError, match=r"num_ranks \(12\) must be a multiple of the ranks per node \(8: "):
        Buffer.get_dispatch_config(12, num_ranks_per_node=8)
    monkeypatch.setenv("EP_RT_RANKS_PER_NODE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for call in (
        lambda: Buffer.get_dispatch_config(6),
        lambda: Buffer.get_combine_config(6),
        lambda: Config().get_rdma_buffer_size_hint(256, 6),
        lambda: Config().get_nvl_buffer_size_hint(256, 6),
    ):
        with pytest.raises(ValueError, match=r"multiple of the ranks per node \(4: EP_RT_RANKS_PER_NODE=4\)"):
            call()


# ---- dispatch(config=None) takes the Buffer's own node size -----------------------------------------------------


@pytest.mark.parametrize("nodes,G", [(3, 4), (3, 2), (1, 6), (5, 4), (2, 8), (12, 1)])
def test_dispatch_without_config_uses_the_topologys_node_size(monkeypatch, nodes, G):
    R = nodes * G
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # a wrong hint in the environment: the Buffer knows better
    buf = object.__new__(Buffer)
    buf.destroyed, buf.group_size, buf.device = False, R, torch.device("cpu")
    buf.topology = Topology.from_table(0, [f"h{r // G}" for r in range(R)], [f"b{r}" for r in range(R)])
    buf._nvl = SimpleNamespace(raise_if_failed=lambda: None)
    buf._ht = SimpleNamespace(is_internode=nodes > 1, raise_if_failed=lambda: None)
    seen = []

    class Stop(Exception):
        pass

    def check(b, x, handle, *args):
        seen.append(args[-1])
        raise Stop

    monkeypatch.setattr(buffer_mod.ht_args, "check", check)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with pytest.raises(Stop):
        buf.dispatch(torch.zeros(2, 64, dtype=torch.bfloat16))
    (config,) = seen
    assert config.num_sms == Buffer.num_sms
    assert config == row(expected("dispatch", nodes, R))
    buf.destroyed = True  # keeps __del__ quiet


# ---- size hints -------------------------------------------------------------------------------------------------

RECORDS = {  # the documented sizes: hidden 7168 BF16 / FP8 with its scales, top-8; and top-32 BF16
    "bf16": (7168 * 2, 0, 8),
    "fp8": (7168, 56, 8),
    "bf16 top-32": (7168 * 2, 0, 32),
}


@pytest.mark.parametrize("R", RANK_COUNTS)
@pytest.mark.parametrize("G", NODE_SIZES)
def test_every_one_pass_hint_holds_calls_of_its_size(R, G):
    """A Buffer of N nodes of G sized by the two hints with num_max_tokens_per_rank=T takes dispatches (and their
    combines) of T tokens per rank in one pass, any routing, with the checks its ops make before launching; the RDMA
    hint is 0 only on one node."""
    s = shape(R, G)
    nvl_hint = lambda: Config().get_nvl_buffer_size_hint(7168 * 2, R, T, num_ranks_per_node=G)  # noqa: E731
    rdma_hint = lambda: Config().get_rdma_buffer_size_hint(7168 * 2, R, T, num_ranks_per_node=G)  # noqa: E731
    if s is None:
        for hint in (nvl_hint, rdma_hint):
            with pytest.raises(ValueError, match="multiple of the ranks per node"):
                hint()
        return
    N, g = s
    if N > 64:  # beyond the internode kernels (InternodeOp refuses such a Buffer)
        for hint in (nvl_hint, rdma_hint):
            with pytest.raises(ValueError, match="at most 256 ranks and 64 nodes"):
                hint()
        return
    nvl, rdma = nvl_hint(), rdma_hint()
    assert nvl % 128 == 0 and rdma % 128 == 0 and nvl > 0
    assert (rdma == 0) == (N == 1)
    if N == 1:  # IntranodeOp: every row a rank receives (R * T at most), dispatch and combine
        for hidden_bytes, S, K in RECORDS.values():
            assert nvl_layout.DispatchRows(hidden_bytes, S, K).fill(abi.DispatchRegion(), nvl) >= R * T
            assert nvl_layout.CombineRows(7168, K).fill(abi.CombineRegion(), nvl) >= R * T
        return
    # InternodeOp: each (rank -> node) stream (T records at most) in its node area, every row a rank receives in
    # the NVL buffer after its control part, for the dispatch record and the combine record of the call
    room = nvl - lay.nvl_control_offsets(R, N)["records"]
    for hidden_bytes, S, K in RECORDS.values():
        for record in (lay.dispatch_record_bytes(hidden_bytes, S, K), lay.combine_record_bytes(7168, K)):
            assert lay.capacity(rdma, N, record) >= T, (R, G, record)
            assert room // record >= R * T, (R, G, record)


def _deepep_formulas(c: Config, hidden_bytes: int, G: int, N: int) -> tuple[int, int]:
    """DeepEP V1's two formulas (csrc/config.hpp) for Config c on N nodes of G, written out here so that the hints
    are held to them, not to ep_rt's own copy; its channels are num_sms / 2, its slots 128 top-k ids and scales."""
    C, up = c.num_sms // 2, lambda n: (n + 127) // 128 * 128  # noqa: E731
    per_token = hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4
    nvl = up(C * G * (2 * N + 3) * 4 + C * G * c.num_max_nvl_chunked_recv_tokens * per_token)
    rdma = up(C * N * 18 * 2 * 4 + 2 * C * N * c.num_max_rdma_chunked_recv_tokens * (per_token + 16)) if N > 1 else 0
    return nvl, rdma


@pytest.mark.parametrize("R", RANK_COUNTS)
@pytest.mark.parametrize("G", NODE_SIZES)
def test_two_argument_hints_are_at_most_deepeps_and_hold_a_round(R, G):
    """Issue 22 item 2: for every config row and both hidden sizes, DeepEP's two-argument hints give no more than
    DeepEP's formula on the layout (its own numbers for nodes of 8), never less than one round (a token from each
    rank, every documented record) and never more than one pass of T tokens per rank."""
    s = shape(R, G)
    if s is None or s[0] > 64:
        return  # the hints raise (the one-pass test above holds that)
    N, g = s
    for kind in KINDS:
        c = config.table_config(kind, R, 20, g)
        for hidden in (4096, 7168):
            hb = 2 * hidden
            nvl, rdma = (
                c.get_nvl_buffer_size_hint(hb, R, num_ranks_per_node=g),
                c.get_rdma_buffer_size_hint(hb, R, num_ranks_per_node=g),
            )
            deepep_nvl, deepep_rdma = _deepep_formulas(c, hb, g, N)
            assert nvl <= max(deepep_nvl, c.get_nvl_buffer_size_hint(hb, R, 1, g)), (kind, hidden)
            assert rdma <= max(deepep_rdma, c.get_rdma_buffer_size_hint(hb, R, 1, g)), (kind, hidden)
            assert nvl <= c.get_nvl_buffer_size_hint(hb, R, T, g) and rdma <= c.get_rdma_buffer_size_hint(hb, R, T, g)
            if N == 1:
                assert rdma == 0
                for hidden_bytes, S, K in RECORDS.values():
                    assert nvl_layout.DispatchRows(hidden_bytes, S, K).fill(abi.DispatchRegion(), nvl) >= R
                    assert nvl_layout.CombineRows(7168, K).fill(abi.CombineRegion(), nvl) >= R
                continue
            room = nvl - lay.nvl_control_offsets(R, N)["records"]
            for hidden_bytes, S, K in RECORDS.values():
                for record in (lay.dispatch_record_bytes(hidden_bytes, S, K), lay.combine_record_bytes(7168, K)):
                    assert lay.capacity(rdma, N, record) >= 1 and room // record >= R, (kind, hidden, record)


def test_two_argument_hints_are_deepeps_own_numbers_for_nodes_of_8():
    """What Megatron-Core's and SGLang's get_buffer ask for (the larger of the two configs' hints) is DeepEP's at
    8, 16, 64 and 160 ranks (README's table)."""
    from ep_rt import deepep_hints

    for R in (8, 16, 64, 160):
        for hidden in (4096, 7168):
            configs = [
                Buffer.get_dispatch_config(R, num_ranks_per_node=8),
                Buffer.get_combine_config(R, num_ranks_per_node=8),
            ]
            ours = (
                max(c.get_nvl_buffer_size_hint(2 * hidden, R, num_ranks_per_node=8) for c in configs),
                max(c.get_rdma_buffer_size_hint(2 * hidden, R, num_ranks_per_node=8) for c in configs),
            )
            assert ours == deepep_hints.client_sizes(2 * hidden, R), (R, hidden)


def test_hints_follow_the_node_size_not_8():
    """The reported cases: 16 ranks on 4-GPU hosts (the 8-per-node hint holds half the streams: 2 node areas
    where there are 4) and 2 x 4 (the 8-per-node RDMA hint is 0)."""
    c = Config()
    record = lay.dispatch_record_bytes(7168 * 2, 0, 8)
    assert lay.capacity(c.get_rdma_buffer_size_hint(7168 * 2, 16, T, num_ranks_per_node=4), 4, record) >= T
    assert lay.capacity(c.get_rdma_buffer_size_hint(7168 * 2, 16, T, num_ranks_per_node=8), 4, record) < T
    assert c.get_rdma_buffer_size_hint(7168 * 2, 8, num_ranks_per_node=4) > 0
    assert c.get_rdma_buffer_size_hint(7168 * 2, 8, num_ranks_per_node=8) == 0


def test_two_argument_hints_take_the_node_size_from_the_environment(monkeypatch):
    """Megatron-Core's and SGLang's get_buffer call (hidden_bytes, num_ranks): the same rule as the configs."""
    c = Config()
    assert c.get_rdma_buffer_size_hint(7168 * 2, 8) == 0  # DeepEP's 8 per node
    assert (
        c.get_rdma_buffer_size_hint(7168 * 2, 12) == c.get_rdma_buffer_size_hint(7168 * 2, 12, num_ranks_per_node=4) > 0
    )
    for name in ("LOCAL_WORLD_SIZE", "EP_RT_RANKS_PER_NODE"):
        monkeypatch.setenv(name, "4")
        assert (
            c.get_rdma_buffer_size_hint(7168 * 2, 8)
            == c.get_rdma_buffer_size_hint(7168 * 2, 8, num_ranks_per_node=4)
            > 0
        )
        assert c.get_nvl_buffer_size_hint(7168 * 2, 12) == c.get_nvl_buffer_size_hint(
            7168 * 2, 12, num_ranks_per_node=4
        )
        assert c.get_rdma_buffer_size_hint(7168 * 2, 4) == 0  # inside one host
        monkeypatch.delenv(name)


def test_the_low_latency_hint_does_not_depend_on_the_node_size(monkeypatch):
    want = 2146961792  # DeepEP's get_low_latency_rdma_size_hint(128, 7168, R, 288), any R
    for R in (8, 16, 24, 48, 160):
        assert Buffer.get_low_latency_rdma_size_hint(128, 7168, R, 288) == want
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        assert Buffer.get_low_latency_rdma_size_hint(128, 7168, R, 288) == want
        monkeypatch.delenv("LOCAL_WORLD_SIZE")


TORCHRUN = [(1, 1), (1, 3), (1, 8), (2, 1), (2, 4), (3, 4), (3, 2), (5, 8), (12, 1)]
GUESSED = [(1, 6), (2, 8), (3, 4), (5, 4), (5, 2), (9, 1)]  # layouts the guess without any environment gets right


@pytest.mark.parametrize("nodes,G,torchrun", [(n, g, True) for n, g in TORCHRUN] + [(n, g, False) for n, g in GUESSED])
def test_a_buffer_sized_by_the_two_argument_hints_gets_past_its_own_checks(no_gpu, nodes, G, torchrun):  # noqa: F811
    """Buffer(group, nvl hint, rdma hint) with the node size from the environment (torchrun's LOCAL_WORLD_SIZE), or
    guessed without one, as Megatron-Core's get_buffer sizes it: neither refuses the sizes ("needs num_rdma_bytes >
    0", "num_rdma_bytes is for the low-latency mode"); one node goes on to create its transports, several to
    internode mode's NVSHMEM world."""
    R = nodes * G
    if torchrun:
        no_gpu.setenv("LOCAL_WORLD_SIZE", str(G))
    use_topology(no_gpu, 0, nodes, G)
    FakeGroup(0, R, calls=[MIRROR]).install(no_gpu)
    hidden_bytes = 7168 * 2
    nvl = max(
        Buffer.get_dispatch_config(R).get_nvl_buffer_size_hint(hidden_bytes, R),
        Buffer.get_combine_config(R).get_nvl_buffer_size_hint(hidden_bytes, R),
    )
    rdma = Config().get_rdma_buffer_size_hint(hidden_bytes, R)
    asked = []

    class Reached(Exception):
        pass

    def prepare(group, topology, wanted, *a):
        asked.append(topology.num_nodes)
        raise Reached

    no_gpu.setattr(nvshmem, "prepare", prepare)
    from .test_buffer_setup import Allocated

    with pytest.raises(Reached if nodes > 1 else Allocated):  # Allocated: the fixture's first transport
        Buffer(object(), nvl, rdma)
    assert asked == ([nodes] if nodes > 1 else [])
