#!/bin/bash
# Where the low-latency kernels' warps stall: Nsight Compute (ncu) on one
# launch of a kernel inside gpu_ll_test's benchmark, warp-stall samples per
# SASS instruction, summed by stall reason and listed for the top
# instructions, plus how the executed code is spread over the kernel (a
# kernel that jumps across large unexecuted stretches waits on
# instruction-cache misses: "stall_no_inst").
#   tests/gpu/ll_profile.sh [KERNEL-REGEX [gpu_ll_test ARGS...]]
#   e.g. tests/gpu/ll_profile.sh llDispatchRecvKernel --bench
#        tests/gpu/ll_profile.sh llDispatchKernel --bench-tokens 1
# Runs on however many GPUs are visible (one: EP1, every rank's records to
# itself, which ncu can replay; with peers waiting on each other, ncu's
# serialised replay of one kernel would wait for the others). Needs a built
# library (make CUDA=1 lib) and ncu. Output in $OUT or build/ll-profile.
set -uo pipefail
cd "$(dirname "$0")/../.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NCU=${NCU:-$CUDA_HOME/bin/ncu}
LOGS=${OUT:-build/ll-profile}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
kernel=${1:-llDispatchRecvKernel}
shift || true
[ $# -gt 0 ] || set -- --bench
[ -x "$NCU" ] || { echo "SKIPPED ll_profile: no ncu at $NCU"; exit 0; }
[ -f build/lib/libmoeep.so ] || { echo "ll_profile: build the library first (make CUDA=1 lib)"; exit 2; }
mkdir -p "$LOGS" build/tests
"$CUDA_HOME/bin/nvcc" -std=c++17 -O2 -x cu -arch=sm_90 -Iinclude -Itools tests/gpu/gpu_ll_test.cc \
  -o build/tests/gpu_ll_test -Lbuild/lib -lmoeep -Xlinker -rpath -Xlinker "$PWD/build/lib" || exit 1
report="$LOGS/$kernel"
# Skip the warm-up launches; profile one of the timed ones.
timeout 300 "$NCU" -k "regex:$kernel" -s 20 -c 1 --set full --import-source no -f -o "$report" \
  build/tests/gpu_ll_test "$@" >"$report.run.log" 2>&1 || { tail -5 "$report.run.log"; exit 1; }
"$NCU" --import "$report.ncu-rep" --page source --print-source sass --csv >"$report.sass.csv" 2>&1
"$NCU" --import "$report.ncu-rep" --page details >"$report.details.txt" 2>&1
grep -E "^    Duration|Warp Cycles Per Issued" "$report.details.txt"
python3 tests/gpu/ncu_stalls.py "$report.sass.csv"
