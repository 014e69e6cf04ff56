"""The commands on a GPU machine, as a user runs them (a fresh interpreter each): doctor's smoke round and exit
code, tune writing a config file that Buffer then returns, and (marked bench: long) bench --json. Two ranks, which
may share one GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import gpus

ROOT = Path(__file__).resolve().parents[2]


def ep_rt(*args, timeout=1200, **env):
    environ = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    proc = subprocess.run(
        [sys.executable, "-m", "ep_rt", *args], capture_output=True, text=True, env=environ, timeout=timeout, cwd=ROOT
    )
    return proc, proc.stdout + proc.stderr


@gpus(1)
def test_doctor_smoke_round_passes():
    proc, out = ep_rt("doctor")
    smoke = [line for line in out.splitlines() if " smoke: " in f" {line}"]
    assert len(smoke) == 2 and all(line.startswith("ok") for line in smoke), out
    assert proc.returncode == 0, out  # no item is an error on a working GPU machine
    assert "init failed for transport" not in out, out  # a single-node LL buffer prints no transport errors
    # the driver answered the host-memory query (a failed query is a warning naming the driver)
    host_words = [line for line in out.splitlines() if "GPU 0 host-mapped words" in line]
    assert len(host_words) == 1 and host_words[0].startswith("ok") and "native host atomics" in host_words[0], out


@gpus(1)
def test_tune_writes_a_config_that_buffer_returns(tmp_path):
    cfg = tmp_path / "tuned.json"
    proc, out = ep_rt(
        "tune",
        "--ranks",
        "2",
        "--tokens",
        "512",
        "--hidden",
        "1024",
        "--topk",
        "4",
        "--experts",
        "16",
        "--sms",
        "4,8",
        "--warmup",
        "1",
        "--iters",
        "2",
        "--output",
        str(cfg),
        "--no-plot",
    )
    assert proc.returncode == 0, out
    doc = json.loads(cfg.read_text())
    chosen = doc["tuned"]["2"]["num_sms"]
    assert chosen in (4, 8) and [r["num_sms"] for r in doc["tuned"]["2"]["sweep"]] == [4, 8]
    code = (
        "from ep_rt import Buffer; print(Buffer.get_dispatch_config(2).num_sms, Buffer.get_combine_config(2).num_sms)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), EP_RT_CONFIG_FILE=str(cfg)),
    )
    assert out.stdout.split() == [str(chosen)] * 2, out.stderr


@gpus(1)
@pytest.mark.bench
def test_bench_json(tmp_path):
    path = tmp_path / "bench.json"
    proc, out = ep_rt("bench", "--ranks", "2", "--json", str(path), timeout=3000)
    assert proc.returncode == 0, out
    doc = json.loads(path.read_text())
    assert doc["num_ranks"] == 2 and len(doc["ranks"]) == 2
    for res in doc["ranks"]:
        assert [r["name"] for r in res["ht"]] == ["dispatch BF16", "dispatch FP8", "combine BF16"]
        assert len(res["ll"]) == 6 and all(r["gbps"] > 0 for r in res["ht"] + res["ll"])
