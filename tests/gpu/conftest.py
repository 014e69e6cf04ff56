import contextlib
import os
import re

import pytest
import torch


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
