"""The test suite's own layout: every CPU test lives in the folder of the wing or tool it tests (tests/runtime/,
tests/transport/, ..., tests/package/), never flat in tests/, and every folder on the way to a test file is a
package (the tests import each other relatively, and pytest names a module by its package path)."""

from pathlib import Path

from ..repo import REPO

TESTS = REPO / "tests"


def is_test_file(path: Path) -> bool:
    """pytest's default python_files (pyproject sets none): test_*.py and *_test.py."""
    return path.suffix == ".py" and (path.name.startswith("test_") or path.stem.endswith("_test"))


def flat_test_files(tests: Path) -> list[str]:
    return sorted(p.name for p in tests.iterdir() if p.is_file() and is_test_file(p))


def folders_without_init(tests: Path) -> list[str]:
    missing = set()
    for path in tests.rglob("*.py"):
        if "__pycache__" in path.parts or not is_test_file(path):
            continue
        for folder in path.relative_to(tests).parents:
            if not (tests / folder / "__init__.py").is_file():
                missing.add((tests / folder).relative_to(tests.parent).as_posix())
    return sorted(missing)


def test_no_test_file_lies_flat_in_tests():
    flat = flat_test_files(TESTS)
    assert not flat, (
        f"{flat} in tests/: put each into the folder of the wing or tool it tests (tests/buffer/ for "
        f"ep_rt/buffer.py, tests/transport/ for ep_rt/transport/, tests/tools/ for tools/, ...; "
        f"`git mv` keeps its history) and take the checkout root from tests/repo.py"
    )


def test_every_folder_holding_tests_is_a_package():
    assert not folders_without_init(TESTS), folders_without_init(TESTS)


def test_the_checks_find_a_flat_file_and_a_missing_init(tmp_path):
    """The two checks above on a made-up tree, so they cannot pass by looking at nothing."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "test_flat.py").write_text("")
    (tmp_path / "helper.py").write_text("")
    (tmp_path / "wing" / "deeper").mkdir(parents=True)
    (tmp_path / "wing" / "__init__.py").write_text("")
    (tmp_path / "wing" / "test_ok.py").write_text("")
    (tmp_path / "wing" / "deeper" / "thing_test.py").write_text("")
    assert flat_test_files(tmp_path) == ["test_flat.py"]
    assert folders_without_init(tmp_path) == [f"{tmp_path.name}/wing/deeper"]
