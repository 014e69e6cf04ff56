#!/usr/bin/env bash
# The whole GPU job for one device-tool call, from the repository root of a checkout (no install: the
# checkout on PYTHONPATH). Steps run in order of importance, each under its own time limit, logs in $OUT.
# Usage: tools/gpu_run.sh [COMMIT]   (STEPS="tests main bench" by default; smoke/suite/rest are subsets;
#        issue 12: doctor, cli (tune/doctor/topk_idx_t GPU tests), bench_cli, megatron (needs the wheels in
#        MEGATRON_WHEELS, default .scratch/megatron_wheels: carry that folder);
#        soak / soak4 / soak_base (BASE=<checkout>) run the LL soak; chaos (the chaos-transport GPU tests) and
#        soak_chaos (the LL soak on emulated nodes through the chaos transport);
#        on an 8-GPU node: STEPS="ep8 ep8_main ep4_main";
#        internode (emulated nodes): internode internode_main internode_aggressive internode_chaos)
set -uo pipefail
OUT=${OUT:-/tmp/ep_rt_gpu_run}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off on these machines (shared hosts); EP_RT needs none of it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
STEPS=${STEPS:-tests main main_aggressive bench}
# A peer that never comes fails a wait after this long (the tests that test timeouts set their own).
export EP_RT_TIMEOUT_S=${EP_RT_TIMEOUT_S:-30}
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: ${1:-unknown}"
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv
  nvidia-smi topo -m
  python3 -c "import torch, cuda.bindings, importlib.metadata as m; from ep_rt.runtime import driver; from ep_rt.transport import nvshmem; v = lambda n: next((d.version for d in m.distributions() if d.metadata['Name'] == n), 'none'); print('torch', torch.__version__, '| cuda-bindings', cuda.bindings.__version__, '| driver', driver.driver_version(), '| nvshmem-cu12', v('nvidia-nvshmem-cu12'), '| nvshmem-cu13', v('nvidia-nvshmem-cu13'), '| host library flavour', nvshmem.host_flavour(), '| EP_RT_CUBIN_FLAVOUR', __import__('os').environ.get('EP_RT_CUBIN_FLAVOUR', 'unset'), '| pytest-benchmark', m.version('pytest-benchmark'))"
  python3 tools/build_cubins.py --check
} > "$OUT/env.txt" 2>&1
run() {  # name, limit_s, command...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$OUT/summary.txt"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "=== $name: exit $?" | tee -a "$OUT/summary.txt"
  tail -n 5 "$OUT/$name.log" | tee -a "$OUT/summary.txt"
}
for step in $STEPS; do
  case $step in
    smoke) run smoke 120 python3 -m pytest -q -rs tests/gpu/test_cubins_gpu.py tests/gpu/test_layout_gpu.py \
             "tests/gpu/test_intranode_gpu.py::test_buffer_construction_peer_mapping_and_barrier" ;;
    suite) run suite 360 python3 -m pytest -q -rs tests/gpu/test_intranode_gpu.py -k "match_reference" ;;
    main)  run main 300 python3 -m ep_rt ;;
    main_quick) run main_quick 300 python3 -m ep_rt --quick --no-bench ;;
    catalogue) run catalogue 300 python3 -m pytest -q -rs tests/gpu/test_reliability_gpu.py -k catalogue ;;
    main_aggressive) run main_aggressive 300 env EP_RT_AGGRESSIVE_PTX=1 python3 -m ep_rt --quick ;;
    rest)  run rest 420 python3 -m pytest -q -rs tests -k "not match_reference and not layout and not cubins and not peer_mapping and not wheel" ;;
    ll)    run ll 300 python3 -m pytest -q -rs -x tests/gpu/test_low_latency_gpu.py ;;
    tests) run tests 540 python3 -m pytest -q -rs tests -k "not wheel" ;;  # the wheel build needs PyPI
    ep8)   run ep8 540 python3 -m pytest -q -rs tests/gpu/test_ep8_gpu.py ;;  # needs 8 GPUs (issue 5)
    ep8_main) run ep8_main 540 python3 -m ep_rt ;;                           # one rank per GPU: EP8 tables
    ep4_main) run ep4_main 400 python3 -m ep_rt --ranks 4 --quick ;;         # EP4 tables on the same node
    soak)  run soak 420 python3 tools/ll_soak.py --ranks 2 --rounds "${SOAK_ROUNDS:-3000}" --timeout 400 ;;
    soak4) run soak4 420 python3 tools/ll_soak.py --ranks 4 --rounds "${SOAK_ROUNDS4:-1500}" --timeout 400 ;;
    # The same soak on another checkout (BASE, e.g. the commit before a fix, with ep_rt/soak_ll.py copied in).
    soak_base) run soak_base 300 env PYTHONPATH="$BASE" EP_RT_TIMEOUT_S=10 python3 tools/ll_soak.py --ranks 2 \
             --rounds "${SOAK_ROUNDS:-3000}" --timeout 240 ;;
    soak_emul) run soak_emul 300 env EP_RT_RANKS_PER_NODE=1 python3 tools/ll_soak.py --ranks 2 \
             --rounds "${SOAK_ROUNDS_EMUL:-1000}" --timeout 240 ;;   # the LL put path (emulated nodes)
    # The chaos transport (docs/CHAOS_TRANSPORT.md): its probe, the LL suite on emulated nodes, then the LL soak.
    chaos) run chaos 600 python3 -m pytest -q -rs tests/gpu/test_chaos_transport_gpu.py ;;
    soak_chaos) run soak_chaos 300 env EP_RT_RANKS_PER_NODE=1 python3 tools/ll_soak.py --ranks 2 --chaos \
             --rounds "${SOAK_ROUNDS_CHAOS:-500}" --timeout 240 ;;
    gpu)   run gpu 540 python3 -m pytest -q -rs tests/gpu ;;
    # The GPU tests in order of what a regression would hurt most, under one limit (LIMIT, default 480 s).
    gpu_core) run gpu_core "${LIMIT:-480}" python3 -m pytest -q -rs --durations=40 tests/gpu/test_cubins_gpu.py \
             tests/gpu/test_layout_gpu.py tests/gpu/test_low_latency_gpu.py tests/gpu/test_intranode_gpu.py \
             tests/gpu/test_reliability_gpu.py tests/gpu/test_topk_idx_bits_gpu.py tests/gpu/test_cli_gpu.py ;;
    soaks) run soaks 540 python3 -m pytest -q -rs -m soak tests/gpu ;;
    soak_ht) run soak_ht 300 python3 -m pytest -q -rs -m soak tests/gpu/test_reliability_gpu.py ;;
    # The CUDA 12 cubins forced (NVSHMEM-free families: the LL family must match the NVSHMEM host library's flavour).
    cu12)  run cu12 300 env EP_RT_CUBIN_FLAVOUR=cu12 python3 -m pytest -q -rs tests/gpu/test_cubins_gpu.py \
             tests/gpu/test_layout_gpu.py tests/gpu/test_intranode_gpu.py -k "not more_ranks" ;;
    retest) run retest 300 python3 -m pytest -q -rs ${RETEST} ;;
    doctor) run doctor 300 python3 -m ep_rt doctor ;;
    cli)   run cli 900 python3 -m pytest -q -rs tests/gpu/test_cli_gpu.py tests/gpu/test_topk_idx_bits_gpu.py ;;
    bench_cli) run bench_cli 600 python3 -m ep_rt bench --json "$OUT/bench_cli.json" ;;
    # megatron-core from carried wheels into a folder of its own (no network there), then its client test.
    megatron) MC_SITE=/tmp/ep_rt_megatron_site
             python3 -m pip install -q --no-deps --no-index --target "$MC_SITE" \
               "${MEGATRON_WHEELS:-.scratch/megatron_wheels}"/*.whl > "$OUT/megatron_install.log" 2>&1
             run megatron 900 env PYTHONPATH="$MC_SITE:$PWD" python3 -m pytest -q -rs tests/gpu/test_megatron_gpu.py \
               tests/test_megatron_expectation.py tests/test_deep_ep_alias.py ;;
    # Internode on emulated nodes (issue 11): the GPU tests, then the whole case list through the main command
    # under the aggressive variant and under the chaos transport (4 ranks as 2 nodes x 2 on one GPU).
    internode) run internode 600 python3 -m pytest -q -rs --durations=20 tests/gpu/test_internode_gpu.py ;;
    internode16) run internode16 480 python3 -m pytest -q -rs --durations=5 \
             tests/gpu/test_internode_gpu.py::test_internode_nodes_of_eight_ranks_sixteen_on_one_gpu ;;
    internode_main) run internode_main 300 python3 -m ep_rt --ranks 4 --internode 2 ;;
    internode_aggressive) run internode_aggressive 300 env EP_RT_AGGRESSIVE_PTX=1 python3 -m ep_rt --ranks 4 \
             --internode 2 --no-bench ;;
    internode_chaos) run internode_chaos 600 env EP_RT_CHAOS_TRANSPORT=1 EP_RT_NET_TIMEOUT_S=120 python3 -m ep_rt \
             --ranks 4 --internode 2 --no-bench ;;
    bench) run bench 300 python3 -m pytest -q -m bench tests/bench --benchmark-columns=min,median,max,rounds \
             --benchmark-json="$OUT/bench.json" ;;
  esac
done
