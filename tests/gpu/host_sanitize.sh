#!/bin/bash
# The CUDA backend's host code (the backend, the low-latency engine, the
# host notices and their watcher thread, the call logs, the cuda_ipc
# transport) under AddressSanitizer and UndefinedBehaviorSanitizer: the
# library built with them into $BUILD/asan (its kernels as usual), the GPU
# tests built against it and run with the ASan runtime preloaded (the test
# programs themselves are not instrumented). Any report fails. Run by
# tests/gpu/run.sh (EP_GPU_HOST_SANITIZER=0 skips it); needs a GPU.
#   OUT=dir  logs (default $BUILD/gpu-logs)
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CXX=${CXX:-g++}
LOGS=${OUT:-$BUILD/gpu-logs}
ASAN_BUILD="$BUILD/asan"
mkdir -p "$LOGS"
FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
if ! make -j"$(nproc)" CUDA=1 BUILD="$ASAN_BUILD" CXX="$CXX" lib CXXFLAGS="$FLAGS" LDFLAGS="$FLAGS" \
    >"$LOGS/host_sanitize_build.log" 2>&1 ||
   ! BUILD="$ASAN_BUILD" bash tests/gpu/build.sh >>"$LOGS/host_sanitize_build.log" 2>&1; then
  tail -30 "$LOGS/host_sanitize_build.log"
  echo "host sanitizers: FAILED to build"
  exit 1
fi
# The runtime of the compiler that built the library comes first (ASan's
# rule; the programs are not linked with it). CUDA maps memory in the
# shadow gap; the driver's allocations are not leaks to report.
export LD_PRELOAD
LD_PRELOAD=$("$CXX" -print-file-name=libasan.so)
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
status=0
check() {  # check NAME PROGRAM ARGS...
  local name=$1 log="$LOGS/host_sanitize_$1.log"
  shift
  timeout "${EP_GPU_TEST_TIMEOUT:-300}" "$ASAN_BUILD/tests/$@" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && ! grep -qE "ERROR: AddressSanitizer|runtime error:" "$log"; then
    echo "host sanitizers $name: PASSED ($(grep -E 'passed|PASSED' "$log" | tail -1))"
  else
    echo "host sanitizers $name: FAILED (exit $rc)"
    grep -E -A30 "ERROR: AddressSanitizer|runtime error:" "$log" | head -50
    status=1
  fi
}
check gpu_ll_test gpu_ll_test
[ "$ngpu" -lt 2 ] && check gpu_ll_test_ranks2 gpu_ll_test --ranks 2
check gpu_test gpu_test
if [ "$ngpu" -lt 2 ]; then check gpu_mp_test gpu_mp_test --ranks 2; else check gpu_mp_test gpu_mp_test; fi
exit $status
