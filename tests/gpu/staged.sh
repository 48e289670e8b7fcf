#!/bin/bash
# The staged path of GPU ranks on different nodes (docs/PROXY.md, "The staged
# path"), on this machine: ranks sharing the visible GPUs, each group of
# EP_NODE_SIZE ranks a node, joined over the socket transport on loopback.
# Correctness against the host backend (gpu_test / gpu_ll_test --staged, 2
# ranks as 2 nodes and 4 as 2 x 2) and the eager latency of dispatch +
# combine of 1 and 128 tokens, staged and on one node, in the same run, and
# the high-throughput benchmark (128 and 4096 tokens) both ways.
# tests/gpu/run.sh runs it; needs the GPU tests built (tests/gpu/build.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
LOGS=${OUT:-$BUILD/gpu-logs}
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=32
status=0
step() {  # step LOGNAME CMD...: runs CMD, its last lines shown, a failure counted
  local name=$1; shift
  local start=$SECONDS
  timeout ${EP_GPU_TEST_TIMEOUT:-300} "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  grep -E "FAIL" "$LOGS/$name.log" | head -10
  tail -1 "$LOGS/$name.log"
  echo "staged: $name: exit $rc ($((SECONDS - start)) s)"
  [ $rc -eq 0 ] || status=1
}
step staged_gpu_test_2 "$BUILD/tests/gpu_test" --staged 2
EP_NODE_SIZE=2 step staged_gpu_test_4 "$BUILD/tests/gpu_test" --staged 4
step staged_gpu_ll_test_2 "$BUILD/tests/gpu_ll_test" --staged 2
EP_NODE_SIZE=2 step staged_gpu_ll_test_4 "$BUILD/tests/gpu_ll_test" --staged 4
if [ "${EP_GPU_BENCH:-1}" != 0 ]; then
  step eager_one_node "$BUILD/tests/gpu_ll_test" --eager-bench 2 1,128
  EP_CUDA_NETWORK=1 EP_NODE_SIZE=1 EP_TRANSPORTS=shm,socket EP_SOCKET_IFNAME=lo EP_DEBUG=INFO \
    EP_DEBUG_SUBSYS=INIT step eager_staged "$BUILD/tests/gpu_ll_test" --eager-bench 2 1,128
  # High throughput, 2 ranks sharing the GPU: one node (CUDA IPC) and 2 nodes (staged), checked and timed.
  step ht_one_node "$BUILD/tests/ep_bench_gpu" --ranks 2 --no-nccl --sms 32 --tokens 128,4096 --types bf16
  EP_CUDA_NETWORK=1 EP_NODE_SIZE=1 EP_TRANSPORTS=shm,socket EP_SOCKET_IFNAME=lo \
    step ht_staged "$BUILD/tests/ep_bench_gpu" --ranks 2 --no-nccl --sms 32 --tokens 128,4096 --types bf16
  grep -h -E "^ +[0-9]+ " "$LOGS/ht_one_node.log" "$LOGS/ht_staged.log" | head -8
  # The staging leg (the copies' medians, logged at destroy) beside plain copies of a call's rows.
  grep -h -E "LL eager|reference:|staging to" "$LOGS/eager_one_node.log" "$LOGS/eager_staged.log" | sed 's/^.*EP INFO //'

fi
exit $status
