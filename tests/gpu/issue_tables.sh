#!/bin/bash
# The tables of the high-throughput and low-latency targets, measured in one
# command on the GPUs of this machine (already built: tests/gpu/build.sh):
#   - high throughput: ep_bench_gpu at 24, 32 and 64 SMs, 4096 and 8192 tokens,
#     BF16 and FP8 (hidden 7168, top-8 of 256), with NCCL's all-to-all of the
#     same bytes where two or more GPUs are visible;
#   - low latency: gpu_ll_test --bench (128 tokens per rank, hidden 7168, top-8
#     of 288, FP8 wire; split halves; one token per rank) with the kernels
#     timing themselves (EP_CUDA_LL_TIMING=1).
# Each figure is set beside its target (stated for EP2 on 2 x H200); on one GPU
# the run is EP1 (every row local, no link), which the tables say.
#
#   tests/gpu/issue_tables.sh [--ranks N] [--ht-only | --ll-only]
#     --ranks N   EP N (default: every visible GPU, at most 8; 1 on one GPU)
# Writes issue_tables.md and the raw logs to $OUT (default build/issue-tables).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
LOGS=${OUT:-$BUILD/issue-tables}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
ranks="" ht=1 ll=1
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks="$2"; shift ;;
    --ht-only) ll=0 ;;
    --ll-only) ht=0 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "issue_tables.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for p in ep_bench_gpu gpu_ll_test; do
  [ -x "$BUILD/tests/$p" ] || { echo "issue_tables.sh: $BUILD/tests/$p is missing (tests/gpu/build.sh)" >&2; exit 2; }
done
mkdir -p "$LOGS"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -lt 1 ]; then
  echo "issue_tables.sh: nvidia-smi lists no GPU: assuming one (the benchmarks say if there is none)"
  gpus=1
fi
[ -n "$ranks" ] || ranks=$(( gpus >= 2 ? (gpus > 8 ? 8 : gpus) : 1 ))
status=0
if [ "$ht" = 1 ]; then
  # NCCL for its all-to-all beside the library (as tests/gpu/run.sh finds it).
  if [ -z "${EP_BENCH_NCCL_LIB:-}" ]; then
    NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/libnccl.so.2" ] && export EP_BENCH_NCCL_LIB="$NCCL_DIR/libnccl.so.2"
  fi
  ht_args=(--ranks "$ranks" --sms 24,32,64 --tokens 4096,8192 --types both)
  [ "$ranks" -gt 1 ] && [ "$ranks" -le "$gpus" ] || ht_args+=(--no-nccl)
  timeout 540 "$BUILD/tests/ep_bench_gpu" "${ht_args[@]}" >"$LOGS/ht.log" 2>&1 || { echo "ep_bench_gpu: FAILED (see $LOGS/ht.log)"; status=1; }
fi
if [ "$ll" = 1 ]; then
  rm -f "$LOGS/ll_kernels.log"
  EP_CUDA_LL_TIMING=1 EP_DEBUG=INFO EP_DEBUG_SUBSYS=CUDA EP_DEBUG_FILE="$LOGS/ll_kernels.log" timeout 300 \
    "$BUILD/tests/gpu_ll_test" --bench --ranks "$ranks" >"$LOGS/ll.log" 2>&1 ||
    { echo "gpu_ll_test --bench: FAILED (see $LOGS/ll.log)"; status=1; }
fi
machine="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) x $gpus"
commit=$(git describe --always --dirty 2>/dev/null || echo unknown)
python3 tests/gpu/issue_tables.py "$LOGS" "$ranks" "$machine" "$commit" | tee "$LOGS/issue_tables.md"
exit $status
