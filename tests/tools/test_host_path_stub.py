"""tools/host_path_stub.py runs through every part (few iterations), counts the launches of each call, says that it
measures no GPU time, and puts torch and the driver back when it is done."""

import json

import torch

from ep_rt.runtime import driver
from tests.host_path_tools import load_stub


def test_the_harness_times_every_hot_call_and_counts_its_launches(tmp_path, capsys):
    stub = load_stub()
    empty, launch = torch.empty, driver.launch
    out = tmp_path / "rows.json"
    stub.main(["--scale", "0.005", "--json", str(out)])
    assert torch.empty is empty and driver.launch is launch  # the stubs are gone again
    printed = capsys.readouterr().out
    assert "no GPU time is measured" in printed
    report = json.loads(out.read_text())
    assert "no GPU time" in report["note"]
    rows = {r["call"]: r for r in report["rows"]}
    want = {  # call -> kernel launches it makes (cuLaunchKernel + cuLaunchKernelEx)
        "get_dispatch_layout": 1,
        "intranode dispatch BF16": 3,  # the id check, notify, dispatch
        "intranode cached dispatch": 1,
        "intranode combine": 1,
        "internode dispatch BF16": 5,
        "internode cached dispatch": 3,
        "internode combine": 3,
        "LL dispatch FP8": 1,  # one kernel per eager LL call (issue 23 item 3)
        "LL dispatch BF16": 1,
        "LL dispatch FP8, async_finish": 1,
        "LL dispatch FP8, return_recv_hook (hook called)": 2,  # a hook splits it: send now, receive from the hook
        "LL combine BF16": 1,
        "LL combine LogFMT": 1,
        "LL combine BF16, out= given": 1,
        "LL combine BF16, return_recv_hook (hook called)": 2,
    }
    for call, n in want.items():
        row = rows[call]
        got = row["per_call"].get("cuLaunchKernel", 0) + row["per_call"].get("cuLaunchKernelEx", 0)
        assert got == n, (call, row["per_call"])
        assert row["median_us"] > 0
    assert rows["LL dispatch FP8"]["per_call"]["torch.empty"] >= 1
    for call, row in rows.items():  # no hot call syncs the device (issue 23 item 1): no aminmax and its copies
        assert not any(name.startswith("torch.aminmax") for name in row["per_call"]), (call, row["per_call"])


def test_only_runs_one_part(tmp_path):
    stub = load_stub()
    out = tmp_path / "rows.json"
    stub.main(["--only", "ll", "--scale", "0.005", "--json", str(out)])
    calls = [r["call"] for r in json.loads(out.read_text())["rows"]]
    assert calls and all(c.startswith("LL ") for c in calls)
