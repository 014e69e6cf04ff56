"""python -m ep_rt tune's CPU parts: the config file (format, validation, loading through EP_RT_CONFIG_FILE into
Buffer.get_dispatch_config / get_combine_config), merging ranks' sweeps, the choice, the table, the plot, the
progress bar, and the command without a GPU."""

import io
import json

import pytest

from ep_rt import Buffer, Config, config_file
from ep_rt.cli import plot, tune
from ep_rt.errors import ConfigFileError
from ep_rt.testing.progress import Progress


def good_doc():
    return {
        "format": "ep_rt-config",
        "version": 1,
        "tuned": {},
        "configs": [
            config_file.entry("dispatch", 2, Config(32, 6, 256, 6, 128)),
            config_file.entry("combine", 2, Config(32, 10, 256, 6, 128)),
        ],
    }


def write(tmp_path, doc, name="cfg.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_buffer_configs_come_from_the_file_when_named(tmp_path, monkeypatch):
    path = write(tmp_path, good_doc())
    monkeypatch.setenv("EP_RT_CONFIG_FILE", str(path))
    assert Buffer.get_dispatch_config(2) == Config(32, 6, 256, 6, 128)
    assert Buffer.get_combine_config(2) == Config(32, 10, 256, 6, 128)
    # Rank counts the file does not have: DeepEP's table with Buffer.num_sms.
    assert Buffer.get_dispatch_config(4) == Config(Buffer.num_sms, 6, 256, 6, 128)
    monkeypatch.delenv("EP_RT_CONFIG_FILE")
    assert Buffer.get_dispatch_config(2).num_sms == Buffer.num_sms


def test_a_changed_file_is_read_again(tmp_path, monkeypatch):
    path = write(tmp_path, good_doc())
    monkeypatch.setenv("EP_RT_CONFIG_FILE", str(path))
    assert Buffer.get_dispatch_config(2).num_sms == 32
    doc = good_doc()
    doc["configs"][0]["num_sms"] = 100  # a different size too: the cache key is (mtime, size)
    write(tmp_path, doc)
    assert Buffer.get_dispatch_config(2).num_sms == 100


def edited(**change):
    doc = good_doc()
    doc["configs"][0].update(change)
    return doc


@pytest.mark.parametrize(
    "doc,match",
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "not an ep_rt config file"),
        ({**good_doc(), "format": "deepep"}, "not an ep_rt config file"),
        ({**good_doc(), "version": 2}, "version 2"),
        ({**good_doc(), "configs": {}}, "must be a list"),
        ({**good_doc(), "configs": [3]}, r"configs\[0\] must be an object"),
        (edited(kind="both"), "kind must be one of"),
        (edited(num_ranks=0), "num_ranks must be a positive int"),
        (edited(num_sms="24"), "num_sms must be an int"),
        (edited(num_sms=0), "num_sms must be in"),
        (edited(num_max_nvl_chunked_send_tokens=300), "must be <"),
        (edited(num_smss=3), r"unknown keys \['num_smss'\]"),
        ({**good_doc(), "configs": [good_doc()["configs"][0]] * 2}, "a second dispatch entry for 2 ranks"),
    ],
)
def test_bad_files_are_clear_errors(tmp_path, monkeypatch, doc, match):
    path = write(tmp_path, doc)
    monkeypatch.setenv("EP_RT_CONFIG_FILE", str(path))
    with pytest.raises(ConfigFileError, match=match) as info:
        Buffer.get_dispatch_config(2)
    assert str(path) in str(info.value)


def test_missing_keys_and_missing_file(tmp_path, monkeypatch):
    doc = good_doc()
    del doc["configs"][1]["num_sms"]
    monkeypatch.setenv("EP_RT_CONFIG_FILE", str(write(tmp_path, doc)))
    with pytest.raises(ConfigFileError, match=r"configs\[1\]: missing \['num_sms'\]"):
        Buffer.get_combine_config(2)
    monkeypatch.setenv("EP_RT_CONFIG_FILE", str(tmp_path / "nope.json"))
    with pytest.raises(ConfigFileError, match="cannot read"):
        Buffer.get_combine_config(2)


# ---- the sweep's results -------------------------------------------------------------------------------


def row(num_sms, d_us, c_us, num_recv=1000):
    return {
        "num_sms": num_sms,
        "dispatch_us": d_us,
        "dispatch_gbps": 14.336 * num_recv / d_us,
        "dispatch_call_us": d_us + 50,
        "combine_us": c_us,
        "combine_gbps": 14.336 * num_recv / c_us,
        "combine_call_us": c_us + 40,
        "num_recv": num_recv,
    }


SWEEP = [
    [row(8, 500.0, 600.0), row(16, 300.0, 380.0), row(24, 280.0, 330.0), row(32, 270.0, 360.0)],  # rank 0
    [row(8, 510.0, 590.0), row(16, 320.0, 370.0), row(24, 290.0, 340.0), row(32, 260.0, 380.0)],  # rank 1
]


def test_merge_takes_the_slowest_rank_and_the_choice_the_least_total():
    rows = tune.merge_ranks(SWEEP)
    assert [r["num_sms"] for r in rows] == [8, 16, 24, 32]
    assert rows[2]["dispatch_us"] == 290.0 and rows[2]["combine_us"] == 340.0 and rows[2]["total_us"] == 630.0
    assert rows[2]["dispatch_gbps"] == SWEEP[1][2]["dispatch_gbps"]  # bandwidth of the slowest rank
    assert rows[3]["total_us"] == 270.0 + 380.0
    assert tune.best(rows)["num_sms"] == 24  # 630 us; 32 SMs has the fastest dispatch but 650 us in all


def test_table_marks_the_choice():
    rows = tune.merge_ranks(SWEEP)
    text = tune.format_table(rows, tune.best(rows))
    lines = text.splitlines()
    assert len(lines) == 1 + 4 + 1
    assert lines[3].split()[:2] == ["24", "290.0"] and lines[3].endswith("*")
    assert not lines[4].endswith("*") and "num_sms=24" in lines[-1]


def test_written_config_is_what_buffer_loads_and_keeps_other_rank_counts(tmp_path, monkeypatch):
    path = tmp_path / "tuned.json"
    tune.write_config(path, 4, 12, {"sweep": []})
    tune.write_config(path, 2, 24, {"sweep": tune.merge_ranks(SWEEP)})
    monkeypatch.setenv("EP_RT_CONFIG_FILE", str(path))
    assert Buffer.get_dispatch_config(2) == Config(24, 24, 256, 6, 128)  # chunk sizes of DeepEP's row
    assert Buffer.get_combine_config(2) == Config(24, 10, 256, 6, 128)
    assert Buffer.get_dispatch_config(4).num_sms == 12 and Buffer.get_combine_config(4).num_sms == 12
    doc = json.loads(path.read_text())
    assert set(doc["tuned"]) == {"2", "4"} and len(doc["configs"]) == 4
    tune.write_config(path, 3, 8, {})  # DeepEP has no row for 3 ranks: the table's default (4 ranks' row)
    assert config_file.load(path)[("dispatch", 3)] == Config(8, 6, 256, 6, 128)
    tune.write_config(path, 16, 8, {})  # no row for 16 ranks on one host: DeepEP's Config defaults
    assert config_file.load(path)[("dispatch", 16)] == Config(8)


def test_an_invalid_existing_file_is_not_overwritten(tmp_path):
    path = write(tmp_path, "{broken")
    with pytest.raises(ConfigFileError, match="not overwriting"):
        tune.write_config(path, 2, 24, {})
    assert path.read_text() == "{broken"


def test_sms_option_and_defaults():
    assert tune.parse_sms("24,8,8,16") == [8, 16, 24]
    for bad in ("", "0,4", "129", "a,b"):
        with pytest.raises(Exception, match="--sms"):
            tune.parse_sms(bad)
    assert tune.default_sms(132) == list(range(4, 65, 4)) and tune.default_sms(20) == [4, 8, 12, 16, 20]


def test_plot_without_matplotlib_is_a_note(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    rows = tune.merge_ranks(SWEEP)
    assert tune.draw(tmp_path / "t.png", rows, 2, "shape") == plot.NO_MATPLOTLIB
    assert not (tmp_path / "t.png").exists()


def test_plot_with_matplotlib_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows = tune.merge_ranks(SWEEP)
    assert "written" in tune.draw(tmp_path / "t.png", rows, 2, "shape")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_bar():
    out = io.StringIO()
    bar = Progress(4, "tuning", stream=out, width=8)
    assert bar.render(0) == "tuning [........] 0/4"
    assert bar.render(3, "num_sms=24") == "tuning [######..] 3/4 num_sms=24"
    bar.update(2)
    bar.update(4, "done")
    assert out.getvalue() == "\rtuning [####....] 2/4\rtuning [########] 4/4 done\n"
    with pytest.raises(ValueError):
        Progress(0, "x")


def test_tune_without_a_gpu_says_so(capsys):
    from ep_rt.cli import main

    assert main(["tune", "--tokens", "128"]) == 1
    assert "no CUDA GPU" in capsys.readouterr().out


def test_tune_help_explains_what_is_swept(capsys):
    from ep_rt.cli import main

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = capsys.readouterr().out
    assert "only num_sms changes" in text and "EP_RT_CONFIG_FILE" in text
