"""tools/tree_digest.py: the digest of a commit from git equals the digest of its files without .git (as the
device tool copies them, ignored folders beside), and anything else in the files makes them differ; the gitignore
subset matches what git ignores, on hand-written cases and on this checkout."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ..repo import REPO as ROOT

_spec = importlib.util.spec_from_file_location("tree_digest", ROOT / "tools" / "tree_digest.py")
td = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(td)

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed here")


@pytest.mark.parametrize(
    "pattern, path, is_dir, want",
    [
        ("__pycache__/", "__pycache__", True, True),
        ("__pycache__/", "ep_rt/ops/__pycache__", True, True),
        ("__pycache__/", "ep_rt/__pycache__", False, False),  # folders only
        ("*.pyc", "a/b/c.pyc", False, True),
        ("*.pyc", "a/b/c.pyc.txt", False, False),
        ("/build/", "build", True, True),
        ("/build/", "tools/build", True, False),  # anchored at the root
        ("*.egg-info/", "ep_rt.egg-info", True, True),
        ("*.egg-info/", "x/ep_rt.egg-info", True, True),
        ("/kernels_src/**/*.o", "kernels_src/a.o", False, True),  # ** is zero folders too
        ("/kernels_src/**/*.o", "kernels_src/x/y/a.o", False, True),
        ("/kernels_src/**/*.o", "kernels_src/x/a.oo", False, False),
        ("/kernels_src/**/*.o", "tools/kernels_src/a.o", False, False),
        ("/.venv/", ".venv", True, True),
        ("docs/*.md", "docs/a.md", False, True),  # a middle slash anchors
        ("docs/*.md", "x/docs/a.md", False, False),
        ("docs/*.md", "docs/sub/a.md", False, False),  # * stays within a segment
        ("f?o[0-9]", "a/fxo7", False, True),
        ("f?o[!0-9]", "a/fxo7", False, False),
        ("logs/**", "logs/a/b", False, True),
    ],
)
def test_pattern_matching(pattern, path, is_dir, want):
    assert td.Pattern(pattern).matches(path, is_dir) is want


def test_unsupported_rules_are_refused():
    for line in ("!keep.me", "a\\ b"):
        with pytest.raises(td.DigestError):
            td.parse_gitignore(line)


def test_contents_of_an_ignored_folder_are_ignored():
    pats = td.parse_gitignore("/build/\n# comment\n\n__pycache__/\n")
    assert td.ignored(pats, "build/lib/x.py", False)
    assert td.ignored(pats, "a/__pycache__/b.cpython-311.pyc", False)
    assert not td.ignored(pats, "buildx/lib/x.py", False)


def _git(repo, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A committed tree with this repository's .gitignore, a symlink and nested folders, plus ignored files beside it
    (a .venv, caches, build output) as on a developer's checkout or the GPU machine."""
    r = tmp_path / "repo"
    (r / "pkg" / "sub").mkdir(parents=True)
    (r / "kernels_src").mkdir()
    shutil.copy(ROOT / ".gitignore", r / ".gitignore")
    (r / "README.md").write_text("hello\n")
    (r / "pkg" / "a.py").write_text("A = 1\n")
    (r / "pkg" / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (r / "kernels_src" / "k.cu").write_text("// kernel\n")
    (r / "run.sh").write_text("echo hi\n")
    (r / "run.sh").chmod(0o755)
    os.symlink("pkg/a.py", r / "link_to_a")
    _git(r, "init", "-q")
    _git(r, "add", "-A")
    _git(r, "commit", "-q", "-m", "one")
    for ignored_file in (
        ".venv/bin/python",
        "pkg/__pycache__/a.cpython-311.pyc",
        "build/lib/pkg/a.py",
        "ep_rt.egg-info/PKG-INFO",
        "kernels_src/sub/k.o",
        ".scratch/wheels/x.whl",
        "pkg/c.pyc",
    ):
        (r / ignored_file).parent.mkdir(parents=True, exist_ok=True)
        (r / ignored_file).write_text("ignored\n")
    return r


def _files(r, skip=()):
    return td.digest_of(td.file_lines(r, skip))


@needs_git
def test_commit_digest_equals_the_files_digest_with_ignored_files_beside(repo):
    commit = td.digest_of(td.commit_lines("HEAD", repo))
    assert _files(repo) == commit
    assert td.digest_of(td.sent_lines(repo)) == commit  # git's own view of what the device tool sends
    # The same files without .git (as the device tool copies them), and ignored leftovers: the same digest.
    copy = repo.parent / "copy"
    shutil.copytree(repo, copy, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    (copy / ".benchmarks").mkdir()
    (copy / ".benchmarks" / "old.json").write_text("{}")
    assert _files(copy) == commit


@needs_git
def test_an_untracked_modified_deleted_or_retargeted_file_changes_the_digest(repo):
    commit = td.digest_of(td.commit_lines("HEAD", repo))
    changes = [
        lambda: (repo / "new.py").write_text("x\n"),
        lambda: (repo / "pkg" / "a.py").write_text("A = 2\n"),
        lambda: (repo / "pkg" / "sub" / "b.bin").unlink(),
        lambda: (os.unlink(repo / "link_to_a"), os.symlink("README.md", repo / "link_to_a")),
        lambda: (repo / "pkg" / "a.py").rename(repo / "pkg" / "a2.py"),
    ]
    for change in changes:
        _git(repo, "reset", "-q", "--hard")
        _git(repo, "clean", "-fdq")  # (not -x: the ignored files stay)
        assert _files(repo) == commit
        change()
        assert _files(repo) != commit
        assert td.digest_of(td.sent_lines(repo)) == _files(repo)


@needs_git
def test_skip_leaves_out_a_carried_folder_and_the_executable_bit_does_not_count(repo):
    commit = td.digest_of(td.commit_lines("HEAD", repo))
    (repo / ".gl").mkdir()
    (repo / ".gl" / "libegl.deb").write_text("carried\n")
    assert _files(repo) != commit
    assert _files(repo, (".gl",)) == commit
    (repo / "run.sh").chmod(0o644)  # the device copy may drop it: not part of the digest
    assert _files(repo, (".gl",)) == commit


@needs_git
def test_a_tracked_file_that_gitignore_matches_is_an_error(repo):
    (repo / "forced.pyc").write_text("x")
    _git(repo, "add", "-f", "forced.pyc")
    _git(repo, "commit", "-q", "-m", "forced")
    with pytest.raises(td.DigestError, match="forced.pyc"):
        td.commit_lines("HEAD", repo)


@needs_git
def test_a_nested_gitignore_is_refused_on_both_sides(repo):
    (repo / "pkg" / ".gitignore").write_text("*.tmp\n")
    with pytest.raises(td.DigestError, match="below the root"):
        td.file_lines(repo)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "nested")
    with pytest.raises(td.DigestError, match="below the root"):
        td.commit_lines("HEAD", repo)


@needs_git
def test_the_command_line_prints_the_same_digest_for_commit_and_files(repo, tmp_path, capsys):
    assert td.main(["--commit", "HEAD", str(repo)]) == 0
    from_git = capsys.readouterr().out.strip()
    assert td.main([str(repo), "--list", str(tmp_path / "list.txt")]) == 0
    assert capsys.readouterr().out.strip() == from_git and len(from_git) == 64
    listed = (tmp_path / "list.txt").read_text().splitlines()
    assert len(listed) == 7 and any(line.startswith("link_to_a  link ") for line in listed)
    assert td.main(["--commit", "no-such-commit", str(repo)]) == 2


def _excluded_outside_gitignore(path: Path) -> tuple:
    """Paths that .git/info/exclude or the user's global excludes ignore on this checkout (gpu_run.sh's SKIP, when
    such a path is carried; otherwise the device tool does not send it)."""
    files = [Path(_git(path, "rev-parse", "--git-path", "info/exclude"))]
    global_file = subprocess.run(
        ["git", "config", "--path", "core.excludesFile"], cwd=path, capture_output=True, text=True
    ).stdout.strip()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "git" / "ignore"
    files.append(Path(global_file) if global_file else xdg)
    skip = []
    for f in files:
        f = f if f.is_absolute() else path / f
        if f.is_file():
            skip += [
                line.strip().strip("/")
                for line in f.read_text().splitlines()
                if line.strip() and not line.startswith("#")
            ]
    return tuple(skip)


@needs_git
def test_this_checkout_digests_as_git_sees_it_and_as_head_when_clean():
    """On CI's clean checkout (an ignored .venv beside) the files' digest is HEAD's; on a checkout with changes it
    differs from HEAD's. Either way it equals the digest of what git would send (its own ignore rules)."""
    if not (ROOT / ".git").exists():  # (a folder, or a worktree's file)
        pytest.skip("not a git checkout (no .git): no commit to compare with")
    skip = _excluded_outside_gitignore(ROOT)
    files = _files(ROOT, skip)
    assert files == td.digest_of(td.sent_lines(ROOT))
    head = td.digest_of(td.commit_lines("HEAD", ROOT))
    clean = _git(ROOT, "status", "--porcelain", "--untracked-files=normal") == ""
    assert (files == head) is clean
