#!/bin/bash
# The CUDA backend's host-code cases (tests/gpu/gpu_host_test.cu), each in a
# process of its own, and the init-step cases once more under
# compute-sanitizer's leak check (device memory an init that failed half way
# did not free). Prints one PASS / FAIL line per case; exit 0 when all passed.
# Run by tests/gpu/run.sh; needs a GPU.
#   BUILD=dir (default build)  OUT=dir: logs (default $BUILD/gpu-logs)
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
LOGS=${OUT:-$BUILD/gpu-logs}
mkdir -p "$LOGS"
prog="$BUILD/tests/gpu_host_test"
status=0
for c in $("$prog" --list); do
  timeout "${EP_GPU_TEST_TIMEOUT:-300}" "$prog" "$c" >"$LOGS/host_case_$c.log" 2>&1
  rc=$?
  line=$(grep -E "^(PASS|FAIL|SKIPPED)" "$LOGS/host_case_$c.log" | tail -1)
  [ -n "$line" ] || line="FAIL $c: exit $rc without a result (log: $LOGS/host_case_$c.log)"
  [ $rc -eq 0 ] || [[ "$line" == FAIL* ]] || line="FAIL $c: exit $rc after: $line"
  echo "$line"
  [ $rc -eq 0 ] || { status=1; grep -v "^PASS\|^FAIL" "$LOGS/host_case_$c.log" | tail -5; }
done
if [ -x "$CUDA_HOME/bin/compute-sanitizer" ]; then
  for c in init_steps_ep1 init_steps_ep2; do
    timeout "${EP_GPU_SANITIZER_TIMEOUT:-600}" "$CUDA_HOME/bin/compute-sanitizer" --leak-check full \
      --error-exitcode 9 "$prog" "$c" >"$LOGS/host_case_${c}_leaks.log" 2>&1
    rc=$?
    summary=$(grep -E "LEAK SUMMARY|ERROR SUMMARY" "$LOGS/host_case_${c}_leaks.log" | tr '\n' ' ')
    if [ $rc -eq 0 ]; then echo "PASS $c under compute-sanitizer --leak-check full: $summary"
    else echo "FAIL $c under compute-sanitizer --leak-check full (exit $rc): $summary"; status=1; fi
  done
else
  echo "FAIL compute-sanitizer not found at $CUDA_HOME/bin/compute-sanitizer"
  status=1
fi
exit $status
