#!/usr/bin/env python3
"""A digest of a source tree by content, the same whether computed from git for a commit (the CPU side) or from
the files of a copy without .git (the GPU machine: the device tool sends tracked files plus untracked files git
does not ignore, never .git). Stdlib only.

    python3 tools/tree_digest.py --commit COMMIT     the digest of COMMIT's tree, from git (run in the checkout)
    python3 tools/tree_digest.py [ROOT]             the digest of the files under ROOT (default: the current folder)
        --skip PATH (repeatable)  leave out a path that is ignored only outside .gitignore (a carried folder,
                                  ignored by .git/info/exclude on the sending side)
        --list FILE               also write the per-file lines (diff two lists to see what differs)

The digest is sha256 over the sorted lines b"PATH\\0KIND SHA256\\n", one per file: PATH relative with '/', KIND
`file` (SHA256 of its bytes) or `link` (SHA256 of the link's target, as git stores a symlink). The executable
bit is left out: the device tool's copy is not known to keep it, and every script there runs through its
interpreter (`bash tools/gpu_run.sh`, `python3 ...`).

On the file side, what the root .gitignore ignores is skipped, with this subset of gitignore's rules (all this
repository's .gitignore needs): blank lines and `#` comments; `*`, `?` and `[...]` within one path segment; `**`
as a whole segment (any number of folders); a trailing `/` (folders only); a pattern with a `/` before its end
is anchored at the root, one without matches a name at any depth; an ignored folder's contents are ignored.
Negation (`!`), backslash escapes and .gitignore files below the root are refused with an error, so a
.gitignore this subset would read differently from git cannot give a wrong digest silently. `.git` (folder or
worktree file) at the root is always skipped. On the git side a tracked file that the .gitignore matches is an
error: the device tool would send it, the file side would skip it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import stat
import subprocess
import sys
from pathlib import Path


class DigestError(Exception):
    pass


# ---- the .gitignore subset ---------------------------------------------------------------------
def _segment_regex(seg: str) -> str:
    """A glob within one path segment as a regex: * and ? never cross '/'."""
    out, i = [], 0
    while i < len(seg):
        ch = seg[i]
        if ch == "*":
            while i + 1 < len(seg) and seg[i + 1] == "*":  # `a**b`: a plain star (gitignore's rule)
                i += 1
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = seg.find("]", i + 2 if seg[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end < 0:
                raise DigestError(f"unterminated [ in .gitignore pattern segment {seg!r}")
            body = seg[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


class Pattern:
    def __init__(self, line: str):
        self.text = line
        if line.startswith("!"):
            raise DigestError(f".gitignore pattern {line!r}: negation is not supported by tools/tree_digest.py")
        if "\\" in line:
            raise DigestError(f".gitignore pattern {line!r}: backslash escapes are not supported")
        self.dir_only = line.endswith("/")
        body = line.rstrip("/")
        self.anchored = "/" in body
        body = body.lstrip("/")
        if not body:
            raise DigestError(f".gitignore pattern {line!r} matches nothing")
        parts = []
        for seg in body.split("/"):
            parts.append(None if seg == "**" else _segment_regex(seg))
        regex = ""
        for k, part in enumerate(parts):
            last = k == len(parts) - 1
            if part is None:  # ** : any folders (zero or more) here; at the end: everything below
                regex += ".*" if last else "(?:[^/]+/)*"
            else:
                regex += part + ("" if last else "/")
        self.regex = re.compile(regex + r"\Z")

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.anchored:
            return bool(self.regex.match(rel))
        return bool(self.regex.match(rel.rsplit("/", 1)[-1]))


def parse_gitignore(text: str) -> list[Pattern]:
    patterns = []
    for raw in text.splitlines():
        line = raw.rstrip(" \t\r")
        if not line or line.startswith("#"):
            continue
        patterns.append(Pattern(line))
    return patterns


def ignored(patterns: list[Pattern], rel: str, is_dir: bool) -> bool:
    """rel itself, or a folder above it, is ignored."""
    parts = rel.split("/")
    for k in range(1, len(parts) + 1):
        prefix, prefix_is_dir = "/".join(parts[:k]), k < len(parts) or is_dir
        if any(p.matches(prefix, prefix_is_dir) for p in patterns):
            return True
    return False


# ---- the digest --------------------------------------------------------------------------------
def _line(path: bytes, kind: str, data: bytes) -> bytes:
    return path + b"\0" + kind.encode() + b" " + hashlib.sha256(data).hexdigest().encode() + b"\n"


def digest_of(lines: list[bytes]) -> str:
    return hashlib.sha256(b"".join(sorted(lines))).hexdigest()


def file_lines(root: Path, skip: tuple[str, ...] = ()) -> list[bytes]:
    """One line per file under root, minus .git, what .gitignore ignores and the `skip` paths."""
    root = Path(root)
    gi = root / ".gitignore"
    patterns = parse_gitignore(gi.read_text(encoding="utf-8")) if gi.is_file() else []
    skip = tuple(s.strip("/") for s in skip if s.strip("/"))
    lines = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath).relative_to(root).as_posix()
        here = "" if here == "." else here + "/"
        entries = [(n, True) for n in dirnames] + [(n, False) for n in filenames]
        dirnames[:] = []
        for name, listed_as_dir in sorted(entries):
            rel = here + name
            full = Path(dirpath) / name
            st = os.lstat(full)
            is_link = stat.S_ISLNK(st.st_mode)
            is_dir = stat.S_ISDIR(st.st_mode)
            if (
                rel == ".git"
                or rel in skip
                or any(rel.startswith(s + "/") for s in skip)
                or ignored(patterns, rel, is_dir)
            ):
                continue
            if is_dir:
                dirnames.append(name)
            elif is_link:
                lines.append(_line(os.fsencode(rel), "link", os.fsencode(os.readlink(full))))
            elif stat.S_ISREG(st.st_mode):
                if name == ".gitignore" and rel != ".gitignore":
                    raise DigestError(f"{rel}: .gitignore files below the root are not supported")
                lines.append(_line(os.fsencode(rel), "file", full.read_bytes()))
            else:
                raise DigestError(f"{rel} is neither a file, a folder nor a symbolic link")
    return lines


def _git(args: list[str], cwd: Path, data: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, check=False)
    except FileNotFoundError:
        raise DigestError("git is not installed") from None
    if done.returncode:
        raise DigestError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _blobs(repo: Path, shas: list[str]) -> dict[str, bytes]:
    """Contents of blobs by sha, in one `git cat-file --batch`."""
    out = _git(["cat-file", "--batch"], repo, "".join(s + "\n" for s in shas).encode())
    blobs, pos = {}, 0
    for sha in shas:
        header_end = out.index(b"\n", pos)
        name, kind, size = out[pos:header_end].split(b" ")
        if kind != b"blob":
            raise DigestError(f"{sha} is a {kind.decode()}, not a blob")
        start = header_end + 1
        blobs[name.decode()] = out[start : start + int(size)]
        pos = start + int(size) + 1
    return blobs


def commit_lines(commit: str, repo: Path = Path(".")) -> list[bytes]:
    """One line per file of `commit`'s tree, from git."""
    entries = []
    for rec in _git(["ls-tree", "-r", "-z", "--full-tree", commit], repo).split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        mode, kind, sha = meta.decode().split(" ")
        if kind != "blob":
            raise DigestError(f"{path.decode(errors='replace')}: a {kind} (submodules are not supported)")
        entries.append((path, mode, sha))
    blobs = _blobs(repo, sorted({sha for _, _, sha in entries}))
    by_path = {path.decode(errors="surrogateescape"): blobs[sha] for path, _, sha in entries}
    patterns = parse_gitignore(by_path[".gitignore"].decode("utf-8")) if ".gitignore" in by_path else []
    nested = [p for p in by_path if p.endswith("/.gitignore")]
    if nested:
        raise DigestError(f"{commit}: .gitignore files below the root are not supported: {nested}")
    tracked_but_ignored = [p for p in by_path if ignored(patterns, p, False)]
    if tracked_but_ignored:
        raise DigestError(
            f"{commit}: tracked files that .gitignore matches (the GPU side would skip them): "
            f"{tracked_but_ignored[:10]}"
        )
    return [_line(path, "link" if mode == "120000" else "file", blobs[sha]) for path, mode, sha in entries]


def sent_lines(repo: Path = Path(".")) -> list[bytes]:
    """One line per file that the device tool sends from this checkout (tracked files as they are on disk, plus
    untracked files git does not ignore), by git's own ignore rules: what the file side must reproduce."""
    names = _git(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], repo).split(b"\0")
    lines = []
    for name in sorted(set(n for n in names if n)):
        full = Path(repo) / os.fsdecode(name)
        if not os.path.lexists(full):  # a tracked file deleted in the working tree is not sent
            continue
        if os.path.islink(full):
            lines.append(_line(name, "link", os.fsencode(os.readlink(full))))
        else:
            lines.append(_line(name, "file", full.read_bytes()))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", default=".", help="the tree to digest (file side); with --commit: the repo")
    ap.add_argument("--commit", help="digest this commit's tree from git instead of the files")
    ap.add_argument("--skip", action="append", default=[], help="a path to leave out (file side)")
    ap.add_argument("--list", dest="list_file", help="write the per-file lines to this file")
    args = ap.parse_args(argv)
    try:
        if args.commit:
            if args.skip:
                ap.error("--skip applies to the file side only")
            lines = commit_lines(args.commit, Path(args.root))
        else:
            lines = file_lines(Path(args.root), tuple(args.skip))
    except (DigestError, OSError, UnicodeDecodeError) as e:
        print(f"tree_digest: {e}", file=sys.stderr)
        return 2
    if args.list_file:
        with open(args.list_file, "wb") as f:
            f.write(b"".join(sorted(lines)).replace(b"\0", b"  "))
    print(digest_of(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
