"""Which cubins have run on a GPU, by content: the marks in cubins/hardware_runs.json (used by build_cubins.py).

A mark names the sha256 of the cubin bytes that ran, the cubin's path (null once those bytes are no longer shipped:
the mark stays as a record), the date, the machine, what ran and the log under docs/gpu_runs/. A manifest entry's
`ran_on_hardware` is true only when a mark names its path and its current sha256, so a rebuilt cubin loses the mark
it never earned; --check fails on a mark that claims a path whose cubin has other bytes (a stale mark).
Standard library only (--check runs without compilers).
"""

import json
import re
from pathlib import Path

MARKS_FILE = "hardware_runs.json"
FIELDS = {"sha256", "path", "date", "commit", "machine", "ran", "log"}
LOG_FOLDER = "docs/gpu_runs/"


def load(out):
    """(document, problems) of <out>/hardware_runs.json; a missing file is an empty one (no marks)."""
    path = Path(out) / MARKS_FILE
    if not path.is_file():
        return {"comment": [], "marks": []}, []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        return {"comment": [], "marks": []}, [f"{MARKS_FILE}: not valid JSON: {e}"]
    if not isinstance(doc, dict) or not isinstance(doc.get("marks"), list):
        return {"comment": [], "marks": []}, [f'{MARKS_FILE}: expected an object with a "marks" list']
    return doc, []


def describe(index, mark):
    path = mark.get("path") or "no path"
    return f"mark {index} ({path}, sha256 {str(mark.get('sha256'))[:12]}..., {mark.get('date')}, {mark.get('commit')})"


def field_problems(marks, root):
    """Marks with missing or malformed fields, or a log that is not in the checkout (`root`)."""
    problems = []
    for i, mark in enumerate(marks):
        where = f"{MARKS_FILE}: {describe(i, mark) if isinstance(mark, dict) else f'mark {i}'}"
        if not isinstance(mark, dict) or set(mark) != FIELDS:
            have = set(mark) if isinstance(mark, dict) else set()
            problems.append(
                f"{where}: needs exactly the fields {sorted(FIELDS)} (missing {sorted(FIELDS - have)}, "
                f"unknown {sorted(have - FIELDS)})"
            )
            continue
        if not re.fullmatch(r"[0-9a-f]{64}", str(mark["sha256"])):
            problems.append(f"{where}: sha256 is not 64 lower-case hex digits")
        if mark["path"] is not None and not (isinstance(mark["path"], str) and mark["path"].endswith(".cubin")):
            problems.append(f"{where}: path must be a cubin path under cubins/ or null")
        if not re.fullmatch(r"\d{4}-\d\d-\d\d(T\d\d:\d\d(:\d\d)?Z)?", str(mark["date"])):
            problems.append(f"{where}: date must be YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]Z (UTC)")
        for key in ("commit", "machine", "ran"):
            if not (isinstance(mark[key], str) and mark[key].strip()):
                problems.append(f"{where}: {key} must be a non-empty string")
        log = mark["log"]
        if not (isinstance(log, str) and log.startswith(LOG_FOLDER) and ".." not in log.split("/")):
            problems.append(f"{where}: log must be a path under {LOG_FOLDER}")
        elif not (Path(root) / log).exists():
            problems.append(f"{where}: its log {log} is not in the checkout")
    return problems


def marked(entry, marks):
    """True when a mark names this entry's path and its current sha256."""
    return any(m.get("path") == entry["path"] and m.get("sha256") == entry["sha256"] for m in marks)


def stale_problems(marks, entries, hint):
    """Marks that claim a path whose shipped cubin has other bytes, or none; and unclaimed marks of shipped bytes."""
    by_path = {e["path"]: e["sha256"] for e in entries}
    by_sha = {e["sha256"]: e["path"] for e in entries}
    problems = []
    for i, mark in enumerate(marks):
        if not isinstance(mark, dict):
            continue
        path, sha = mark.get("path"), mark.get("sha256")
        where = f"{MARKS_FILE}: {describe(i, mark)}"
        if path is not None and by_path.get(path) != sha:
            now = f"is now {by_path[path][:12]}..." if path in by_path else "is not shipped"
            problems.append(
                f"{where} is stale: the cubin at {path} {now}, not the bytes that ran. Set the mark's "
                f"path to null (a record of bytes no longer shipped) or re-run on a GPU and mark the "
                f"new sha256 ({hint})"
            )
        elif path is None and sha in by_sha:
            problems.append(f"{where}: names the bytes of the shipped {by_sha[sha]} but claims no path: set its path")
    return problems


FAMILY_NAMES = {"layout": "layout", "intranode": "intranode", "low_latency": "LL", "internode": "internode"}
ARCHS = ("sm_80", "sm_90", "sm_100")


def _families(entries):
    """'layout; intranode safe, tma; LL default' for these entries, families in FAMILY_NAMES order."""
    parts = []
    for family, name in FAMILY_NAMES.items():
        variants = sorted(e["variant"] for e in entries if e["family"] == family)
        if variants:
            parts.append(name if variants == ["default"] else f"{name} {', '.join(variants)}")
    return "; ".join(parts)


def _gpus(entries, marks):
    """The GPU models named by the marks of these entries (H100, H200, ...), sorted."""
    names = set()
    for e in entries:
        for m in marks:
            if m.get("path") == e["path"] and m.get("sha256") == e["sha256"]:
                names.update(re.findall(r"\b([A-Z]\d{2,3})\b", str(m.get("machine"))))
    return ", ".join(sorted(names))


def ran_table(entries, marks) -> str:
    """The README's table of which shipped cubins ran on a GPU: per flavour and arch, the families (and variants)
    whose shipped bytes carry a mark, with the GPUs the marks name, and those built only."""
    lines = ["| flavour | " + " | ".join(ARCHS) + " |", "|---" * (len(ARCHS) + 1) + "|"]
    for flavour in sorted({e["flavour"] for e in entries}, reverse=True):
        cells = []
        for arch in ARCHS:
            here = [e for e in entries if e["flavour"] == flavour and e["arch"] == arch]
            ran = [e for e in here if marked(e, marks)]
            built = [e for e in here if not marked(e, marks)]
            cell = []
            if ran:
                cell.append(f"**ran** ({_gpus(ran, marks)}): {_families(ran)}")
            if built:
                cell.append(f"built only: {_families(built)}")
            cells.append(". ".join(cell) or "none")
        lines.append(f"| {flavour} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    cubins = Path(__file__).resolve().parent.parent / "cubins"
    manifest = json.loads((cubins / "manifest.json").read_text(encoding="utf-8"))
    doc, problems = load(cubins)
    if problems or sys.argv[1:] != ["--table"]:
        sys.exit("\n".join(problems) or "usage: python tools/hardware_marks.py --table")
    print(ran_table(manifest["cubins"], doc["marks"]))
