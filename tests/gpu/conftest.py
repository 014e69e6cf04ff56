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
