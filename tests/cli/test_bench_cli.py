"""python -m ep_rt bench's CPU parts: the JSON document and text of given results (stand-ins for the ranks'
rows), the bandwidth series the plot draws, and the command without a GPU."""

import json
import re

import pytest

from ep_rt.cli import bench
from ep_rt.testing.bench_main import FORMULAS


def ht_row(name, kernel_us, gbps):
    return {
        "name": name,
        "num_sms": 24,
        "kernel_us": kernel_us,
        "notify_us": 20.0,
        "call_us": kernel_us + 80,
        "host_us": 60.0,
        "gbps": gbps,
        "num_recv": 9000,
    }


def ll_row(name, experts, kernel, gbps):
    return {
        "name": name,
        "experts": experts,
        "events": {"kernel": kernel + 2, "send": 10.0, "recv": 12.0},
        "call": kernel + 30,
        "profiler": {"kernel": kernel, "send": 9.0, "recv": 11.0},
        "gbps": gbps,
    }


def results():
    return [
        {
            "rank": r,
            "ht": [ht_row("dispatch BF16", 280.0 + r, 410.0), ht_row("combine BF16", 340.0, 345.0)],
            "ll": [ll_row("LL dispatch FP8", 288, 29.0, 270.0)],
            "nvl_bytes": 3 << 27,
        }
        for r in range(2)
    ]


def test_json_document_round_trips_with_the_formulas():
    doc = bench.document(results(), 24, "NVIDIA H200", 2)
    back = json.loads(json.dumps(doc))
    assert back["num_ranks"] == 2 and back["formulas"] == FORMULAS and back["ranks"][1]["ht"][0]["kernel_us"] == 281.0
    assert {"ht gbps", "ll gbps", "ht kernel_us", "ll call_us"} <= set(FORMULAS)


def test_text_has_every_rank_and_row():
    out = bench.text(bench.document(results(), 24, "NVIDIA H200", 2))
    lines = out.splitlines()
    assert lines[0] == "ep_rt bench: 2 ranks on 2 x NVIDIA H200 (HT with 24 SMs)"
    assert sum(line.startswith("rank 1: dispatch BF16") for line in lines) == 1
    row = next(line for line in lines if line.startswith("rank 1: dispatch BF16")).split()
    assert row[4:7] == ["24", "281.0", "410.0"]  # SMs, kernel us, GB/s
    assert sum("LL dispatch FP8" in line for line in lines) == 2
    assert "rank 0: HT NVL buffer 384.0 MiB" in lines


def test_bandwidth_series_for_the_plot():
    labels, series = bench.bandwidth_series(bench.document(results(), 24, "x", 2))
    assert labels == ["HT dispatch BF16", "HT combine BF16", "LL dispatch FP8 (288 experts)"]
    assert series == {"rank 0": [410.0, 345.0, 270.0], "rank 1": [410.0, 345.0, 270.0]}
    odd = results()
    odd[1]["ll"] = []
    with pytest.raises(ValueError, match="other workloads"):
        bench.bandwidth_series(bench.document(odd, 24, "x", 2))


def test_bench_without_a_gpu_says_so(capsys):
    from ep_rt.cli import main

    assert main(["bench", "--json", "-"]) == 1
    assert "no CUDA GPU" in capsys.readouterr().out


def test_internode_rows_are_labelled_emulated_and_charted():
    from dataclasses import asdict

    from ep_rt.testing.bench import IN_WORKLOADS, InternodeBenchRow

    rows = [
        asdict(InternodeBenchRow(name, 24, 500.0, 40.0, 900.0, 60.0, 120.0, 8000, 7900, True)) for name in IN_WORKLOADS
    ]
    doc = bench.document([{"rank": 0, "ht": [], "ll": [], "internode": rows}], 24, "NVIDIA H200", 1)
    out = bench.text(doc)
    assert "internode dispatch FP8" in out and "RDMA GB/s" in out and "emulated nodes" in out
    labels, series = bench.bandwidth_series(doc)
    assert labels[0] == "internode dispatch BF16 (RDMA metric, emulated)" and series["rank 0"] == [60.0] * 3


NETWORK = {"put_signals": 1904.0, "signals": 64.0, "quiets": 1.0, "fences": 0.0, "bytes": 14.2e6, "charged_ns": 5600.0}


def test_chaos_rows_have_their_network_counts_under_them_and_in_json():
    from ep_rt.testing.bench import InternodeBenchRow, internode_record

    res = results()
    res[0]["ll"][0]["network"] = dict(NETWORK)
    inter = InternodeBenchRow("internode combine BF16", 24, 500.0, 40.0, 900.0, 60.0, 120.0, 8000, 7900, True, NETWORK)
    res[1]["internode"] = [internode_record(inter)]
    doc = json.loads(json.dumps(bench.document(res, 24, "NVIDIA H200", 2)))
    assert doc["ranks"][0]["ll"][0]["network"] == NETWORK and doc["ranks"][1]["internode"][0]["network"] == NETWORK
    assert "EP_RT_CHAOS_TRANSPORT=1" in doc["formulas"]["network"]
    lines = bench.text(doc).splitlines()
    under = "network per call: 1904 put-with-signal, 64 signal, 1 quiet, 0 fence, 14.20 MB, 5.6 us charged"
    for rank, row in ((0, "LL dispatch FP8"), (1, "internode combine BF16")):
        i = next(i for i, line in enumerate(lines) if line.startswith(f"rank {rank}: {row}"))
        assert lines[i + 1] == f"rank {rank}:   {under}"
        assert f"rank {rank}: (chaos transport (EP_RT_CHAOS_TRANSPORT=1): these times are not network timings" in (
            "\n".join(lines[i + 2 :])
        )
    assert sum("network per call" in line for line in lines) == 2  # rank 1's LL row was not counted


def test_rows_without_counts_print_and_record_nothing_new():
    res = results()
    inter = bench.bench_mod.InternodeBenchRow(
        "internode dispatch BF16", 24, 500.0, 40.0, 900.0, 60.0, 120.0, 8, 7, True
    )
    res[0]["internode"] = [bench.bench_mod.internode_record(inter)]
    doc = json.loads(json.dumps(bench.document(res, 24, "NVIDIA H200", 2)))
    rows = [row for r in doc["ranks"] for part in ("ht", "ll", "internode") for row in r.get(part, [])]
    assert rows and not any("network" in row for row in rows)
    out = bench.text(doc)
    assert "network per call" not in out and "chaos" not in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--nvl-fraction", "0"], "must be in \\(0, 1\\]"),
        (["--nvl-fraction", "1.5"], "must be in \\(0, 1\\]"),
        (["--nvl-fraction", "0.5", "--ll-only"], "high-throughput benchmarks"),
        (["--rdma-fraction", "0"], "must be in \\(0, 1\\]"),
        (["--rdma-fraction", "0.5"], "internode benchmark"),
        (["--rdma-fraction", "0.5", "--ht-only"], "internode benchmark"),
    ],
)
def test_fractions_out_of_range_or_without_their_benchmark_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert re.search(message, capsys.readouterr().err)


def test_internode_rows_in_rounds_show_their_buffers_and_rounds():
    from ep_rt.testing.bench import InternodeBenchRow, internode_record

    res = results()
    row = InternodeBenchRow("internode dispatch BF16", 24, 900.0, 60.0, 1500.0, 30.0, 60.0, 8000, 7900, True, None, 3)
    res[0].update(internode=[internode_record(row)], nvl_bytes=96 << 20, rdma_bytes=48 << 20)
    doc = json.loads(json.dumps(bench.document(res, 24, "NVIDIA H200", 2)))
    assert doc["ranks"][0]["internode"][0]["rounds"] == 3
    lines = bench.text(doc).splitlines()
    assert "rank 0: internode buffers: NVL 96.0 MiB, RDMA 48.0 MiB" in lines
    header = next(line for line in lines if "RDMA GB/s" in line)
    body = next(line for line in lines if line.startswith("rank 0: internode dispatch BF16"))
    assert header.split()[-1] == "rounds" and body.split()[-1] == "3"
    old = internode_record(row)
    del old["rounds"]  # a record written before the column: one pass
    assert InternodeBenchRow(**old).rounds == 1


def test_the_internode_bench_buffers_are_the_fractions_of_their_one_pass_hints(monkeypatch):
    import ep_rt
    from ep_rt import Config
    from ep_rt.testing import bench_main

    made = []
    monkeypatch.setattr(ep_rt, "Buffer", lambda group, nvl, rdma, **kw: made.append((nvl, rdma)))
    monkeypatch.setenv("EP_RT_RANKS_PER_NODE", "2")
    bench_main.internode_buffer(4, 24)
    bench_main.internode_buffer(4, 24, nvl_fraction=0.5, rdma_fraction=0.25)
    cfg = Config(24)
    nvl, rdma = cfg.get_nvl_buffer_size_hint(7168 * 2, 4, 4096), cfg.get_rdma_buffer_size_hint(7168 * 2, 4, 4096)
    assert made[0] == (nvl, rdma)
    assert made[1] == (-(-(nvl // 2) // 128) * 128, -(-(rdma // 4) // 128) * 128)
    assert all(size % 128 == 0 for pair in made for size in pair)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--ll-experts", "288,x"], "comma-separated integers"),
        (["--ll-experts", "0"], "in \\[1, 65536\\]"),
        (["--ll-experts", "65537"], "in \\[1, 65536\\]"),
        (["--ll-experts", "36,36"], "twice"),
        (["--ll-experts", "36", "--ht-only"], "low-latency benchmark"),
        (["--ll-experts", "36", "--internode", "2"], "low-latency benchmark"),
        (["--ll-experts", "288,36", "--ranks", "8"], "\\[36\\] not a multiple of the 8 ranks"),
    ],
)
def test_ll_experts_refuses_what_no_ll_call_takes(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert re.search(message, capsys.readouterr().err)


def test_the_ll_bench_buffer_is_sized_for_its_largest_expert_count(monkeypatch):
    import ep_rt
    from ep_rt.testing import bench_main

    made = []

    class FakeBuffer:
        def __init__(self, group, nvl, rdma, **kw):
            made.append((nvl, rdma, kw["num_qps_per_rank"]))

        get_low_latency_rdma_size_hint = staticmethod(ep_rt.Buffer.get_low_latency_rdma_size_hint)

    monkeypatch.setattr(ep_rt, "Buffer", FakeBuffer)
    bench_main.ll_buffer(1)
    bench_main.ll_buffer(1, (36, 288))
    bench_main.ll_buffer(2, (36,))
    hint = ep_rt.Buffer.get_low_latency_rdma_size_hint
    assert made == [
        (0, hint(128, 7168, 1, 288), 288),
        (0, hint(128, 7168, 1, 288), 288),
        (0, hint(128, 7168, 2, 36), 18),
    ]
    assert hint(128, 7168, 2, 36) < hint(128, 7168, 2, 288)  # the default rows' buffer is not taken for a small count
