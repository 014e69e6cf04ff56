"""The per-case GPU tests (tests/gpu/test_intranode_cases_gpu.py, tests/gpu/test_low_latency_cases_gpu.py,
tests/gpu/test_internode_cases_gpu.py, tests/gpu/test_low_latency_nodes_gpu.py) on the CPU, as far as they go
without a GPU: one collected item per case and variant, in an order that runs every case of
one variant (one pool of ranks) before the next, selectable by marker; and the tests' own functions run on a CPU
RankPool whose ranks build stand-in Buffers and case runners, so the wiring (a case by name, one Buffer per rank
kept between cases and dropped after a case that raised, the seed, the verdicts) is what the GPU run will use."""

import contextlib
import functools
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from ep_rt.testing import checker, rank_pool, selfcheck_ht, selfcheck_ll

from ..repo import collect_ids

INTRANODE = "tests/gpu/test_intranode_cases_gpu.py"
LOW_LATENCY = "tests/gpu/test_low_latency_cases_gpu.py"
INTERNODE = "tests/gpu/test_internode_cases_gpu.py"
LL_NODES = "tests/gpu/test_low_latency_nodes_gpu.py"


@pytest.fixture(scope="module")
def collected():
    """The node ids of both per-case modules, and of tests/gpu under -m "suite and not aggressive"."""
    return collect_ids(INTRANODE, LOW_LATENCY), collect_ids("-m", "suite and not aggressive and not tma", "tests/gpu")


def test_each_case_and_variant_is_one_item_every_safe_case_before_any_aggressive_one(collected):
    from tests.gpu import workers

    names = [c.name for c in selfcheck_ht.standard_cases(2)] + [workers.GRAPH_CASE]
    ids = [i for i in collected[0] if i.startswith(INTRANODE)]
    params = [re.search(r"\[(.*)\]$", i).group(1) for i in ids]
    assert len(ids) == 3 * len(names) == len(set(ids)), ids
    variants = [p.split("-", 1)[0] for p in params]
    assert variants == ["safe"] * len(names) + ["aggressive"] * len(names) + ["tma"] * len(names), variants  # in turn
    assert "safe-bf16_uniform" in params and "aggressive-cuda_graph_replays_num_worst_tokens" in params
    assert "tma-bf16_uniform" in params
    assert all(re.fullmatch(r"[0-9A-Za-z_-]+", p) for p in params), params  # no quoting in a RETEST list
    # suite marks every item of the module (and no other GPU test), aggressive exactly the aggressive variant's
    assert collected[1] == ids[: len(names)]


def test_each_low_latency_case_is_one_item(collected):
    from tests.gpu import workers

    from tests.gpu import test_low_latency_cases_gpu as mod

    names = [c.name for c in selfcheck_ll.ll_cases(2)] + [workers.LL_GRAPH_CASE, workers.LL_AFTER_CLEAN_CASE]
    every = [i for i in collected[0] if i.startswith(LOW_LATENCY)]
    ids = [i for i in every if "::test_low_latency_matches_reference[" in i]
    assert len(ids) == len(names) == len(set(ids)) and len(names) >= 20, ids
    assert sum("LogFMT" in i for i in ids) >= 4, ids
    assert ids[-2:] == [
        f"{LOW_LATENCY}::test_low_latency_matches_reference[cuda_graph_replays]",
        f"{LOW_LATENCY}::test_low_latency_matches_reference[after_clean]",
    ]
    # the EP_RT_LL_TWO_KERNELS pool: cases of the list, graph replays included, and nothing else in the module
    two = [i for i in every if "::test_low_latency_two_kernels_per_call_match_reference[" in i]
    assert len(every) == len(ids) + len(two) and len(two) == len(mod.TWO_KERNEL_CASES) >= 5, every
    assert set(mod.TWO_KERNEL_CASES) <= set(names) and workers.LL_GRAPH_CASE in mod.TWO_KERNEL_CASES


def test_each_internode_layout_variant_and_case_is_one_item_pool_by_pool():
    from ep_rt.testing import selfcheck_internode as sci
    from tests.gpu import test_internode_cases_gpu as mod, workers

    ids = collect_ids(INTERNODE)
    params = _params(ids)
    full, eight = len(sci.internode_cases(4, 2)) + 1, len(mod.EIGHT)
    sixteen = len(workers.INTERNODE_SIXTEEN_CASES) + 1
    assert len(ids) == len(set(ids)) == 6 * full + 6 * eight + 2 * sixteen == 212, ids
    _check_pools(mod.POOLS, params)
    assert "2x2-bf16_uniform" in params and "4x1-cuda_graph_replays_num_worst_tokens" in params
    assert "2x2-chaos-2_SMs" in params and "4x2-many_channels_64_SMs" in params and "4x1-aggressive-2_SMs" in params
    assert mod.POOLS["2x2"].cases[-1] == workers.GRAPH_CASE
    # Issue 21: every layout's list under the aggressive variant and the chaos transport (2x8: its own list)
    for layout in ("2x2", "4x1", "2x4", "4x2", "2x8"):
        base = mod.POOLS[layout].cases if layout != "2x8" else mod.SIXTEEN
        assert mod.POOLS[f"{layout}-aggressive"].cases == mod.POOLS[f"{layout}-chaos"].cases == base, layout
    assert mod.POOLS["2x8-chaos"].max_shape == workers.INTERNODE_SIXTEEN_SHAPE and mod.POOLS["4x1"].max_shape is None
    by_mark = {
        m: collect_ids("-m", m, INTERNODE) for m in ("internode", "aggressive", "chaos", "eight_ranks", "sixteen")
    }
    assert by_mark["internode"] == ids
    for variant in ("aggressive", "chaos"):
        assert by_mark[variant] == [i for i in ids if f"-{variant}-" in i], variant
        assert len(by_mark[variant]) == 2 * full + 2 * eight + sixteen, variant
    assert (
        by_mark["eight_ranks"] == [i for i in ids if "[2x4-" in i or "[4x2-" in i] and len(by_mark["eight_ranks"]) == 42
    )
    assert by_mark["sixteen"] == [i for i in ids if "[2x8-" in i] and len(by_mark["sixteen"]) == 2 * sixteen
    old = " ".join(collect_ids("tests/gpu/test_internode_gpu.py"))  # no case list runs twice
    for gone in ("matches_reference", "aggressive_variant", "chaos_transport", "eight_ranks_on_one_gpu"):
        assert gone not in old, old


def test_each_ll_nodes_layout_transport_and_case_is_one_item_pool_by_pool():
    from tests.gpu import test_low_latency_nodes_gpu as mod, workers

    ids = collect_ids(LL_NODES)
    params = _params(ids)
    full = len(selfcheck_ll.ll_cases(4)) + 2
    assert len(ids) == len(set(ids)) == 2 * full + 4 * len(mod.EIGHT) + 2 * len(mod.SIXTEEN) == 86, ids
    _check_pools(mod.POOLS, params)
    assert "4x1-fp8" in params and "4x1-chaos-T_1024" in params and "2x4-chaos-cuda_graph_replays" in params
    assert "4x2-LogFMT_hidden_1152" in params and "2x8-chaos-fp8" in params
    assert mod.POOLS["4x1"].cases[-2:] == (workers.LL_GRAPH_CASE, workers.LL_AFTER_CLEAN_CASE)
    for layout in ("4x1", "2x4", "4x2", "2x8"):  # each layout over P2P puts and through the chaos transport
        assert mod.POOLS[layout].cases == mod.POOLS[f"{layout}-chaos"].cases, layout
    assert all(mod.POOLS[n].env()["NVSHMEM_QP_DEPTH"] == "4096" for n in mod.POOLS)  # T=1024 over the put path
    by_mark = {m: collect_ids("-m", m, LL_NODES) for m in ("ll_nodes", "chaos", "eight_ranks", "sixteen")}
    assert by_mark["ll_nodes"] == ids
    assert by_mark["chaos"] == [i for i in ids if "-chaos-" in i] and len(by_mark["chaos"]) == len(ids) // 2
    assert by_mark["eight_ranks"] == [i for i in ids if "[2x4-" in i or "[4x2-" in i]
    assert by_mark["sixteen"] == [i for i in ids if "[2x8-" in i] and len(by_mark["sixteen"]) == 2 * len(mod.SIXTEEN)


def _params(ids) -> list:
    params = [re.search(r"\[(.*)\]$", i).group(1) for i in ids]
    assert all(re.fullmatch(r"[0-9A-Za-z_-]+", p) for p in params), params  # no quoting in a RETEST list
    return params


def _check_pools(pools: dict, params):
    """The items come pool by pool in the dict's order, each pool's name says its layout (<nodes>x<ranks per
    node>) and transport or variant, as its ranks' environment does."""
    from tests.gpu.conftest import case_ids

    of = [
        next(n for n in pools if p.startswith(n + "-") and p[len(n) + 1 :] in case_ids(pools[n].cases)) for p in params
    ]
    assert [n for k, n in enumerate(of) if k == 0 or of[k - 1] != n] == list(pools), of  # contiguous, in order
    for name, pool in pools.items():
        nodes, G = map(int, re.match(r"(\d+)x(\d+)", name).groups())
        assert (nodes * G, G) == (pool.num_ranks, pool.ranks_per_node), name
        assert (pool.aggressive, pool.chaos) == ("-aggressive" in name, "-chaos" in name), name
        env = pool.env()
        assert env["EP_RT_RANKS_PER_NODE"] == str(G) and env["EP_RT_CHAOS_TRANSPORT"] == str(int(pool.chaos)), name


def test_only_the_16_rank_pools_may_run_the_reference_on_the_cpu(monkeypatch):
    """16 ranks sharing one GPU run the reference where EP_RT_TEST_REFERENCE_DEVICE says (the GPU by default); every
    other pool keeps it on the GPU, as the one-node suites do; a value other than gpu or cpu is refused."""
    import importlib

    from tests.gpu import conftest, test_internode_cases_gpu as internode, test_low_latency_nodes_gpu as ll

    for value, sixteen in ((None, None), ("gpu", None), ("CPU", "cpu")):
        if value is None:
            monkeypatch.delenv("EP_RT_TEST_REFERENCE_DEVICE", raising=False)
        else:
            monkeypatch.setenv("EP_RT_TEST_REFERENCE_DEVICE", value)
        for module in (internode, ll):
            pools = importlib.reload(module).POOLS
            where = {name: p.reference_device for name, p in pools.items()}
            assert where == {name: (sixteen if p.num_ranks == 16 else None) for name, p in pools.items()}, where
            assert any(p.num_ranks == 16 for p in pools.values())
    monkeypatch.setenv("EP_RT_TEST_REFERENCE_DEVICE", "cuda:1")
    with pytest.raises(ValueError, match="'gpu' or 'cpu'"):
        conftest.sixteen_rank_reference_device()
    monkeypatch.delenv("EP_RT_TEST_REFERENCE_DEVICE")
    importlib.reload(internode), importlib.reload(ll)


def test_case_ids_are_safe_and_refuse_clashes():
    from tests.gpu.conftest import case_ids

    assert case_ids(["holes (-1 in topk_idx)", "async + previous_event"]) == [
        "holes_1_in_topk_idx",
        "async_previous_event",
    ]
    with pytest.raises(ValueError, match="same test id"):
        case_ids(["top-32", "top 32"])


# ---- the tests' functions on CPU ranks with stand-ins --------------------------------------------------------

_FAILING: dict = {}  # in a rank: case name -> "fail" (a check fails on rank 1) or "raise" (rank 1 raises)


class _StandInBuffer:
    """In a rank: built where the workers build a Buffer; writes its life to the rank's log."""

    def __init__(self, log_dir, rank, *args, **kwargs):
        self.log, self.rank = Path(log_dir) / f"rank{rank}.log", rank
        self.note("built")

    def note(self, what):
        with open(self.log, "a") as f:
            f.write(what + "\n")

    def destroy(self):
        self.note("destroyed")

    def clean_low_latency_buffer(self, *args):
        self.note("clean")


def _stand_in_case(buf, case, seed, *args, **kwargs):
    name = case if isinstance(case, str) else case.name
    buf.note(f"case {name} {seed}")
    chk = checker.Checker(case)
    chk.checks += 1
    if buf.rank == 1 and _FAILING.get(name) == "fail":
        chk.failures.append("recv_x differs in row 3")
    if buf.rank == 1 and _FAILING.get(name) == "raise":
        raise RuntimeError(f"stand-in {name} raised")
    if "LogFMT" in name:
        chk.notes.append("2 elements differ")
    return chk


def _install_stand_ins(rank, num_ranks, log_dir, failing):
    """In every rank, before the cases: stand-ins for Buffer construction and selfcheck's case runners (the
    workers' real case lookup by name stays)."""
    from tests.gpu import workers

    from ep_rt import env

    _FAILING.update(failing)
    workers.Buffer = functools.partial(_StandInBuffer, log_dir, rank)
    workers.ll_buffer = functools.partial(_stand_in_ll_buffer, log_dir, rank)
    selfcheck_ht.run_case = _stand_in_case
    selfcheck_ht.run_graph_case = lambda buf, seed: _stand_in_case(buf, workers.GRAPH_CASE, seed)
    selfcheck_ll.run_ll_case = _stand_in_case
    selfcheck_ll.run_ll_graph = lambda buf, seed, **where: _stand_in_case(buf, workers.LL_GRAPH_CASE, seed, **where)
    # What the LL Buffer would say of its transport under this rank's environment (the pool's)
    workers.ll_transport = lambda buf: {
        "variant": "chaos" if env.chaos_transport() else "default",
        "remote_peers": num_ranks - (env.ranks_per_node() or num_ranks),
        "two_kernels": env.ll_two_kernels(),
    }
    workers._intranode_variant = _stand_in_variant


def _stand_in_ll_buffer(log_dir, rank, num_ranks, case_names=None, **kwargs):
    buf = _StandInBuffer(log_dir, rank)
    buf.note("sized for every case" if case_names is None else f"sized for {len(case_names)} cases")
    return buf


def _stand_in_variant() -> str:
    """The variant the shipped manifest gives an H200 on r580 under this rank's environment (no GPU to ask)."""
    from ep_rt import env
    from ep_rt.runtime import choice, modules

    return choice.choose_entry(
        modules.manifest(), "intranode", (9, 0), env.aggressive_ptx(), 13000, None, None, False, env.tma()
    )["variant"]


def _log(tmp_path, rank) -> list:
    return (tmp_path / f"rank{rank}.log").read_text().splitlines()


def test_the_intranode_case_test_on_cpu_ranks(tmp_path, monkeypatch):
    from tests.gpu import test_intranode_cases_gpu as mod, workers
    from tests.gpu.conftest import case_pool

    monkeypatch.setenv("EP_RT_CASE_SEED", "4242")
    test = mod.test_dispatch_combine_match_reference_2_ranks
    env = {"EP_RT_AGGRESSIVE_PTX": "1"}
    with case_pool(2, workers.HT_CASES_BUFFER, env=env, device="cpu", timeout_s=120) as pool:
        pool.run(_install_stand_ins, str(tmp_path), {"bias pair": "fail", "one token": "raise"})
        for case in mod.CASES:
            if case == "bias pair":
                with pytest.raises(AssertionError, match=r"rank 1 \[aggressive\] bias pair: recv_x differs in row 3"):
                    test(("aggressive", pool), case)
            elif case == "one token":
                with pytest.raises(rank_pool.RankError, match="stand-in one token raised") as info:
                    test(("aggressive", pool), case)
                assert list(info.value.errors) == [1]
            else:
                test(("aggressive", pool), case)
        with pytest.raises(AssertionError):  # the ranks run the variant they were started with, and say so
            test(("safe", pool), "bf16 uniform")
        assert pool.broken is None
    after = mod.CASES.index("one token") + 1
    for rank in (0, 1):
        want = (
            ["built"]
            + [f"case {c} 4242" for c in mod.CASES[:after]]
            + ["destroyed", "built"]  # the case raised: every rank's Buffer dropped, the next case gets a new one
            + [f"case {c} 4242" for c in mod.CASES[after:] + ["bf16 uniform"]]
            + ["destroyed"]  # at the pool's end, while it still works
        )
        assert _log(tmp_path, rank) == want


def test_the_low_latency_case_test_on_cpu_ranks(tmp_path, monkeypatch, capsys):
    from tests.gpu import test_low_latency_cases_gpu as mod, workers
    from tests.gpu.conftest import case_pool

    monkeypatch.setenv("EP_RT_CASE_SEED", "77")
    quiet = SimpleNamespace(disabled=contextlib.nullcontext)  # (the notes land in this test's capsys)
    with case_pool(2, workers.LL_CASES_BUFFER, device="cpu", timeout_s=120) as pool:
        pool.run(_install_stand_ins, str(tmp_path), {"hooks": "fail"})
        for case in mod.CASES:
            if case == "hooks":
                with pytest.raises(AssertionError, match=r"(?s)rank 1 hooks: recv_x differs.*EP_RT_CASE_SEED=77"):
                    mod.test_low_latency_matches_reference(pool, case, quiet)
            else:
                mod.test_low_latency_matches_reference(pool, case, quiet)
    with case_pool(2, workers.LL_CASES_BUFFER, device="cpu", timeout_s=120, env={"EP_RT_LL_TWO_KERNELS": "1"}) as two:
        (tmp_path / "two").mkdir()
        two.run(_install_stand_ins, str(tmp_path / "two"), {})
        for case in mod.TWO_KERNEL_CASES:
            mod.test_low_latency_two_kernels_per_call_match_reference(two, case, quiet)
        with pytest.raises(AssertionError, match="two_kernels"):  # ranks that ran the other form are caught
            mod._run(two, "bf16", quiet, two_kernels=False)
    out = capsys.readouterr().out
    assert "[rank 1] LogFMT, hidden 1152: 2 elements differ" in out, out
    for rank in (0, 1):
        log = _log(tmp_path, rank)
        assert log[0] == "built" and log[-1] == "destroyed" and log.count("built") == 1, log
        assert log[1] == "sized for every case", log
        assert [line for line in log if line.startswith("case")] == [f"case {c} 77" for c in mod.CASES[:-1]] + [
            "case after clean_low_latency_buffer 77"
        ]
        assert log[-3:-1] == ["clean", "case after clean_low_latency_buffer 77"]


class _StandInTopology:
    num_nodes = 2


def _install_internode_stand_ins(rank, num_ranks, log_dir, failing):
    from ep_rt.testing import selfcheck_internode as sci
    from tests.gpu import workers

    _install_stand_ins(rank, num_ranks, log_dir, failing)

    def buffer(rank, num_ranks, G):
        buf = _StandInBuffer(log_dir, rank)
        buf.topology = _StandInTopology()
        return buf

    workers.internode_buffer = buffer
    sci.run_graph_case = lambda buf, seed, G, **where: _stand_in_case(buf, workers.GRAPH_CASE, seed, **where)


def test_the_internode_case_test_on_cpu_ranks(tmp_path, monkeypatch):
    from tests.gpu import test_internode_cases_gpu as mod, workers
    from tests.gpu.conftest import case_pool

    monkeypatch.setenv("EP_RT_CASE_SEED", "99")
    spec = mod.POOLS["2x2-chaos"]
    cases = list(spec.cases) + [workers.GRAPH_CASE]
    with case_pool(4, workers.INTERNODE_CASES_BUFFER, env=spec.env(), device="cpu", timeout_s=120) as pool:
        pools = SimpleNamespace(get=lambda name: pool)
        pool.run(_install_internode_stand_ins, str(tmp_path), {"bias pair": "fail", "2 SMs": "raise"})
        for case in cases:
            if case == "bias pair":
                with pytest.raises(AssertionError, match=r"(?s)rank 1 \[2x2-chaos\] bias pair: recv_x.*=99"):
                    mod.test_internode_case(pools, "2x2-chaos", case)
            elif case == "2 SMs":
                with pytest.raises(rank_pool.RankError, match="stand-in 2 SMs raised"):
                    mod.test_internode_case(pools, "2x2-chaos", case)
            else:
                mod.test_internode_case(pools, "2x2-chaos", case)
        with pytest.raises(AssertionError):  # the ranks run the chaos transport and say so
            mod.test_internode_case(pools, "2x2", "bf16 uniform")
        assert pool.broken is None
    after = cases.index("2 SMs") + 1
    for rank in range(4):
        want = (
            ["built"]
            + [f"case {c} 99" for c in cases[:after]]
            + ["destroyed", "built"]
            + [f"case {c} 99" for c in cases[after:] + ["bf16 uniform"]]
            + ["destroyed"]
        )
        assert _log(tmp_path, rank) == want


def test_the_ll_nodes_case_test_on_cpu_ranks(tmp_path, monkeypatch, capsys):
    from tests.gpu import test_low_latency_nodes_gpu as mod, workers
    from tests.gpu.conftest import case_pool

    monkeypatch.setenv("EP_RT_CASE_SEED", "31")
    spec = mod.POOLS["4x1-chaos"]
    quiet = SimpleNamespace(disabled=contextlib.nullcontext)
    with case_pool(4, workers.LL_CASES_BUFFER, env=spec.env(), device="cpu", timeout_s=120) as pool:
        pools = SimpleNamespace(get=lambda name: pool, specs=mod.POOLS)
        pool.run(_install_stand_ins, str(tmp_path), {"hooks": "fail", "async": "raise"})
        for case in spec.cases:
            if case == "hooks":
                with pytest.raises(AssertionError, match=r"(?s)rank 1 \[4x1-chaos\] hooks: recv_x.*=31"):
                    mod.test_low_latency_on_nodes(pools, "4x1-chaos", case, quiet)
            elif case == "async":
                with pytest.raises(rank_pool.RankError, match="stand-in async raised"):
                    mod.test_low_latency_on_nodes(pools, "4x1-chaos", case, quiet)
            else:
                mod.test_low_latency_on_nodes(pools, "4x1-chaos", case, quiet)
        with pytest.raises(AssertionError, match="remote_peers"):  # the ranks run the chaos transport and say so
            mod.test_low_latency_on_nodes(pools, "4x1", "bf16", quiet)
        assert pool.broken is None
    assert "[rank 1] [4x1-chaos] LogFMT, hidden 1152: 2 elements differ" in capsys.readouterr().out
    cases = [c if c != workers.LL_AFTER_CLEAN_CASE else "after clean_low_latency_buffer" for c in spec.cases]
    after = spec.cases.index("async") + 1
    for rank in range(4):
        log = [line for line in _log(tmp_path, rank) if line != "clean"]
        want = ["built", f"sized for {len(spec.cases)} cases"] + [f"case {c} 31" for c in cases[:after]]
        want += ["destroyed", "built", f"sized for {len(spec.cases)} cases"]  # the case raised: a fresh Buffer
        want += [f"case {c} 31" for c in cases[after:] + ["bf16"]] + ["destroyed"]
        assert log == want, log


def test_the_workers_size_their_buffers_for_the_pools_cases(monkeypatch):
    """In one process, Buffers faked: ll_buffer sizes for the cases named (and LLCase()'s shape), every case by
    default; internode_case passes its pool's shape to internode_buffer (none: internode_buffer's default)."""
    import ep_rt
    from ep_rt.testing import selfcheck_internode as sci
    from tests.gpu import test_low_latency_nodes_gpu as ll_mod, workers

    class FakeBuffer:
        get_low_latency_rdma_size_hint = staticmethod(ep_rt.Buffer.get_low_latency_rdma_size_hint)

        def __init__(self, group, num_nvl_bytes, num_rdma_bytes, **kwargs):
            self.num_rdma_bytes = num_rdma_bytes

    monkeypatch.setattr(ep_rt, "Buffer", FakeBuffer)
    hint = FakeBuffer.get_low_latency_rdma_size_hint
    every = max(hint(c.max_tokens, c.hidden, 8, c.num_experts) for c in selfcheck_ll.ll_cases(8))
    assert workers.ll_buffer(8).num_rdma_bytes == every
    eight = workers.ll_buffer(8, case_names=ll_mod.EIGHT).num_rdma_bytes
    assert eight == hint(128, 1152, 8, 32) < every // 16  # (the largest of them: hidden 1152)
    assert workers.ll_buffer(8, case_names=(workers.LL_GRAPH_CASE,)).num_rdma_bytes == hint(128, 1024, 8, 32)
    with pytest.raises(ValueError, match="unknown case names"):
        workers.ll_buffer(8, case_names=("no such case",))

    shapes = []

    def fake_internode_buffer(rank, num_ranks, G, *shape):
        shapes.append(shape)
        return SimpleNamespace(topology=SimpleNamespace(num_nodes=num_ranks // G))

    where = []

    def one_check(buf, case, seed, G, reference_device=None):
        where.append(reference_device)
        chk = checker.Checker(case)
        chk.checks += 1
        return chk

    monkeypatch.setattr(workers, "internode_buffer", fake_internode_buffer)
    monkeypatch.setattr(sci, "run_case", one_check)
    for max_shape, device in ((workers.INTERNODE_SIXTEEN_SHAPE, "cpu"), (None, None)):
        try:
            res = workers.internode_case(0, 16, 8, "bf16 uniform", 5, max_shape, device)
        finally:
            rank_pool.rank_forget(workers.INTERNODE_CASES_BUFFER)
        assert res["nodes"] == 2 and res["checks"] == 1 and not res["failures"], res
    assert shapes == [(workers.INTERNODE_SIXTEEN_SHAPE,), ()] and where == ["cpu", None]


def test_ll_transport_names_the_variant_and_the_peers_on_other_nodes():
    """What the LL tests on emulated nodes check their pool's environment by, on a Buffer of the host-path stub
    (tools/host_path_stub.py): 4 ranks, one reached over NVLink (itself), three by puts; the chaos cubin loaded."""
    from tests.gpu import workers
    from tests.host_path_tools import load_stub

    stub = load_stub()
    with stub.stubbed():
        buf = stub.ll_buffer(ranks=4, nvlink_peers=1)
    buf._ll.module = SimpleNamespace(entry={"variant": "chaos"})
    assert workers.ll_transport(buf) == {"variant": "chaos", "remote_peers": 3, "two_kernels": False}
    buf._ll.nvlink_peers, buf._ll.module.entry["variant"] = 4, "default"  # one node
    buf._ll.two_kernels = True  # EP_RT_LL_TWO_KERNELS=1 when the op was made
    assert workers.ll_transport(buf) == {"variant": "default", "remote_peers": 0, "two_kernels": True}
