import contextlib
import os
import re
from dataclasses import dataclass

import pytest
import torch

from ep_rt.runtime.choice import ll_variant


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine; see docs/GPU_RESULTS.md)")
    for item in items:
        if "tests/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


def gpus(n):
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return pytest.mark.skipif(have < n, reason=f"needs {n} GPUs, found {have}")


# ---- one pytest item per case (tests/gpu/*_cases_gpu.py) -----------------------------------------------------
# A module's ranks are spawned once per variant (ep_rt.testing.rank_pool.RankPool, a module-scoped fixture) and
# each rank keeps one Buffer between cases; every case is then its own test: its own verdict, and its own node id
# to re-run it alone (RETEST="tests/gpu/test_intranode_cases_gpu.py::test_...[safe-bf16_uniform]").


def case_ids(names) -> list:
    """Node-id-safe ids of case names ("holes (-1 in topk_idx)" -> "holes_1_in_topk_idx"): no spaces or brackets
    to quote in a shell's RETEST list. Distinct names must give distinct ids."""
    ids = [re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_") for name in names]
    clashes = sorted({i for i in ids if ids.count(i) > 1})
    if clashes:
        raise ValueError(f"case names that give the same test id: {clashes}")
    return ids


def case_seed() -> int:
    """The seed of one case's inputs: EP_RT_CASE_SEED if set (to re-run a failed case with the seed its failure
    printed), else a fresh one."""
    given = os.environ.get("EP_RT_CASE_SEED")
    return int(given) if given else int.from_bytes(os.urandom(4), "little")


@contextlib.contextmanager
def case_pool(
    num_ranks: int, cache_key: str, *, env=None, timeout_s: float = 300.0, peer_timeout_s=None, **pool_kwargs
):
    """A RankPool for one module's cases; at the end the ranks' kept Buffer (workers.drop_cached_buffer under
    cache_key) is destroyed while the pool still works, then the ranks stop. After one rank's error the others get
    a peer wait's timeout (peer_timeout_s, default EP_RT_TIMEOUT_S: the internode ranks' network timeout is longer)
    and more to report theirs (a peer of the failed rank fails its wait, then raises).
    pool_kwargs: RankPool's others (device="cpu": the CPU test of this wiring)."""
    from ep_rt import env as ep_env
    from ep_rt.testing.rank_pool import RankPool

    from . import workers

    grace = (peer_timeout_s or ep_env.timeout_s()) + 15.0
    with RankPool(num_ranks, env=env, timeout_s=timeout_s, error_grace_s=grace, **pool_kwargs) as pool:
        try:
            yield pool
        finally:
            if pool.broken is None:
                with contextlib.suppress(Exception):  # (the ranks are ended by close() either way)
                    pool.run(workers.drop_cached_buffer, cache_key, timeout_s=60)


def run_case(pool, fn, cache_key: str, *args, timeout_s: float) -> list:
    """pool.run(fn, *args); where fn raised on some ranks, their kept Buffer may have failed (a peer's timeout
    fails it for good): every rank drops it, so the next case starts on a fresh one, and the error is raised."""
    from ep_rt.testing.rank_pool import RankError

    from . import workers

    try:
        return pool.run(fn, *args, timeout_s=timeout_s)
    except RankError:
        if pool.broken is None:
            with contextlib.suppress(Exception):  # (a failure here breaks the pool: later cases say so at once)
                pool.run(workers.drop_cached_buffer, cache_key, timeout_s=120)
        raise


def case_timeout_s(peer_timeout_s=None) -> float:
    """One case's deadline: well past a peer wait's own timeout (peer_timeout_s, default EP_RT_TIMEOUT_S), so a wait
    that times out is reported by the library on every rank (and the pool stays usable), not by the pool's
    deadline."""
    from ep_rt import env

    return max(120.0, (peer_timeout_s or env.timeout_s()) + 60.0)


def check_case_results(results, what: str, seed: int) -> None:
    """Every rank's failures of one case (what: how the messages name it, e.g. "[2x2] bf16 uniform") in one
    assertion with the seed to re-run it; and every rank checked something."""
    problems = [f"rank {rank} {what}: {f}" for rank, r in enumerate(results) for f in r["failures"]]
    assert not problems, "\n".join(problems[:40]) + f"\n(EP_RT_CASE_SEED={seed})"
    assert all(r["checks"] > 0 for r in results), [r["checks"] for r in results]


def log_case_notes(capsys, results, what: str) -> None:
    """Every rank's measurements of one case (how many LogFMT outputs differ, ...) into the run's log, pass or
    fail."""
    with capsys.disabled():
        for rank, r in enumerate(results):
            for note in r["notes"]:
                print(f"\n[rank {rank}] {what}: {note}", end="")
        print()


# ---- per-case pools on emulated nodes (test_internode_cases_gpu.py, test_low_latency_nodes_gpu.py) ----------


def sixteen_rank_reference_device() -> str | None:
    """Where the 16-rank pools run the reference: EP_RT_TEST_REFERENCE_DEVICE, "gpu" (the default: None) or "cpu".
    Measured on 2x8 LL bf16 (one H100): 68 s with the GPU reference (attempt 20261206T204437Z), 283.7 s with the
    CPU one while every rank ran torch's default of one thread per core (20261206T222145Z); the CPU reference with
    each rank's share of the cores has not run on a GPU host, hence the switch rather than a new default."""
    value = os.environ.get("EP_RT_TEST_REFERENCE_DEVICE", "gpu").strip().lower()
    if value not in ("gpu", "cpu"):
        raise ValueError(f"EP_RT_TEST_REFERENCE_DEVICE must be 'gpu' or 'cpu', not {value!r}")
    return None if value == "gpu" else "cpu"


@dataclass(frozen=True)
class NodesPool:
    """One pool of ranks sharing the GPU as nodes of ranks_per_node (EP_RT_RANKS_PER_NODE: peers on other nodes
    take the NVSHMEM put path), the cases it runs and the environment its ranks start with."""

    num_ranks: int
    ranks_per_node: int
    cases: tuple
    timeout_s: int = 20  # EP_RT_TIMEOUT_S in the ranks
    net_timeout_s: int = 40  # EP_RT_NET_TIMEOUT_S (the internode kernels' waits)
    aggressive: bool = False
    chaos: bool = False
    # The least a case of this pool is given before the pool gives up on it (0: case_timeout_s's own): for pools
    # whose ranks spend longer in the CPU reference than in any wait.
    case_deadline_s: float = 0.0
    # Where the ranks make the inputs and run the reference (None: the GPU; "cpu": each rank then takes its share of
    # the cores, workers.share_cpu_threads). The 16-rank pools take sixteen_rank_reference_device().
    reference_device: str | None = None

    @property
    def peer_timeout_s(self) -> int:
        """The longest a rank's wait for a peer may take before the library reports it."""
        return max(self.timeout_s, self.net_timeout_s)

    def env(self) -> dict:
        return {
            "EP_RT_RANKS_PER_NODE": str(self.ranks_per_node),
            "EP_RT_TIMEOUT_S": str(self.timeout_s),
            "EP_RT_NET_TIMEOUT_S": str(self.net_timeout_s),
            "EP_RT_AGGRESSIVE_PTX": "1" if self.aggressive else "0",
            "EP_RT_CHAOS_TRANSPORT": "1" if self.chaos else "0",
        }

    def marks(self) -> list:
        """The markers the steps of tools/gpu_run.sh select this pool's items by."""
        marks = [pytest.mark.aggressive] if self.aggressive else []
        marks += [pytest.mark.chaos] if self.chaos else []
        marks += [pytest.mark.eight_ranks] if self.num_ranks == 8 else []
        return marks + ([pytest.mark.sixteen] if self.num_ranks == 16 else [])


def pool_items(pools: dict) -> list:
    """One pytest param per (pool, case), pool by pool in the dict's order (one pool's ranks hold the GPU at a
    time), with node ids <pool>-<case id> and the pool's marks."""
    return [
        pytest.param(name, case, id=f"{name}-{cid}", marks=pool.marks())
        for name, pool in pools.items()
        for case, cid in zip(pool.cases, case_ids(pool.cases))
    ]


class OnePoolAtATime:
    """The RankPool of the current item's pool (specs: name -> NodesPool), started at its first item; the one
    before is closed first (the items come pool by pool), so one pool's ranks hold the GPU at a time. cache_key:
    the Buffer the ranks keep between cases."""

    def __init__(self, specs: dict, cache_key: str):
        self.specs, self.cache_key = specs, cache_key
        self.name, self.pool, self._cm = None, None, None

    def get(self, name):
        if name != self.name:
            self.close()
            spec = self.specs[name]
            self._cm = case_pool(spec.num_ranks, self.cache_key, env=spec.env(), peer_timeout_s=spec.peer_timeout_s)
            self.pool, self.name = self._cm.__enter__(), name
        return self.pool

    def close(self):
        cm, self._cm, self.name, self.pool = self._cm, None, None, None
        if cm is not None:
            cm.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass(frozen=True)
class LLNodesPool(NodesPool):
    """A pool of the LL suite on emulated nodes (test_low_latency_nodes_gpu.py; with `packed`, the packed layout's
    cubins: test_low_latency_packed_gpu.py)."""

    packed: bool = False  # EP_RT_LL_PACKED in the ranks

    @property
    def peer_timeout_s(self) -> int:
        return self.timeout_s  # the LL kernels' waits, remote peers' too

    @property
    def variant(self) -> str:
        """The LL cubin variant every rank must have loaded."""
        return ll_variant(self.packed, self.chaos)

    def env(self) -> dict:
        # DeepEP's rule for queue pairs once peers are remote, >= (T + 1) * 2: T=1024 in the list
        return {**super().env(), "NVSHMEM_QP_DEPTH": "4096", "EP_RT_LL_PACKED": "1" if self.packed else "0"}


def run_ll_nodes_case(pools: OnePoolAtATime, pool_name: str, case: str, capsys) -> None:
    """One LL case on its pool's ranks (an LLNodesPool, started by `pools` if it is not the current one): every
    rank checks it against ep_rt.reference_ll and reports the transport it ran (the remote peers the layout gives,
    the cubin variant the pool asked for)."""
    from . import workers

    spec = pools.specs[pool_name]
    pool = pools.get(pool_name)
    seed = case_seed()
    args = (case, seed, spec.cases, spec.reference_device)
    timeout_s = max(case_timeout_s(spec.timeout_s), spec.case_deadline_s)
    results = run_case(pool, workers.ll_case, workers.LL_CASES_BUFFER, *args, timeout_s=timeout_s)
    log_case_notes(capsys, results, f"[{pool_name}] {case}")
    want = {"remote_peers": spec.num_ranks - spec.ranks_per_node, "variant": spec.variant}
    assert [{k: r[k] for k in want} for r in results] == [want] * spec.num_ranks, results
    check_case_results(results, f"[{pool_name}] {case}", seed)


# ---- fault tests on emulated nodes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultLayout:
    """Where a fault test's ranks run: one node (ranks_per_node None) or emulated nodes, over P2P puts or through
    the chaos transport."""

    num_ranks: int
    ranks_per_node: int | None = None
    chaos: bool = False
    packed: bool = False  # the packed LL layout (EP_RT_LL_PACKED=1; the LL Buffers sized by its hint)

    def env(self) -> dict:
        env = {"EP_RT_CHAOS_TRANSPORT": "1" if self.chaos else "0", "EP_RT_LL_PACKED": "1" if self.packed else "0"}
        return env | ({"EP_RT_RANKS_PER_NODE": str(self.ranks_per_node)} if self.ranks_per_node else {})

    @property
    def remote_peers(self) -> int:
        """Peers of each rank on other nodes (the put path)."""
        return self.num_ranks - (self.ranks_per_node or self.num_ranks)

    @property
    def variant(self) -> str:
        """The LL cubin variant the ranks must load."""
        return ll_variant(self.packed, self.chaos)


ONE_NODE = FaultLayout(2)
# Issue 21: the LL faults with the silent or dead rank on another node (the put path), over P2P puts and through
# the chaos transport; 2 x 2 also has a peer of the same node (NVLink) among the survivors. Issue 22: the same
# faults under the packed layout, on one node, over P2P puts and through the chaos transport.
NODE_FAULT_LAYOUTS = {
    "2x1": FaultLayout(2, 1),
    "2x1-chaos": FaultLayout(2, 1, True),
    "2x2-chaos": FaultLayout(4, 2, True),
    "1x2-packed": FaultLayout(2, packed=True),
    "2x1-packed": FaultLayout(2, 1, packed=True),
    "2x2-packed-chaos": FaultLayout(4, 2, True, packed=True),
}


def node_fault_marks(layout: FaultLayout) -> list:
    """ll_nodes (step ll_nodes; the steps that run the one-node fault tests leave these out), chaos where the
    chaos transport runs, ll_packed under the packed layout (step ll_packed_faults; ll_nodes_faults leaves it out)."""
    marks = [pytest.mark.ll_nodes] + ([pytest.mark.chaos] if layout.chaos else [])
    return marks + ([pytest.mark.ll_packed] if layout.packed else [])


# Each GPU test's verdict and, for a failure, its traceback go to the log as soon as the test ends: a step that
# runs into its time limit is killed before pytest's end-of-run summary, and the failures before it would be lost
# (attempt 20261202T012159Z kept only ".F.").
_CONFIG = {}


def pytest_configure(config):
    _CONFIG["config"] = config  # (the terminal reporter registers later: looked up at each report)


def report_line(report) -> str | None:
    """The line (and, for a failure, the traceback) written for a finished test phase, or None."""
    if report.when == "call" or (report.failed and report.when != "call"):
        verdict = "FAILED" if report.failed else ("SKIPPED" if report.skipped else "PASSED")
        line = f"[ep_rt] {verdict} {report.nodeid} ({report.when}, {report.duration:.1f} s)"
        if not report.failed:
            return line
        # The rank processes' output (a hang's stack dumps among it: ep_rt.testing.spawn) is captured with the test's.
        captured = "".join(
            f"\n----- {name} (last {TAIL_LINES} lines) -----\n" + "\n".join(text.splitlines()[-TAIL_LINES:])
            for name, text in report.sections
            if "stderr" in name or "stdout" in name
        )
        return line + "\n" + report.longreprtext + captured
    return None


TAIL_LINES = 300


def pytest_runtest_logreport(report):
    config = _CONFIG.get("config")
    line, tr = report_line(report), config and config.pluginmanager.get_plugin("terminalreporter")
    if line is not None and tr is not None:
        tr.write_line("")
        tr.write_line(line)
