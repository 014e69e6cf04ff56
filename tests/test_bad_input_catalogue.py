"""The bad-input catalogue's structure (CPU): names unique, and the internode catalogue leaves out only cases that
exist (a renamed intranode case must not silently drop out of, or into, the internode run)."""
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
    for res, text in ((no_error, "rank 1 a: no error raised"), (mismatch, "combined_x"),
                      (no_checks, "0 checks"), (missing, "0 good rounds for 25 cases")):
        problems = bad_inputs.catalogue_problems([good, res])
        assert len(problems) == 1 and text in problems[0], problems
