"""The README's table of which shipped cubins ran on a GPU is what tools/hardware_marks.py --table prints from the
manifest and the marks, so a mark added or lost (a rebuilt cubin) without the README changing fails here."""

import json

from ..repo import REPO, load_tool


def _tool():
    return load_tool("hardware_marks.py", "hardware_marks")


def test_the_readme_holds_the_current_table():
    tool = _tool()
    manifest = json.loads((REPO / "cubins" / "manifest.json").read_text())
    marks = json.loads((REPO / "cubins" / "hardware_runs.json").read_text())["marks"]
    assert tool.ran_table(manifest["cubins"], marks) in (REPO / "README.md").read_text()


def test_a_cubin_without_its_mark_moves_to_built_only():
    tool = _tool()
    entries = [
        {"flavour": "cu13", "arch": "sm_90", "family": "layout", "variant": "default", "path": "a", "sha256": "1"},
        {"flavour": "cu13", "arch": "sm_90", "family": "intranode", "variant": "tma", "path": "b", "sha256": "2"},
    ]
    marks = [{"path": "a", "sha256": "1", "machine": "one H100 80GB HBM3"}, {"path": "b", "sha256": "old"}]
    row = tool.ran_table(entries, marks).splitlines()[2]
    assert row == "| cu13 | none | **ran** (H100): layout. built only: intranode tma | none |"
