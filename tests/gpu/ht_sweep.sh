#!/bin/bash
# Sweep of high-throughput tuning settings on the GPU machine: runs ep_bench_gpu
# (already built, see tests/gpu/build.sh) once per setting and round, the
# settings interleaved (A B C A B C ...) so that drift of the machine shows as
# spread within a setting, and prints one table: a row per setting, a column
# per benchmark case (median microseconds of each round, slowest rank).
#
#   tests/gpu/ht_sweep.sh [--bench ARGS] [--rounds N] [--budget SECONDS] SETTING...
#     SETTING   environment assignments separated by '+', e.g.
#               EP_CUDA_DISPATCH_WARPS=8,8+EP_CUDA_DISPATCH_CHUNK=8; "default"
#               for none
#     --bench   ep_bench_gpu arguments (default "--sms 32 --tokens 4096 --types bf16")
#     --rounds  runs per setting (default 2)
#     --budget  start no run after SECONDS from the start (0: no limit)
# ep_bench_gpu checks every case before timing it; a run whose checks fail is
# reported and its figures are not used. Logs: $OUT or build/sweep-logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
LOGS=${OUT:-$BUILD/sweep-logs}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

bench="--sms 32 --tokens 4096 --types bf16" rounds=2 budget=0 settings=()
START=$(date +%s)
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "ht_sweep.sh: unknown option $1" >&2; exit 2 ;;
    *) settings+=("$1") ;;
  esac
  shift
done
[ ${#settings[@]} -ge 1 ] || { echo "ht_sweep.sh: name at least one setting (see --help)" >&2; exit 2; }
for n in "$rounds" "$budget"; do
  case "$n" in ''|*[!0-9]*) echo "ht_sweep.sh: --rounds and --budget take whole numbers, not $n" >&2; exit 2 ;; esac
done
[ -x "$BUILD/tests/ep_bench_gpu" ] || { echo "ht_sweep.sh: $BUILD/tests/ep_bench_gpu is missing (tests/gpu/build.sh)" >&2; exit 2; }
mkdir -p "$LOGS"

failed=0
for round in $(seq 1 "$rounds"); do
  for i in "${!settings[@]}"; do
    if [ "$budget" != 0 ] && [ $(( $(date +%s) - START )) -ge "$budget" ]; then
      echo "ht_sweep.sh: budget of $budget s spent; round $round, setting $i not run"
      break 2
    fi
    set_env=()
    [ "${settings[$i]}" = default ] || IFS='+' read -r -a set_env <<<"${settings[$i]}"
    log="$LOGS/sweep_${round}_$i.log"
    # shellcheck disable=SC2086  # bench holds several arguments
    env "${set_env[@]}" timeout 300 "$BUILD/tests/ep_bench_gpu" $bench --no-nccl >"$log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] || grep -q "CHECK FAILED" "$log"; then
      echo "ht_sweep.sh: ${settings[$i]} round $round: exit $rc (see $log)"
      failed=1
    fi
  done
done

# The table: ep_bench_gpu's result lines are "<case> <us> us logical ...".
python3 - "$LOGS" "$rounds" "${settings[@]}" <<'EOF'
import os, re, sys
logs, rounds, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cases, table = [], {}
for i, name in enumerate(settings):
    for r in range(1, rounds + 1):
        path = os.path.join(logs, f"sweep_{r}_{i}.log")
        if not os.path.exists(path):
            continue
        text = open(path).read()
        if "CHECK FAILED" in text:
            continue
        for line in text.splitlines():
            m = re.match(r"^((?:dispatch|combine) .*?\))\s+([\d.]+) us ", line)
            if not m:
                continue
            case = m.group(1)
            if case not in cases:
                cases.append(case)
            table.setdefault((name, case), []).append(m.group(2))
width = max(len(s) for s in settings)
for case in cases:
    print(f"\n{case} (us, one figure per round)")
    for name in settings:
        print(f"  {name:<{width}}  {' '.join(table.get((name, case), ['-']))}")
EOF
exit $failed
