"""The per-process launch counter (runtime.launch.launch_count) that the bad-input catalogue reads: every launch
through a Launcher counts once, plain, attribute or snapshot (hook) launches alike, a launch the driver refuses
does not; and no module launches a kernel except through a Launcher."""

import ctypes
import re

import pytest

from ep_rt.runtime import launch

from ..repo import REPO

PKG = REPO / "ep_rt"


class _Params(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int)]


class _Module:
    entry = {"path": "fake.cubin", "blocks": {"k": 128, "c": 128}}

    def function(self, name):
        return f"function {name}"


class _Stream:
    cuda_stream = 1234


@pytest.fixture
def fake_driver(monkeypatch):
    calls = []
    monkeypatch.setattr(launch.driver, "make_stream", lambda handle: f"stream {handle}")
    monkeypatch.setattr(launch.driver, "make_launch_config", lambda *a, **k: "config")
    monkeypatch.setattr(launch.driver, "launch", lambda f, grid, *rest: calls.append(("launch", f, grid)))
    monkeypatch.setattr(launch.driver, "launch_ex", lambda cfg, f, grid, *rest: calls.append(("launch_ex", f, grid)))
    return calls


def test_every_kind_of_launch_counts_once(fake_driver):
    plain = launch.Launcher(_Module(), "k", _Params)
    coop = launch.Launcher(_Module(), "c", _Params, cooperative=True)
    start = launch.launch_count()
    plain(4, _Stream())
    coop(2, _Stream())
    hook = plain.snapshot()
    assert launch.launch_count() == start + 2  # a snapshot launches nothing by itself
    hook(3, _Stream())
    hook(3, _Stream(), early=True)
    assert launch.launch_count() == start + 4
    assert [c[0] for c in fake_driver] == ["launch", "launch_ex", "launch", "launch_ex"]


def test_a_refused_launch_does_not_count(fake_driver, monkeypatch):
    def refuse(*a):
        raise RuntimeError("cuLaunchKernel(k): CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(launch.driver, "launch", refuse)
    k = launch.Launcher(_Module(), "k", _Params)
    start = launch.launch_count()
    with pytest.raises(RuntimeError):
        k(1, _Stream())
    assert launch.launch_count() == start


def test_only_the_launcher_calls_the_driver_launch_functions():
    """So the counter sees every ep_rt kernel."""
    pattern = re.compile(r"\bdriver\.launch(_ex)?\(|\bcuLaunchKernel(Ex)?\(")
    callers = sorted(
        str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))
    )
    assert callers == ["runtime/driver.py", "runtime/launch.py"], callers
