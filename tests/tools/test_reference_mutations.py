"""tools/mutate_reference.py: its mutation list still applies to the reference sources, docs/REFERENCE_MUTATIONS.md
is generated from that list (same mutations, same order, every semantic one recorded as killed), and the tool
really runs a mutant against the tests (one mutation end to end, on a single test; the whole list takes minutes,
so the full run is the tool's, recorded in the doc)."""

import pytest

from ..repo import REPO, load_tool

DOC = REPO / "docs" / "REFERENCE_MUTATIONS.md"


def _tool():
    return load_tool("mutate_reference.py", "_mutate_reference")


mr = _tool()


def test_every_mutation_applies_to_the_current_sources():
    assert mr.check_list() == []
    assert len(mr.MUTATIONS) >= 14
    for m in mr.MUTATIONS:
        assert m.what and "|" not in m.name


def test_apply_refuses_stale_or_broken_mutations():
    m = mr.M("x", "fp8.py", ("a = 1", "a = 2"), "test")
    assert mr.apply(m, "a = 1\n") == "a = 2\n"
    with pytest.raises(ValueError, match="occurs 0 times"):
        mr.apply(m, "b = 1\n")
    with pytest.raises(ValueError, match="occurs 2 times"):
        mr.apply(m, "a = 1\na = 1\n")
    with pytest.raises(ValueError, match="does not compile"):
        mr.apply(mr.M("y", "fp8.py", ("a = 1", "a = (1"), "test"), "a = 1\n")


def _doc_rows():
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows.append(cells)
    return rows


def test_doc_table_is_generated_from_the_list():
    rows = _doc_rows()
    assert [r[0].strip("`") for r in rows] == [m.name for m in mr.MUTATIONS]
    for (name, file, what, result, killed_by), m in zip(rows, mr.MUTATIONS):
        assert (file, what) == (m.file, m.what.replace("|", "/")), name
        if m.equivalent:
            assert result == "equivalent, survives", name
        else:
            assert result == "killed" and killed_by.startswith("`test_"), name
    text = DOC.read_text(encoding="utf-8")
    for m in mr.MUTATIONS:
        if m.equivalent:
            assert f"- `{m.name}`: {m.equivalent}." in text


def test_one_mutation_end_to_end():
    """The LogFMT offset set to 1.5 (a mutant the audit found surviving) is killed by the hand-worked offset case,
    in a scratch copy that passed the same test unmutated first."""
    node = "tests/reference/test_reference_ll.py::test_logfmt_codes_pin_the_rounding_offset"
    (res,) = mr.run([m for m in mr.MUTATIONS if m.name == "logfmt-offset-1.5"], [node])
    assert res.verdict == "killed" and res.failed == [node]
    assert mr.killed_by(res) == "`test_reference_ll::test_logfmt_codes_pin_the_rounding_offset`"
