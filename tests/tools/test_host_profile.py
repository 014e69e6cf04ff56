"""tools/host_profile.py's split of a call's host time at its kernel launches (the tool itself runs on a GPU; its
timing helper runs here with the launches and the device sync stood in for)."""

import time
import types

import torch

from tests.repo import load_tool


def _tool():
    return load_tool("host_profile.py", "host_profile")


def test_the_split_times_the_python_before_the_first_launch_and_after_the_last(monkeypatch):
    tool = _tool()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    launched = []
    driver = types.SimpleNamespace(
        launch=lambda *a: launched.append("launch"), launch_ex=lambda *a: launched.append("ex")
    )
    real = (driver.launch, driver.launch_ex)

    def busy(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def call():  # 3 ms, a launch, 1 ms, a second launch, 6 ms
        busy(0.003)
        driver.launch()
        busy(0.001)
        driver.launch_ex()
        busy(0.006)

    split = tool._launch_split(call, 5, driver)
    assert split["launches"] == 2 and launched == ["launch", "ex"] * 5
    assert 3000 <= split["to_first_launch_us"] < 3000 + 2500, split
    assert 1000 <= split["first_to_last_launch_us"] < 1000 + 2500, split
    assert 6000 <= split["after_last_launch_us"] < 6000 + 2500, split
    assert (driver.launch, driver.launch_ex) == real  # the driver's functions are given back
    assert tool._launch_split(lambda: None, 3, driver) == {"launches": 0}
