"""The bad-input catalogue on the CPU: names unique, exact sizes, which cases may launch kernels, the outcome of a
case (its error, its message and the launch counter), and that the internode catalogue leaves out only cases that
exist (a renamed intranode case must not silently drop out of, or into, the internode run)."""

import pytest

from ep_rt.testing import bad_inputs


def test_case_names_are_unique():
    for cases in (bad_inputs.CASES, bad_inputs.internode_cases()):
        names = [c.name for c in cases]
        assert len(names) == len(set(names))


def test_internode_catalogue_excludes_only_existing_cases_and_keeps_the_rest_of_its_sections():
    names = {c.name for c in bad_inputs.CASES}
    assert bad_inputs._INTRANODE_ONLY <= names
    internode = {c.name for c in bad_inputs.internode_cases()}
    shared = {n for n in names if n.startswith(bad_inputs._SHARED_PREFIXES)}
    assert shared - bad_inputs._INTRANODE_ONLY <= internode
    assert not internode & bad_inputs._INTRANODE_ONLY
    # every intranode-only case has an internode counterpart of the same kind
    for kind in ("handle of", "handle None", "too large for the", "intranode handle"):
        assert any(kind in n and n.startswith("internode") for n in internode), kind
    assert len(internode) >= 75


def test_catalogue_problems_names_every_kind_of_failure():
    good = {"outcomes": [("a", True, "ValueError: x")], "rounds": [(0, 10, [])], "num_cases": 25}
    assert bad_inputs.catalogue_problems([good, good]) == []
    no_error = {**good, "outcomes": [("a", False, "no error raised")]}
    mismatch = {**good, "rounds": [(0, 10, ["combine.combined_x: 3 elements differ"])]}
    no_checks = {**good, "rounds": [(0, 0, [])]}
    missing = {**good, "rounds": []}
    for res, text in (
        (no_error, "rank 1 a: no error raised"),
        (mismatch, "combined_x"),
        (no_checks, "0 checks"),
        (missing, "0 good rounds for 25 cases"),
    ):
        problems = bad_inputs.catalogue_problems([good, res])
        assert len(problems) == 1 and text in problems[0], problems


def test_the_catalogues_have_their_exact_sizes():
    """The README and the GPU tests name these counts; a case added or dropped must change them on purpose."""
    assert len(bad_inputs.CASES) == 147
    assert len(bad_inputs.internode_cases()) == 82


def test_the_cases_that_launch_kernels_are_exactly_those_whose_errors_kernels_find():
    """Every other case must raise before any ep_rt kernel runs (docs/INTERNODE_DESIGN.md "Errors" for the three
    internode ones); those that launch say why, and the GPU run checks the counter moved for them."""
    launching = {c.name for c in bad_inputs.CASES if c.launches}
    ids = {"layout id == num_experts", "layout id -2", "dispatch topk id == num_experts", "dispatch topk id -5"}
    assert launching == {"LL expert id == num_experts", "LL expert id -3", "num_worst_tokens too small"} | ids
    assert all(c.completes for c in bad_inputs.CASES if c.launches)
    internode = {c.name for c in bad_inputs.internode_cases() if c.launches}
    assert internode == ids | {
        "num_worst_tokens too small",
        "internode dispatch too large for the RDMA buffer",
        "internode dispatch too large for the NVL buffer",
    }
    with pytest.raises(ValueError, match="say why"):
        bad_inputs.BadInput("x", lambda c: None, ValueError, "x", completes=True)


def _case(launches=""):
    return bad_inputs.BadInput("c", lambda c: None, ValueError, "must be 2-D", launches=launches)


def test_case_outcome_checks_the_error_its_message_and_the_launch_counter():
    right = ValueError("topk_idx must be 2-D")
    assert bad_inputs.case_outcome(_case(), right, 0) == (True, "ValueError: topk_idx must be 2-D")
    ok, detail = bad_inputs.case_outcome(_case(), right, 2)
    assert not ok and "2 kernel(s) launched before the error" in detail
    ok, detail = bad_inputs.case_outcome(_case("the kernels find it"), right, 0)
    assert not ok and "no kernel launched" in detail
    assert bad_inputs.case_outcome(_case("the kernels find it"), right, 3)[0]
    assert not bad_inputs.case_outcome(_case(), TypeError("must be 2-D"), 0)[0]  # wrong type
    assert not bad_inputs.case_outcome(_case(), ValueError("bad"), 0)[0]  # unclear message
    assert bad_inputs.case_outcome(_case(), None, 0) == (False, "no error raised")
    assert bad_inputs.case_outcome(_case(), None, 5, expect_error=False)[0]  # a rank with good input
    assert not bad_inputs.case_outcome(_case(), right, 0, expect_error=False)[0]


def test_ctx_bad_counts_from_the_bad_call_only(monkeypatch):
    """A case with setup calls that launch (a hook's dispatch) marks its bad call: the count at the mark and at the
    error are what the catalogue compares."""
    counter = iter(range(10, 100))
    monkeypatch.setattr(bad_inputs, "launch_count", lambda: next(counter))
    ctx = object.__new__(bad_inputs.Ctx)
    ctx.mark = ctx.at_error = None

    def fails():
        raise ValueError("already called")

    with pytest.raises(ValueError):
        ctx.bad(fails)
    assert (ctx.mark, ctx.at_error) == (10, 11)
    assert ctx.bad(lambda: "fine") == "fine" and ctx.mark == 12
