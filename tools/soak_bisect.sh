#!/usr/bin/env bash
# LL soak runs that each vary one more thing than the plainest one, to find what a failing soak needs.
# Usage: OUT=dir tools/soak_bisect.sh [ROUNDS]   (summary in $OUT/bisect.txt, every log in $OUT/bisect.tgz)
set -uo pipefail
OUT=${OUT:-/tmp/soak_bisect}; mkdir -p "$OUT"
LOGS=$(mktemp -d)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export EP_RT_TIMEOUT_S=${EP_RT_TIMEOUT_S:-8}
R=${1:-300}
for f in "" shapes zero_tokens own_only modes graph zero_copy fp8 logfmt \
         "modes,graph,zero_copy,logfmt,shapes,zero_tokens,own_only,fp8"; do
  name=${f//,/+}; name=${name:-plain}
  timeout -k 5 120 python3 tools/ll_soak.py --ranks 2 --rounds "$R" --timeout 100 --features "$f" > "$LOGS/bisect_$name.log" 2>&1
  echo "$name: exit $? $(grep -m1 -o 'PASSED\|FAILED.*' "$LOGS/bisect_$name.log" | cut -c1-300)" | tee -a "$OUT/bisect.txt"
done
tar czf "$OUT/bisect.tgz" -C "$LOGS" .
