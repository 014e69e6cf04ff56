#!/usr/bin/env bash
# The whole GPU job of one device-tool call, from the repository root of the copy the device tool made (no
# install: the checkout on PYTHONPATH). It refuses to start unless the files here are the commit they claim to be
# (a digest of every file, computed here, equal to the one computed from git on the CPU side) and the cubins are
# up to date (tools/build_cubins.py --check).
#
# Usage:  bash tools/gpu_run.sh COMMIT DIGEST
#   COMMIT  the commit the checkout is, as the CPU side names it (git rev-parse --short HEAD)
#   DIGEST  that commit's tree digest, computed on the CPU side in the checkout:
#             python3 tools/tree_digest.py --commit COMMIT
#   e.g.    CPU side:  C=$(git rev-parse --short HEAD); D=$(python3 tools/tree_digest.py --commit "$C")
#           device:    STEPS="tests main" bash tools/gpu_run.sh $C $D
# Environment:
#   PARALLEL  instead of STEPS: groups of steps separated by ";" that run at the same time, each group's steps in
#          order (e.g. PARALLEL="internode; chaos ll; catalogue"): several test processes then share the GPU and the
#          CPUs, so a group takes longer than alone, and timings mean nothing
#   STEPS  the steps, in order (default "tests main main_aggressive bench"; the list is in the case below: smoke,
#          suite, main, main_quick, catalogue, main_aggressive, rest, ll, tests, ep8 ep8_main ep4_main (8 GPUs),
#          soak soak4 soak_base (BASE=<checkout>) soak_emul, chaos soak_chaos, gpu, gpu_core (LIMIT, CORE_FILES), soaks,
#          soak_ht, soak_calls (LIMIT_CALLS), cu12, retest (RETEST="pytest ids"), doctor, server, cli, bench_cli, bench_rounds, bench_rounds_internode, tma_ab, host_profile, ll_ab (BASE),
#          megatron (wheels in MEGATRON_WHEELS, default .scratch/megatron_wheels: carry that folder), internode internode16
#          internode_cases (LIMIT_CASES) internode_rounds (LIMIT_ROUNDS) internode_variants (LIMIT_VARIANTS) internode16_aggressive internode16_chaos internode_each
#          cu12_internode_each (LIMIT_EACH, INTERNODE_IDS, LIMIT_CASES), cu12_marked (CU12_MARK, CU12_FILES, LIMIT_CU12), internode_main internode_aggressive
#          internode_chaos, ll_nodes (LIMIT_LLN; or in three: ll_nodes41 ll_nodes41_chaos ll_nodes_faults), ll_packed (LIMIT_PACKED), ll_packed8 (LIMIT_PACKED8) ll_packed16 ll_packed_faults soak_packed soak_packed_emul, ll_packed_ab (LL_EXPERTS), on_h200, ll_profile ll_profile_sass (LIMIT_PROFILE, NCU), exp_ll (EXP_DELTA, EXP_VARIANT, LL_EXPERTS), exp_ht (EXP_DELTA, EXP_VARIANT, LIMIT_SUITE), ll_nodes8 (LIMIT_LLN8) ll16 ll16_chaos (LIMIT_LL16), reference_devices, bench). An unknown step refuses the whole run.
#   SKIP   carried paths that only .git/info/exclude ignores on the CPU side, left out of the digest (".gl .whl");
#          paths under .gitignore's folders (.scratch/, .whl/, .venv/) need no SKIP
#   OUT    where the results go (default /tmp/ep_rt_gpu_run)
# Output: each call of this script is one attempt, named by its UTC start time (e.g. 20261201T141923Z); nothing of
# an earlier attempt is overwritten. In $OUT/<attempt>/:
#   env.txt       attempt, date, commit, both digests, GPUs, versions, the cubin check
#   summary.txt   per step: the command, then "ok", "FAILED (exit N)" or "TIMEOUT" and its seconds, the log's
#                 tail; at the end "result: ..." (written only by this script: never edit it by hand)
#   logs.tar.gz   every file of the attempt: env.txt, summary.txt, tree_digest.txt (the per-file list), each
#                 step's log, bench json. The device tool brings back at most 8 files from $OUT, none deeper than
#                 $OUT/a/b/file, so the step logs travel in this archive, rewritten after every step (a call killed
#                 mid-way still brings back the steps before). File it unpacked as docs/gpu_runs/<date>_<commit>/<attempt>/.
# Exit: 0 every step ok; 1 a step failed or timed out; 2 refused (wrong tree, stale cubins, bad usage).
set -uo pipefail

if [ $# -ne 2 ] || ! [[ $2 =~ ^[0-9a-f]{64}$ ]]; then
  echo "gpu_run.sh: needs COMMIT and its tree DIGEST (64 hex digits)" >&2
  sed -n '7,13p' "$0" >&2
  exit 2
fi
COMMIT=$1 EXPECTED=$2
OUT=${OUT:-/tmp/ep_rt_gpu_run}
PARALLEL=${PARALLEL:-}
STEPS=${STEPS:-tests main main_aggressive bench}
[ -n "$PARALLEL" ] && STEPS=$(echo "$PARALLEL" | tr ';' ' ')
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off on these machines (shared hosts); EP_RT needs none of it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# A peer that never comes fails a wait after this long (the tests that test timeouts set their own).
export EP_RT_TIMEOUT_S=${EP_RT_TIMEOUT_S:-30}

# ---- the attempt: its own folder of results and of logs, never an earlier attempt's ----------------------
LOG_ROOT=${LOG_ROOT:-/tmp/ep_rt_gpu_logs}  # the step logs (outside $OUT: see Output above)
ATTEMPT=$(date -u +%Y%m%dT%H%M%SZ)
base=$ATTEMPT; n=1
while [ -e "$OUT/$ATTEMPT" ] || [ -e "$LOG_ROOT/$ATTEMPT" ]; do n=$((n + 1)); ATTEMPT=$base-$n; done
RES=$OUT/$ATTEMPT LOGS=$LOG_ROOT/$ATTEMPT
mkdir -p "$RES" "$LOGS"
SUMMARY=$LOGS/summary.txt
: > "$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }
pack() {  # the attempt's files into $RES (the archive replaced whole, never half-written; groups pack apart)
  cp "$SUMMARY" "$RES/summary.txt.$BASHPID" && mv "$RES/summary.txt.$BASHPID" "$RES/summary.txt"
  [ -f "$LOGS/env.txt" ] && cp "$LOGS/env.txt" "$RES/env.txt"
  tar czf "$RES/logs.tar.gz.$BASHPID" -C "$LOGS" . 2>/dev/null && mv "$RES/logs.tar.gz.$BASHPID" "$RES/logs.tar.gz"
}
refuse() { say "REFUSED: $*"; say "result: refused, no step ran"; pack; exit 2; }
CURRENT=setup
trap 'say "=== KILLED by a signal during $CURRENT"; say "result: killed during $CURRENT"; pack; exit 143' TERM INT

# ---- one step -----------------------------------------------------------------------------------------------
# run NAME LIMIT_S COMMAND...: the command under its time limit, its log $LOGS/NAME.log (a second run of a name
# gets its own log), its verdict in summary.txt. A new step is one more line in the case below.
DRY=0 FAILED_STEPS="" NUM_STEPS=0
run() {
  local name=$1 limit=$2; shift 2
  [ "$DRY" = 1 ] && return 0
  local log=$LOGS/$name.log k=1 start rc secs verdict
  while [ -e "$log" ]; do k=$((k + 1)); log=$LOGS/$name.$k.log; done
  CURRENT=$name NUM_STEPS=$((NUM_STEPS + 1))
  say "=== $name: $* (limit ${limit} s, started $(date -u +%T) UTC)"
  pack
  start=$(date +%s)
  # Its own process group, killed whole after it ends: a step that timed out would otherwise leave its rank
  # processes (multiprocessing children of pytest) running on the GPU into later steps and groups.
  setsid timeout -k 10 "$limit" "$@" > "$log" 2>&1 &
  local pid=$!
  wait "$pid"
  rc=$?
  kill -9 -- "-$pid" 2>/dev/null && echo "(killed what was left of step $name's processes)" >> "$log"
  # ...and wait until they are gone: their GPU contexts are torn down as they exit, and a step that starts NVSHMEM
  # meanwhile can fail to map its peers' memory (attempt 20261202T035128Z).
  local waited=0
  while pgrep -g "$pid" > /dev/null 2>&1 && [ $waited -lt 60 ]; do sleep 1; waited=$((waited + 1)); done
  [ $waited -gt 0 ] && echo "(waited ${waited} s for step $name's processes to exit)" >> "$log"
  # A failed step: what still holds the GPU (a rank that outlived its step would slow or break the next one).
  [ "$rc" = 0 ] || { echo "(GPU processes after the step:)"; nvidia-smi --query-compute-apps=pid,process_name,used_memory \
    --format=csv 2>&1 | head -40; } >> "$log"
  secs=$(($(date +%s) - start))
  case $rc in
    0) verdict="ok" ;;
    124|137) verdict="TIMEOUT (limit ${limit} s, exit $rc)" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  [ "$rc" = 0 ] || echo "$name" >> "$LOGS/failed_steps"  # (a file: groups run in subshells)
  echo "$name" >> "$LOGS/steps_run"
  say "=== $name: $verdict after ${secs} s, log $(basename "$log")"
  tail -n 5 "$log" | tee -a "$SUMMARY"
  CURRENT=between-steps
  pack
}

internode_ids() {  # the internode GPU test ids but the 16-process one, fault tests first (INTERNODE_IDS overrides)
  if [ -n "${INTERNODE_IDS:-}" ]; then echo "$INTERNODE_IDS"; return; fi
  local ids
  ids=$(python3 -m pytest -q --collect-only -m "not bench and not soak and not sixteen" \
        tests/gpu/test_internode_gpu.py 2>/dev/null | grep '::')
  { echo "$ids" | grep -E 'killed|missing'; echo "$ids" | grep -vE 'killed|missing'; } | tr '\n' ' '
}

ncu_bin() {  # Nsight Compute: $NCU, else the one on PATH, else one under /opt/nvidia/nsight-compute
  echo "${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)}"
}

# An experiment's cubins: the carried delta ($EXP_DELTA, from tools/build_experiment.sh) laid over a copy of cubins/
# at $EXP, as a recorded step named $1 (a missing delta fails the attempt, and an earlier attempt's folder never
# stays); returns non-zero when there is nothing to run the experiment's steps on.
EXP=/tmp/ep_rt_exp_cubins
lay_experiment() {
  local delta=${EXP_DELTA:-.scratch/exp/delta}
  run "$1" 60 sh -c 'rm -rf "$2" && test -f "$1/manifest.json" && cp -r cubins "$2" &&
    cp -r "$1/." "$2/" && echo "the shipped cubins with $1 laid over:" && (cd "$1" && find . -name "*.cubin" | sort)' \
    sh "$delta" "$EXP"
  [ "$DRY" = 1 ] || [ -f "$EXP/manifest.json" ]
}

# In the check before any step: a marker and files that select no test would be a step that runs nothing (pytest's
# exit 5; attempt 20261207T232243Z spent a machine call on one), so the attempt is refused first.
selects_some() {  # MARK FILES...
  [ "$DRY" = 1 ] || return 0
  local mark=$1; shift
  python3 -m pytest -q --collect-only -p no:cacheprovider -m "${mark}" "$@" > /dev/null 2>&1 && return 0
  echo "-m \"$mark\" selects no test in $*" >&2
  return 4
}

step() {  # one named step; returns 3 for a name it does not know
  case $1 in
    # Steps pick tests by marker (pyproject.toml lists them) or node id, never by -k name fragments. A -m replaces
    # pyproject's default "not bench and not soak", so an -m that excludes repeats it.
    smoke) run smoke 120 python3 -m pytest -q -rs -m smoke tests/gpu/test_cubins_gpu.py tests/gpu/test_layout_gpu.py \
             tests/gpu/test_intranode_gpu.py ;;
    # The intranode suite, one test per case and variant (ranks spawned once per variant: ep_rt.testing.rank_pool).
    suite) run suite 360 python3 -m pytest -q -rs -m suite tests/gpu/test_intranode_cases_gpu.py ;;
    main)  run main 300 python3 -m ep_rt ;;
    main_quick) run main_quick 300 python3 -m ep_rt --quick --no-bench ;;
    catalogue) run catalogue 300 python3 -m pytest -q -rs -m catalogue tests/gpu/test_reliability_gpu.py ;;
    main_aggressive) run main_aggressive 300 env EP_RT_AGGRESSIVE_PTX=1 python3 -m ep_rt --quick ;;
    rest)  run rest 420 python3 -m pytest -q -rs -m "not bench and not soak and not smoke and not suite and not pypi" \
             tests ;;  # all that smoke and suite leave
    # The LL suite one test per case (no -x: a case that breaks the ranks fails the cases after it at once), then
    # shrink mode and the put path, stopping at the first failure (shrink mode on emulated nodes: ll_nodes).
    ll)    run ll_cases 300 python3 -m pytest -q -rs tests/gpu/test_low_latency_cases_gpu.py
           run ll 300 python3 -m pytest -q -rs -x -m "not bench and not soak and not ll_nodes" \
             tests/gpu/test_low_latency_gpu.py ;;
    # Issue 21: the LL suite on emulated nodes, one test per (layout, transport, case), each pool of ranks spawned
    # once; shrink mode and the killed peer with the silent or dead rank on another node, over P2P puts and through
    # the chaos transport. ll_nodes: 4x1 over P2P puts and through the chaos transport (23 items each, ~95 and
    # ~100 s: the whole suite in one test took 97 s on 2x2 and 98 s under chaos, 20261202 logs), then the 9 fault
    # tests on 2x1, 2x1 chaos and 2x2 chaos (~145 s: the one-node ones take 8 to 17 s each): ~350 s. ll_nodes8:
    # 2x4, 4x2, each over P2P and chaos (8 cases each, ~90 s a pool: the 2-rank times of those cases, about 6 s,
    # x 14 for 8 ranks, as the internode cases grew 4x from 4 to 8 ranks, plus the start): ~360 s. ll16,
    # ll16_chaos: 2x8 (16 processes, 4 cases): ll16's first attempt (20261206T204437Z) took 68, 161 and 59 s for
    # the first three and its graph case hit the then 180 s case deadline in the reference (since cut to the
    # rank's own combine output). The 2x8 pools (these and internode16_*) run the reference on the GPU unless
    # EP_RT_TEST_REFERENCE_DEVICE=cpu: with the CPU reference (20261206T222145Z, 16 torch threads per rank) bf16
    # took 283.7 s and fp8 ran out of time; each rank now takes its share of the cores there (not run yet).
    # reference_devices: the CPU and the GPU references agree bit for bit (LL and HT; 13 passed in
    # 20261206T222145Z).
    ll_nodes) run ll_nodes "${LIMIT_LLN:-540}" python3 -m pytest -q -rs --durations=20 \
             -m "ll_nodes and not eight_ranks and not sixteen and not ll_packed" tests/gpu/test_low_latency_nodes_gpu.py \
             tests/gpu/test_low_latency_gpu.py tests/gpu/test_reliability_gpu.py ;;
    # The same tests as ll_nodes in three steps of ~100-150 s each, for a session whose device time left cannot hold
    # ll_nodes whole: 4x1 over P2P puts, 4x1 through the chaos transport, the fault tests (2x1, 2x1 chaos, 2x2 chaos).
    ll_nodes41) run ll_nodes41 "${LIMIT_LLN:-300}" python3 -m pytest -q -rs --durations=20 \
             -m "ll_nodes and not chaos and not eight_ranks and not sixteen" tests/gpu/test_low_latency_nodes_gpu.py ;;
    ll_nodes41_chaos) run ll_nodes41_chaos "${LIMIT_LLN:-300}" python3 -m pytest -q -rs --durations=20 \
             -m "ll_nodes and chaos and not eight_ranks and not sixteen" tests/gpu/test_low_latency_nodes_gpu.py ;;
    ll_nodes_faults) run ll_nodes_faults "${LIMIT_LLN:-300}" python3 -m pytest -q -rs --durations=20 \
             -m "ll_nodes and not eight_ranks and not sixteen and not ll_packed" tests/gpu/test_low_latency_gpu.py \
             tests/gpu/test_reliability_gpu.py ;;
    # The packed LL layout (EP_RT_LL_PACKED=1): 1x2 and 2x2 over P2P, every case; 4x1 through the chaos transport.
    ll_packed) run ll_packed "${LIMIT_PACKED:-420}" python3 -m pytest -q -rs --durations=20 \
             -m "ll_packed and not eight_ranks and not sixteen" tests/gpu/test_low_latency_packed_gpu.py ;;
    # ...on 8 ranks (2x4, 4x2, 4x2 through chaos) and 16 (2x8); its shrink-mode and killed-peer tests (one node,
    # 2x1, 2x2 through chaos); its soak on one node and on the put path (2x1).
    ll_packed8) run ll_packed8 "${LIMIT_PACKED8:-560}" python3 -m pytest -q -rs --durations=20 \
             -m "ll_packed and eight_ranks" tests/gpu/test_low_latency_packed_gpu.py ;;
    ll_packed16) run ll_packed16 "${LIMIT_LL16:-570}" python3 -m pytest -q -rs --durations=10 \
             -m "ll_packed and sixteen" tests/gpu/test_low_latency_packed_gpu.py ;;
    ll_packed_faults) run ll_packed_faults "${LIMIT_LLN:-300}" python3 -m pytest -q -rs --durations=20 \
             -m "ll_packed" tests/gpu/test_low_latency_gpu.py tests/gpu/test_reliability_gpu.py ;;
    soak_packed) run soak_packed 420 python3 tools/ll_soak.py --packed --ranks 2 --rounds "${SOAK_ROUNDS:-3000}" \
             --timeout 400 ;;
    soak_packed_emul) run soak_packed_emul 300 env EP_RT_RANKS_PER_NODE=1 python3 tools/ll_soak.py --packed \
             --ranks 2 --rounds "${SOAK_ROUNDS_EMUL:-1000}" --timeout 240 ;;
    ll_nodes8) run ll_nodes8 "${LIMIT_LLN8:-560}" python3 -m pytest -q -rs --durations=20 -m "ll_nodes and eight_ranks" \
             tests/gpu/test_low_latency_nodes_gpu.py ;;
    reference_devices) run reference_devices 120 python3 -m pytest -q -rs tests/gpu/test_reference_devices_gpu.py ;;
    ll16)  run ll16 "${LIMIT_LL16:-570}" python3 -m pytest -q -rs --durations=10 -m "sixteen and not chaos" \
             tests/gpu/test_low_latency_nodes_gpu.py ;;
    ll16_chaos) run ll16_chaos "${LIMIT_LL16:-570}" python3 -m pytest -q -rs --durations=10 -m "sixteen and chaos" \
             tests/gpu/test_low_latency_nodes_gpu.py ;;
    tests) run tests 540 python3 -m pytest -q -rs -m "not bench and not soak and not pypi" tests ;;  # no PyPI there
    ep8)   run ep8 540 python3 -m pytest -q -rs tests/gpu/test_ep8_gpu.py ;;  # needs 8 GPUs (issue 5)
    ep8_main) run ep8_main 540 python3 -m ep_rt ;;                           # one rank per GPU: EP8 tables
    ep4_main) run ep4_main 400 python3 -m ep_rt --ranks 4 --quick ;;         # EP4 tables on the same node
    soak)  run soak 420 python3 tools/ll_soak.py --ranks 2 --rounds "${SOAK_ROUNDS:-3000}" --timeout 400 ;;
    soak4) run soak4 420 python3 tools/ll_soak.py --ranks 4 --rounds "${SOAK_ROUNDS4:-1500}" --timeout 400 ;;
    # The same soak on another checkout (BASE, e.g. the commit before a fix, with ep_rt/soak_ll.py copied in).
    soak_base) run soak_base 300 env PYTHONPATH="${BASE:?soak_base needs BASE}" EP_RT_TIMEOUT_S=10 \
             python3 tools/ll_soak.py --ranks 2 --rounds "${SOAK_ROUNDS:-3000}" --timeout 240 ;;
    soak_emul) run soak_emul 300 env EP_RT_RANKS_PER_NODE=1 python3 tools/ll_soak.py --ranks 2 \
             --rounds "${SOAK_ROUNDS_EMUL:-1000}" --timeout 240 ;;   # the LL put path (emulated nodes)
    # The chaos transport (docs/CHAOS_TRANSPORT.md): its probe, the LL suite on emulated nodes, then the LL soak.
    chaos) run chaos 600 python3 -m pytest -q -rs tests/gpu/test_chaos_transport_gpu.py ;;
    soak_chaos) run soak_chaos 300 env EP_RT_RANKS_PER_NODE=1 python3 tools/ll_soak.py --ranks 2 --chaos \
             --rounds "${SOAK_ROUNDS_CHAOS:-500}" --timeout 240 ;;
    gpu)   run gpu 540 python3 -m pytest -q -rs tests/gpu ;;
    # The GPU tests in order of what a regression would hurt most, under one limit (LIMIT, default 480 s);
    # CORE_FILES="..." runs a part of the list (the files an attempt cut short did not reach), same markers.
    gpu_core) run gpu_core "${LIMIT:-480}" python3 -m pytest -q -rs --durations=40 \
             -m "not bench and not soak and not ll_nodes" ${CORE_FILES:-tests/gpu/test_cubins_gpu.py \
             tests/gpu/test_layout_gpu.py tests/gpu/test_low_latency_cases_gpu.py tests/gpu/test_low_latency_gpu.py \
             tests/gpu/test_intranode_cases_gpu.py tests/gpu/test_intranode_gpu.py tests/gpu/test_reliability_gpu.py \
             tests/gpu/test_topk_idx_bits_gpu.py tests/gpu/test_cli_gpu.py tests/gpu/test_no_sync_gpu.py \
             tests/gpu/test_buffer_memory_gpu.py} ;;
    soaks) run soaks 540 python3 -m pytest -q -rs -m soak tests/gpu ;;
    soak_ht) run soak_ht 300 python3 -m pytest -q -rs -m soak tests/gpu/test_reliability_gpu.py ;;
    # Issue 25 item 1: a million LL calls and 100,000 HT calls, memory, fds and CUDA events sampled (LIMIT_CALLS).
    soak_calls) run soak_calls "${LIMIT_CALLS:-590}" python3 -m pytest -q -rs -s -m soak tests/gpu/test_call_soak_gpu.py ;;
    # The CUDA 12 cubins forced (NVSHMEM-free families: the LL family must match the NVSHMEM host library's flavour).
    cu12)  run cu12 300 env EP_RT_CUBIN_FLAVOUR=cu12 python3 -m pytest -q -rs \
             -m "not bench and not soak and not more_ranks" tests/gpu/test_cubins_gpu.py tests/gpu/test_layout_gpu.py \
             tests/gpu/test_intranode_cases_gpu.py tests/gpu/test_intranode_gpu.py ;;
    retest) run retest "${LIMIT_RETEST:-300}" python3 -m pytest -q -rs ${RETEST:?retest needs RETEST} ;;
    doctor) run doctor 300 python3 -m ep_rt doctor ;;
    cli)   run cli 900 python3 -m pytest -q -rs tests/gpu/test_cli_gpu.py tests/gpu/test_topk_idx_bits_gpu.py ;;
    # Issue 23 item 6's machine is an H200, and a call that names no kind may get either card: bench_cli,
    # host_profile and the call soak (memory flat over a million LL and 100,000 HT calls, one rank) there, and on
    # any other GPU a summary line that says they did not run.
    on_h200) [ "$DRY" = 1 ] && return 0
             gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
             if [[ $gpu == *H200* ]]; then step bench_cli; step host_profile; LIMIT_CALLS=${LIMIT_CALLS:-300} step soak_calls
             else say "=== on_h200: bench_cli, host_profile and soak_calls not run: the GPU is $gpu"; fi ;;
    bench_cli) run bench_cli 600 python3 -m ep_rt bench --json "$LOGS/bench_cli.json" ;;
    # Issue 22 item 4 for the packed LL layout: the LL bench on the default and the packed cubins, alternated twice
    # (each JSON names the variant that ran, ll_variant, and the buffer the hint sized, ll_rdma_bytes). LL_EXPERTS
    # (e.g. "288,36"): the rows' expert counts; on one rank 36 has EP8's 36 local experts at 288.
    ll_packed_ab) for i in 1 2; do
               run "ll_ab_default$i" 180 python3 -m ep_rt bench --ll-only ${LL_EXPERTS:+--ll-experts "$LL_EXPERTS"} \
                 --json "$LOGS/ll_ab_default$i.json"
               run "ll_ab_packed$i" 180 env EP_RT_LL_PACKED=1 python3 -m ep_rt bench --ll-only \
                 ${LL_EXPERTS:+--ll-experts "$LL_EXPERTS"} --json "$LOGS/ll_ab_packed$i.json"
             done ;;
    # Where the packed dispatch's extra time goes (docs/LL_PACKED_DESIGN.md, "Speed"): the LL dispatch kernels (the
    # one-kernel call, the hook's send and receive) of the default and packed variants under Nsight Compute, one
    # rank, `bench --ll-only` (NCU: the ncu to use; clocks left as they are, as the device notes ask). Kernel replay
    # restores memory, so a receive finds its signals.
    ll_profile) NCU_BIN=$(ncu_bin)
             for v in default packed; do
               run "ll_profile_$v" "${LIMIT_PROFILE:-240}" env EP_RT_LL_PACKED=$([ "$v" = packed ] && echo 1 || echo 0) \
                 "$NCU_BIN" --clock-control none --target-processes all -k "regex:^ep_rt_ll_dispatch" --launch-skip 40 --launch-count 12 \
                 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
                 --section SchedulerStats --section MemoryWorkloadAnalysis --page details \
                 python3 -m ep_rt bench --ll-only --json "$LOGS/ll_profile_$v.json"
             done ;;
    # Where inside the LL dispatch's send and receive kernels the time goes, per SASS instruction: Nsight Compute's
    # warp-state samples (SourceCounters) on two launches of each split kernel, default then packed, kept as a report
    # (.ncu-rep in the logs) and printed as the source page, SASS, in CSV (LIMIT_PROFILE, NCU).
    ll_profile_sass) NCU_BIN=$(ncu_bin)
             for v in default packed; do
               run "ll_sass_$v" "${LIMIT_PROFILE:-240}" env EP_RT_LL_PACKED=$([ "$v" = packed ] && echo 1 || echo 0) \
                 "$NCU_BIN" --clock-control none --target-processes all -k "regex:^ep_rt_ll_dispatch_(send|recv)$" \
                 --launch-skip 20 --launch-count 2 --section SpeedOfLight --section WarpStateStats \
                 --section SourceCounters --export "$LOGS/ll_sass_$v" --force-overwrite \
                 python3 -m ep_rt bench --ll-only --json "$LOGS/ll_sass_$v.json"
               run "ll_sass_${v}_page" 120 sh -c "\"\$0\" -i \"\$1\" --page source --print-source sass --csv > \"\$2\"" \
                 "$NCU_BIN" "$LOGS/ll_sass_$v.ncu-rep" "$LOGS/ll_sass_$v.csv"
             done ;;
    # An experiment's cubins (EXP_DELTA, the carried delta folder tools/build_experiment.sh makes, laid over a copy
    # of cubins/), loaded with EP_RT_CUBIN_DIR: first the LL suite of the variant it changes on them (EXP_VARIANT:
    # packed, the default, with the packed pools, which assert the variant; or default, the LL case module),
    # bit-exact before any timing counts; then `bench --ll-only` alternating the shipped cubins and the experiment's,
    # with EP_RT_LL_PACKED set for that variant in both (LL_EXPERTS: the rows' expert counts, as in ll_packed_ab).
    exp_ll) case ${EXP_VARIANT:-packed} in
               packed) packed=1 suite=(-m "ll_packed and not eight_ranks and not sixteen"
                                       tests/gpu/test_low_latency_packed_gpu.py) ;;
               default) packed=0 suite=(tests/gpu/test_low_latency_cases_gpu.py) ;;
               *) echo "EXP_VARIANT must be packed or default, not '$EXP_VARIANT'" >&2; return 2 ;;
             esac
             lay_experiment exp_ll_cubins || return 0
             run exp_ll_suite "${LIMIT_PACKED:-420}" env EP_RT_CUBIN_DIR="$EXP" python3 -m pytest -q -rs \
               --durations=20 "${suite[@]}"  # (the pools set EP_RT_LL_PACKED for their ranks)
             for i in 1 2; do
               run "exp_ab_shipped$i" 180 env EP_RT_LL_PACKED=$packed python3 -m ep_rt bench --ll-only \
                 ${LL_EXPERTS:+--ll-experts "$LL_EXPERTS"} --json "$LOGS/exp_ab_shipped$i.json"
               run "exp_ab_experiment$i" 180 env EP_RT_LL_PACKED=$packed EP_RT_CUBIN_DIR="$EXP" python3 -m ep_rt \
                 bench --ll-only ${LL_EXPERTS:+--ll-experts "$LL_EXPERTS"} --json "$LOGS/exp_ab_experiment$i.json"
             done ;;
    # An experiment on the intranode family (EXP_DELTA; tools/build_experiment.sh PATCH intranode), on the variant
    # it changes (EXP_VARIANT: tma, the default, or safe: the safe and aggressive builds): that variant's items of
    # the intranode case module on the experiment's cubins first, bit-exact; then issue 23 item 5's A/B on one rank,
    # `bench --ht-only` at 4, 8, 16 and 24 SMs: the plain build (EP_RT_TMA=0), the shipped tma cubin and the
    # experiment's (with EP_RT_TMA=1 for a tma experiment, 0 for a safe one). (One rank's rows go to itself: its
    # send half runs, its receive half has nothing.)
    exp_ht) case ${EXP_VARIANT:-tma} in
               tma) tma=1 marker=tma ;;
               safe) tma=0 marker="suite and not tma" ;;
               *) echo "EXP_VARIANT for exp_ht must be tma or safe, not '$EXP_VARIANT'" >&2; return 2 ;;
             esac
             lay_experiment exp_ht_cubins || return 0
             # What the experiment's kernels ask their launches for (modules.requested_dynamic_smem; 0: the module
             # declares nothing, and the kernel takes its plain path), so the log shows whether a bulk path can run.
             for v in "EP_RT_TMA=$tma" "EP_RT_TMA=$tma EP_RT_AGGRESSIVE_PTX=$((1 - tma))"; do
               run exp_ht_smem 120 env $v EP_RT_CUBIN_DIR="$EXP" python3 -c 'if True:
                 from ep_rt.runtime import modules as m
                 mod = m.load_family(0, "intranode")
                 print(mod.entry["variant"], mod.entry["path"], {k: m.requested_dynamic_smem(mod, k)
                       for k in ("ep_rt_intranode_dispatch", "ep_rt_intranode_combine")})'
               [ "$tma" = 1 ] && break  # (the tma variant has no aggressive form)
             done
             run exp_ht_suite "${LIMIT_SUITE:-300}" env EP_RT_CUBIN_DIR="$EXP" python3 -m pytest -q -rs --durations=10 \
               -m "${marker}" tests/gpu/test_intranode_cases_gpu.py
             for sms in 4 8 16 24; do
               run "exp_ht_plain$sms" 180 env EP_RT_TMA=0 python3 -m ep_rt bench --ht-only --num-sms $sms \
                 --json "$LOGS/exp_ht_plain$sms.json"
               run "exp_ht_shipped$sms" 180 env EP_RT_TMA=1 python3 -m ep_rt bench --ht-only --num-sms $sms \
                 --json "$LOGS/exp_ht_shipped$sms.json"
               run "exp_ht_experiment$sms" 180 env EP_RT_TMA=$tma EP_RT_CUBIN_DIR="$EXP" python3 -m ep_rt bench \
                 --ht-only --num-sms $sms --json "$LOGS/exp_ht_experiment$sms.json"
             done ;;
    # Issue 22 item 4: the cost of a round: the HT bench with an NVL buffer of 1/2 and 1/4 of the 4096-token hint.
    bench_rounds) run bench_rounds2 300 python3 -m ep_rt bench --ht-only --nvl-fraction 0.5 --json "$LOGS/bench_rounds2.json"
             run bench_rounds4 300 python3 -m ep_rt bench --ht-only --nvl-fraction 0.25 --json "$LOGS/bench_rounds4.json" ;;
    # Issue 22 item 4 across nodes: the internode workload on 2 emulated nodes of one rank, both buffers at 1, 1/2
    # and 1/4 of their one-pass hints (1, about 2 and about 4 rounds; the rows say how many). The times mean
    # something on two GPUs (nvidia-h200-x2: the "RDMA" hop over NVLink), nothing with the ranks sharing one.
    bench_rounds_internode) for f in 1 0.5 0.25; do
              run bench_rounds_internode$f 300 python3 -m ep_rt bench --internode 1 --ranks 2 --nvl-fraction $f \
                --rdma-fraction $f --json "$LOGS/bench_rounds_internode$f.json"
            done ;;
    # Issue 23 item 5: the tma variant against the plain one, HT bench at 4, 8, 16 and 24 SMs, one rank per GPU
    # (nvidia-h200-x2: with one rank no row takes the receive path the bulk copies serve).
    tma_ab) for sms in 4 8 16 24; do
              run tma_ab_plain$sms 300 env EP_RT_TMA=0 python3 -m ep_rt bench --ht-only --num-sms $sms \
                --json "$LOGS/tma_ab_plain$sms.json"
              run tma_ab_tma$sms 300 env EP_RT_TMA=1 python3 -m ep_rt bench --ht-only --num-sms $sms \
                --json "$LOGS/tma_ab_tma$sms.json"; done ;;
    # Issue 23: where each hot call's host time goes on the GPU (one rank; cProfile and the CUDA primitives alone).
    host_profile) run host_profile 300 python3 tools/host_profile.py --json "$LOGS/host_profile.json" ;;
    # Issue 23: an A/B of the LL host path on one rank: BASE a folder holding another tree's ep_rt/ (same cubins:
    # this tree's), runs interleaved base, new, base, new: `bench --ll-only`, then host_profile of each.
    ll_ab) for i in 1 2; do
             run ll_ab_base$i 200 env PYTHONPATH="${BASE:?ll_ab needs BASE}" EP_RT_CUBIN_DIR="$PWD/cubins" \
               python3 -m ep_rt bench --ll-only --json "$LOGS/ll_ab_base$i.json"
             run ll_ab_new$i 200 python3 -m ep_rt bench --ll-only --json "$LOGS/ll_ab_new$i.json"; done
           run ll_ab_profile_base 200 env EP_RT_SRC="$BASE" EP_RT_CUBIN_DIR="$PWD/cubins" \
             python3 tools/host_profile.py --json "$LOGS/ll_ab_profile_base.json"
           run ll_ab_profile_new 200 python3 tools/host_profile.py --json "$LOGS/ll_ab_profile_new.json" ;;
    # megatron-core from carried wheels into a folder of its own (no network there), then its client test.
    megatron) run megatron_install 300 python3 -m pip install -q --no-deps --no-index --target /tmp/ep_rt_megatron_site \
               "${MEGATRON_WHEELS:-.scratch/megatron_wheels}"/*.whl
             run megatron 900 env PYTHONPATH="/tmp/ep_rt_megatron_site:$PWD" python3 -m pytest -q -rs \
               tests/gpu/test_megatron_gpu.py tests/testing/test_megatron_expectation.py \
               tests/package/test_deep_ep_alias.py ;;
    # Internode on emulated nodes (issue 11): the GPU tests, then the whole case list through the main command
    # under the aggressive variant and under the chaos transport (4 ranks as 2 nodes x 2 on one GPU).
    internode) run internode 600 python3 -m pytest -q -rs --durations=20 tests/gpu/test_internode_gpu.py \
             tests/gpu/test_internode_cases_gpu.py ;;
    # internode_core: all of those but 2x8's (internode16*) and internode_variants' tests.
    internode_core) run internode_core "${LIMIT_CORE:-520}" python3 -m pytest -q -rs --durations=20 \
             -m "not bench and not soak and not sixteen and not aggressive and not chaos" \
             tests/gpu/test_internode_gpu.py tests/gpu/test_internode_cases_gpu.py ;;
    # The internode case lists, one test per (layout, variant, case), each pool of ranks spawned once (LIMIT_CASES).
    # internode_cases: the default variant on 2x2, 4x1 (26 cases each), 2x4, 4x2 (7 each): ~160 s (each pool
    # 39 s in internode_cases.log of 20261202T220450Z). internode_variants (issue 21): the aggressive variant and
    # the chaos transport on each of those layouts: ~325 s (2x2's took 41 and 40 s there; 8 pools of about 40 s).
    internode_cases) run internode_cases "${LIMIT_CASES:-540}" python3 -m pytest -q -rs --durations=20 \
             -m "internode and not aggressive and not chaos and not sixteen" tests/gpu/test_internode_cases_gpu.py ;;
    # Issue 22 across nodes: calls of 2, 4 and 10 times what the buffers hold in one pass, in rounds, on 2x2 and
    # 4x1 (~10 cases of 1-3 s each per layout, several rounds each), then a buffer below one round, then Megatron's
    # get_buffer sizes (the two-argument hints) with 8192 and 16384 tokens per rank on 2x2.
    internode_rounds) run internode_rounds "${LIMIT_ROUNDS:-480}" python3 -m pytest -q -rs --durations=10 \
             -m "not eight_ranks" \
             tests/gpu/test_internode_gpu.py::test_internode_calls_larger_than_the_buffers_go_in_rounds \
             tests/gpu/test_internode_gpu.py::test_internode_rdma_buffer_too_small_raises_everywhere_and_stays_usable \
             tests/gpu/test_internode_gpu.py::test_megatron_get_buffer_sizes_across_nodes_take_8192_and_16384_tokens_per_rank ;;
    internode_variants) run internode_variants "${LIMIT_VARIANTS:-540}" python3 -m pytest -q -rs --durations=20 \
             -m "internode and (aggressive or chaos) and not sixteen" tests/gpu/test_internode_cases_gpu.py ;;
    internode16) run internode16 480 python3 -m pytest -q -rs --durations=5 -m sixteen \
             tests/gpu/test_internode_gpu.py ;;
    # 2x8 (16 processes) under the aggressive variant and the chaos transport, 6 cases and the graph replays each:
    # ~250 s and ~270 s (internode16, the same cases in the default variant, took 247 s).
    internode16_aggressive) run internode16_aggressive 480 python3 -m pytest -q -rs --durations=10 \
             -m "sixteen and aggressive" tests/gpu/test_internode_cases_gpu.py ;;
    internode16_chaos) run internode16_chaos 480 python3 -m pytest -q -rs --durations=10 -m "sixteen and chaos" \
             tests/gpu/test_internode_cases_gpu.py ;;
    # Each internode GPU test of test_internode_gpu.py (but the 16-process one) its own pytest, its own log and
    # limit (LIMIT_EACH, default 240 s; the rank harness gives up 30 s before it, SPAWN_DEADLINE_S, and reports the
    # ranks' stacks): one that hangs costs only its own limit, and every verdict and traceback is kept; then the
    # per-case module's default variant in one pytest, as internode_cases (its items report one by one; a pool per
    # layout, LIMIT_CASES);
    # cu12_internode_each: the same under the cu12 flavour with the carried cu12 host library.
    internode_each) [ "$DRY" = 1 ] && return 0
             k=0; for t in $(internode_ids); do k=$((k + 1))
               run internode_each$k "${LIMIT_EACH:-240}" env SPAWN_DEADLINE_S=$((${LIMIT_EACH:-240} - 30)) \
                 python3 -m pytest -q -rs "$t"; done
             run internode_each_cases "${LIMIT_CASES:-540}" python3 -m pytest -q -rs \
               -m "internode and not aggressive and not chaos and not sixteen" tests/gpu/test_internode_cases_gpu.py ;;
    cu12_internode_each) [ "$DRY" = 1 ] && return 0
             run cu12_unpack 120 python3 tools/unpack_nvshmem.py "${CU12_NVSHMEM:-.cu12nvshmem}" /tmp/ep_rt_cu12_site
             k=0; for t in $(internode_ids); do k=$((k + 1)); run cu12_internode_each$k "${LIMIT_EACH:-240}" env \
               SPAWN_DEADLINE_S=$((${LIMIT_EACH:-240} - 30)) \
               PYTHONPATH="$PWD:/tmp/ep_rt_cu12_site" EP_RT_CUBIN_FLAVOUR=cu12 \
               EP_RT_NVSHMEM_HOST_LIBRARY=/tmp/ep_rt_cu12_site/nvidia/nvshmem/lib/libnvshmem_host.so.3 \
               python3 -m pytest -q -rs "$t"; done
             run cu12_internode_each_cases "${LIMIT_CASES:-540}" env PYTHONPATH="$PWD:/tmp/ep_rt_cu12_site" \
               EP_RT_CUBIN_FLAVOUR=cu12 \
               EP_RT_NVSHMEM_HOST_LIBRARY=/tmp/ep_rt_cu12_site/nvidia/nvshmem/lib/libnvshmem_host.so.3 \
               python3 -m pytest -q -rs -m "internode and not aggressive and not chaos and not sixteen" \
               tests/gpu/test_internode_cases_gpu.py ;;
    internode_main) run internode_main 300 python3 -m ep_rt --ranks 4 --internode 2 ;;
    internode_aggressive) run internode_aggressive 300 env EP_RT_AGGRESSIVE_PTX=1 python3 -m ep_rt --ranks 4 \
             --internode 2 --no-bench ;;
    internode_chaos) run internode_chaos 600 env EP_RT_CHAOS_TRANSPORT=1 EP_RT_NET_TIMEOUT_S=120 python3 -m ep_rt \
             --ranks 4 --internode 2 --no-bench ;;
    # Issue 21: the network operations per call under the chaos build's cost mode; the Buffer setup (agreement,
    # NVSHMEM worlds); the killed-node and shrink-mode faults again.
    net_counts) run net_counts 300 python3 -m pytest -q -rs -m net_counts tests/gpu/test_chaos_transport_gpu.py ;;
    setup) run setup 300 python3 -m pytest -q -rs tests/gpu/test_setup_gpu.py ;;
    server) run server 540 python3 -m pytest -q -rs -m server tests/gpu/test_server_gpu.py ;;  # threads, interrupts
    # The cu12 flavour's NVSHMEM-linked cubins with the cu12 NVSHMEM host library carried to the machine (the folder
    # CU12_NVSHMEM, default .cu12nvshmem: libnvshmem_host.so.3.xz, nvshmem_bootstrap_uid.so.3, the wheel's
    # .dist-info; HARDWARE_REACH.md section 6): unpacked into /tmp/ep_rt_cu12_site, then the LL and internode GPU
    # tests (chaos counts included; of the internode cases 2x2's and 4x1's) with EP_RT_CUBIN_FLAVOUR=cu12 and
    # EP_RT_NVSHMEM_HOST_LIBRARY.
    cu12_net) run cu12_unpack 120 python3 tools/unpack_nvshmem.py "${CU12_NVSHMEM:-.cu12nvshmem}" /tmp/ep_rt_cu12_site
             run cu12_net 480 env PYTHONPATH="$PWD:/tmp/ep_rt_cu12_site" EP_RT_CUBIN_FLAVOUR=cu12 \
               EP_RT_NVSHMEM_HOST_LIBRARY=/tmp/ep_rt_cu12_site/nvidia/nvshmem/lib/libnvshmem_host.so.3 \
               python3 -m pytest -q -rs \
               -m "not bench and not soak and not aggressive and not chaos and not eight_ranks and not ll_nodes" \
               ${CU12_TESTS:-tests/gpu/test_low_latency_cases_gpu.py \
               tests/gpu/test_low_latency_gpu.py tests/gpu/test_internode_cases_gpu.py \
               tests/gpu/test_chaos_transport_gpu.py} ;;
    # Each test id of EACH_A / EACH_B its own pytest run (its own log, failures reported even if a later one hangs);
    # cu12_each: EACH_CU12 under the cu12 flavour with the carried cu12 host library.
    each_a) k=0; for t in ${EACH_A:?each_a needs EACH_A}; do k=$((k + 1)); run each_a$k 300 python3 -m pytest -q -rs "$t"; done ;;
    each_b) k=0; for t in ${EACH_B:?each_b needs EACH_B}; do k=$((k + 1)); run each_b$k 300 python3 -m pytest -q -rs "$t"; done ;;
    cu12_each) run cu12_unpack 120 python3 tools/unpack_nvshmem.py "${CU12_NVSHMEM:-.cu12nvshmem}" /tmp/ep_rt_cu12_site
             k=0; for t in ${EACH_CU12:?cu12_each needs EACH_CU12}; do k=$((k + 1)); run cu12_each$k 300 env \
               PYTHONPATH="$PWD:/tmp/ep_rt_cu12_site" EP_RT_CUBIN_FLAVOUR=cu12 \
               EP_RT_NVSHMEM_HOST_LIBRARY=/tmp/ep_rt_cu12_site/nvidia/nvshmem/lib/libnvshmem_host.so.3 \
               python3 -m pytest -q -rs "$t"; done ;;
    # cu12_marked: the per-case modules' pools selected by a marker expression (CU12_MARK, e.g. "sixteen and chaos")
    # in CU12_FILES under the cu12 flavour with the carried cu12 host library: the emulated layouts and variants in
    # the cu12 flavour without one pool start per case (issue 21 asks for both flavours on every layout).
    cu12_marked) selects_some "${CU12_MARK:?cu12_marked needs CU12_MARK}" ${CU12_FILES:?cu12_marked needs CU12_FILES} \
               || return 4
             run cu12_unpack 120 python3 tools/unpack_nvshmem.py "${CU12_NVSHMEM:-.cu12nvshmem}" /tmp/ep_rt_cu12_site
             run cu12_marked "${LIMIT_CU12:-540}" env PYTHONPATH="$PWD:/tmp/ep_rt_cu12_site" EP_RT_CUBIN_FLAVOUR=cu12 \
               EP_RT_NVSHMEM_HOST_LIBRARY=/tmp/ep_rt_cu12_site/nvidia/nvshmem/lib/libnvshmem_host.so.3 \
               python3 -m pytest -q -rs --durations=10 -m "${CU12_MARK:?cu12_marked needs CU12_MARK}" \
               ${CU12_FILES:?cu12_marked needs CU12_FILES} ;;
    bench) run bench 300 python3 -m pytest -q -m bench tests/bench --benchmark-columns=min,median,max,rounds \
             --benchmark-json="$LOGS/bench.json" ;;
    *) return 3 ;;
  esac
}

# ---- what ran: the tree by content and the cubins (refused at once if wrong), then the machine --------------
skip_args=()
for s in ${SKIP:-}; do skip_args+=(--skip "$s"); done
DIGEST=$(python3 tools/tree_digest.py --list "$LOGS/tree_digest.txt" ${skip_args[@]+"${skip_args[@]}"} \
  2> "$LOGS/tree_digest.err")
DIGEST_RC=$?
python3 tools/build_cubins.py --check > "$LOGS/cubin_check.txt" 2>&1
CUBINS_RC=$?
{
  echo "attempt: $ATTEMPT"; echo "date: $(date -u +%FT%TZ)"; echo "commit: $COMMIT"
  echo "expected tree digest (from git, CPU side): $EXPECTED"
  echo "tree digest (of the files here): ${DIGEST:-none} (tools/tree_digest.py exit $DIGEST_RC)"
  cat "$LOGS/tree_digest.err"
  echo "skipped paths: ${SKIP:-none}"; echo "steps: $STEPS"
  echo "EP_RT_TEST_REFERENCE_DEVICE (the 16-rank pools' reference): ${EP_RT_TEST_REFERENCE_DEVICE:-unset (gpu)}"
  echo "tools/build_cubins.py --check (exit $CUBINS_RC):"; cat "$LOGS/cubin_check.txt"
} > "$LOGS/env.txt" 2>&1
say "attempt $ATTEMPT: commit $COMMIT, steps: $STEPS"

[ "$DIGEST_RC" = 0 ] || refuse "tools/tree_digest.py failed here (exit $DIGEST_RC): $(cat "$LOGS/tree_digest.err")"
[ "$DIGEST" = "$EXPECTED" ] || refuse "the files here are not commit $COMMIT: tree digest $DIGEST, expected $EXPECTED" \
  "(an uncommitted change, an untracked file, or a carried path missing from SKIP; diff tree_digest.txt in" \
  "logs.tar.gz with: python3 tools/tree_digest.py --commit $COMMIT --list FILE)"
[ "$CUBINS_RC" = 0 ] || refuse "tools/build_cubins.py --check failed (exit $CUBINS_RC): the cubins do not match" \
  "their sources (env.txt lists them)"
DRY=1  # every step known and its settings given (BASE, RETEST), before any runs
for s in $STEPS; do
  err=$( (step "$s") 2>&1 ) || refuse "step '$s' is unknown or lacks a setting ${err:+($err)}; tools/gpu_run.sh lists the steps"
done
DRY=0
say "tree digest $DIGEST = commit $COMMIT's; cubins up to date"
{
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv
  nvidia-smi topo -m
  # The host, for comparing host times between attempts (the same code's Python took 1.8x longer on one H100
  # machine than on another, 2026-12-06): CPU model, cores this run may use, load when the attempt began.
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') | cores $(nproc) | load $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 -c "import torch, cuda.bindings, importlib.metadata as m; from ep_rt.runtime import driver; from ep_rt.transport import nvshmem; v = lambda n: next((d.version for d in m.distributions() if d.metadata['Name'] == n), 'none'); print('torch', torch.__version__, '| cuda-bindings', cuda.bindings.__version__, '| driver', driver.driver_version(), '| nvshmem-cu12', v('nvidia-nvshmem-cu12'), '| nvshmem-cu13', v('nvidia-nvshmem-cu13'), '| host library flavour', nvshmem.host_flavour(), '| EP_RT_CUBIN_FLAVOUR', __import__('os').environ.get('EP_RT_CUBIN_FLAVOUR', 'unset'), '| pytest-benchmark', m.version('pytest-benchmark'))"
} >> "$LOGS/env.txt" 2>&1

: > "$LOGS/failed_steps"; : > "$LOGS/steps_run"
if [ -n "$PARALLEL" ]; then
  IFS=';' read -ra groups <<< "$PARALLEL"
  pids=()
  for g in "${groups[@]}"; do
    ( for s in $g; do step "$s"; done ) &
    pids+=($!)
  done
  say "groups at the same time: ${#groups[@]} (${PARALLEL})"
  for pid in "${pids[@]}"; do wait "$pid"; done
else
  for s in $STEPS; do step "$s"; done
fi
FAILED_STEPS=$(tr '\n' ' ' < "$LOGS/failed_steps") NUM_STEPS=$(wc -l < "$LOGS/steps_run")
if [ -z "${FAILED_STEPS// /}" ]; then
  say "result: all $NUM_STEPS steps ok"
  pack; exit 0
fi
say "result: failed or timed out: $FAILED_STEPS(of $NUM_STEPS steps)"
pack; exit 1
