#!/usr/bin/env bash
# Build an experiment's cubins beside the shipped ones, without touching kernels_src/ or cubins/: a kernel patch
# (docs/experiments/*.patch) applied to a copy of kernels_src, its family rebuilt into a copy of cubins/ (same
# toolchains and sites as tools/build_cubins.py, so every cubin the patch does not change keeps its bytes). The
# device step exp_ll (tools/gpu_run.sh) then loads them with EP_RT_CUBIN_DIR from the carried folder.
#
# Usage:  bash tools/build_experiment.sh PATCH FAMILY [OUT]      OUT default .scratch/exp (gitignored)
#   e.g.  bash tools/build_experiment.sh docs/experiments/NAME.patch low_latency
#         then carry .scratch/exp/delta and run STEPS=exp_ll (EXP_DELTA=.scratch/exp/delta)
# Prints which cubins differ from the shipped ones (only those are the experiment).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '7,10p' "$0" >&2; exit 2; }
PATCH=$(realpath "$1") FAMILY=$2 OUT=${3:-.scratch/exp}
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
rm -rf "$OUT" && mkdir -p "$OUT"
cp -r kernels_src "$OUT/kernels_src"
cp -r cubins "$OUT/cubins"
ln -s "$REPO/docs" "$OUT/docs"  # the hardware marks name their logs under docs/, relative to the cubins' parent
(cd "$OUT" && patch -p1 --quiet < "$PATCH")
python3 tools/build_cubins.py --src "$OUT/kernels_src" --out "$OUT/cubins" --family "$FAMILY" > "$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log" >&2; exit 1; }
# The cubins that differ and the manifest, also in $OUT/delta: what the device call carries (the whole folder beside
# the tracked tree passes the device tool's 64 MiB); exp_ll lays it over a copy of the shipped cubins/ there.
mkdir -p "$OUT/delta" && cp "$OUT/cubins/manifest.json" "$OUT/delta/"
echo "experiment cubins in $OUT/cubins; differing from cubins/ (copied to $OUT/delta):"
(cd cubins && find . -name '*.cubin' | sort) | while read -r f; do
  if ! cmp -s "cubins/$f" "$OUT/cubins/$f"; then
    echo "  ${f#./}"; mkdir -p "$OUT/delta/$(dirname "$f")" && cp "$OUT/cubins/$f" "$OUT/delta/$f"
  fi
done
