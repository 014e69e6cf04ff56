"""Where a kernel's warp-stall samples go, region by region, from Nsight Compute's SASS source page as CSV.

`gpu_run.sh ll_profile_sass` saves `ncu -i REPORT --page source --print-source sass --csv` (kept gzipped under
docs/gpu_runs/). The cubins carry no line information, so this cuts each kernel's SASS at its block barriers
(BAR.SYNC / BAR.RED) and exits: a region is the code a block runs between two barriers, and the samples of the
instruction right after a barrier are mostly warps that waited there for the slowest warp of the region before it.

Usage: python tools/sass_regions.py FILE.csv[.gz] [--launch N] [--min-share 0.02]
Prints per kernel (launch N of it, default the first) the total samples and executed warp instructions, then each
region holding at least --min-share of either. Standard library only.
"""

import argparse
import csv
import gzip
import io
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
CUTS = ("BAR.SYNC", "BAR.RED", "EXIT")


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_kernels(text):
    """[(kernel name, launch index, [row dicts])] in file order; a kernel profiled twice appears twice."""
    kernels, header, seen = [], None, {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            name = row[1]
            kernels.append((name, seen.get(name, 0), []))
            seen[name] = seen.get(name, 0) + 1
            header = None
        elif row[0] == "Address":
            header = row
        elif header is not None and kernels:
            kernels[-1][2].append(dict(zip(header, row)))
    return kernels


def regions(rows):
    """[(first line, last line, samples, executed, the cutting instruction)] for one kernel's rows."""
    out, start, samples, executed = [], 0, 0.0, 0.0
    for i, row in enumerate(rows):
        samples += number(row.get(SAMPLES, ""))
        executed += number(row.get(EXECUTED, ""))
        source = row.get("Source", "").strip()
        if any(cut in source for cut in CUTS) or i == len(rows) - 1:
            out.append((start, i, samples, executed, source))
            start, samples, executed = i + 1, 0.0, 0.0
    return out


def report(text, launch=0, min_share=0.02):
    lines = []
    for name, index, rows in read_kernels(text):
        if index != launch:
            continue
        parts = regions(rows)
        total_s = sum(p[2] for p in parts) or 1.0
        total_x = sum(p[3] for p in parts) or 1.0
        lines.append(
            f"{name} (launch {index}): {total_s:.0f} samples, {total_x:.0f} warp instructions, "
            f"{len(rows)} SASS lines, {len(parts)} regions"
        )
        for first, last, s, x, cut in parts:
            if s >= min_share * total_s or x >= min_share * total_x:
                lines.append(
                    f"  lines {first:5d}-{last:5d}  samples {s:6.0f} ({100 * s / total_s:4.1f}%)  "
                    f"instructions {x:9.0f} ({100 * x / total_x:4.1f}%)  ends {cut[:40]}"
                )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--launch", type=int, default=0)
    parser.add_argument("--min-share", type=float, default=0.02)
    args = parser.parse_args()
    path = Path(args.csv)
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    print(report(data.decode("utf-8"), args.launch, args.min_share))


if __name__ == "__main__":
    main()
