#!/bin/bash
# The GPU parts of the bindings, on a machine with a GPU, PyTorch and the NCCL
# that PyTorch ships (pip's nvidia-nccl); one or more GPUs (with one, the two
# ranks of each part share it). From the repository root:
#   bash tests/gpu/bindings_gpu.sh
# Parts, each PASSED / FAILED / SKIPPED (with why), a table last; exit 1 if one failed:
#   a  nccl_beside (C): an NCCL and a libmoeep communicator in the same two
#      processes, ncclAllReduce and dispatch / combine interleaved on one
#      stream, eagerly and captured in one CUDA graph
#   b  torch_beside.py: torch.distributed (NCCL) all-reduces and an MoE layer
#      of moeep.deep_ep.Buffer on the same stream, eagerly and in torch.cuda.graph
#   c  the DeepEP facade on CUDA tensors against the host backend on random
#      data, bit for bit (bindings/python/tests/test_deep_ep_torch.py --device cuda)
#   d  the moeep package on CUDA arrays known only by __cuda_array_interface__
#      or DLPack, against the host backend (moeep_cuda_arrays.py)
#   e  Buffer(enable_shrink=True) on CUDA tensors: 4 ranks, the last exits, the
#      survivors mask it and go on (bindings/python/tests/test_deep_ep_shrink.py)
# Environment: BUILD (build), CUDA_HOME (/usr/local/cuda), PYTHON (python3, the
# one with torch), NCCL_DIR (else found through PyTorch's nvidia.nccl), OUT
# (logs go to $OUT/bindings, else $BUILD/gpu-logs/bindings).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PYTHON=${PYTHON:-python3}
LOGS=${OUT:-$BUILD/gpu-logs}/bindings
mkdir -p "$LOGS" "$BUILD/tests"
# Never NVLink multicast on the shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}" MOEEP_LIBRARY="$PWD/$BUILD/lib"

declare -A result
part() {  # part NAME LOG CMD...: runs one part, its status from the exit code (77: SKIPPED)
  local name=$1 log=$2
  shift 2
  echo "=== $name: $*"
  local start=$SECONDS
  timeout 1200 "$@" >"$log" 2>&1
  local rc=$?
  tail -n 20 "$log"
  case $rc in
    0) result[$name]="PASSED ($((SECONDS - start)) s)" ;;
    77) result[$name]="SKIPPED ($(tail -n 1 "$log"))" ;;
    *) result[$name]="FAILED (exit $rc, $((SECONDS - start)) s; log $log)" ;;
  esac
  echo "=== $name: ${result[$name]}"
}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bindings_gpu: FAILED: no NVIDIA GPU visible"
  exit 1
fi
make -j16 CUDA=1 lib >"$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; echo "bindings_gpu: FAILED to build"; exit 1; }

# (a) NCCL's header and library as PyTorch installed them.
if [ -z "${NCCL_DIR:-}" ]; then
  NCCL_DIR=$("$PYTHON" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
fi
if [ -n "${NCCL_DIR:-}" ] && [ -f "$NCCL_DIR/include/nccl.h" ] && [ -f "$NCCL_DIR/lib/libnccl.so.2" ]; then
  if gcc -std=c11 -O2 -Wall -Wextra tests/gpu/nccl_beside.c -Iinclude -I"$CUDA_HOME/include" -I"$NCCL_DIR/include" \
      -L"$BUILD/lib" -lmoeep -L"$CUDA_HOME/lib64" -lcudart -L"$NCCL_DIR/lib" -l:libnccl.so.2 \
      -Wl,-rpath,"$PWD/$BUILD/lib:$NCCL_DIR/lib:$CUDA_HOME/lib64" -o "$BUILD/tests/nccl_beside" \
      >"$LOGS/nccl_beside.build.log" 2>&1; then
    part "a nccl_beside" "$LOGS/nccl_beside.log" "$BUILD/tests/nccl_beside"
  else
    cat "$LOGS/nccl_beside.build.log"
    result["a nccl_beside"]="FAILED (does not build; log $LOGS/nccl_beside.build.log)"
  fi
else
  result["a nccl_beside"]="SKIPPED (no nccl.h / libnccl.so.2 under NCCL_DIR='${NCCL_DIR:-}')"
fi

part "b torch_beside" "$LOGS/torch_beside.log" "$PYTHON" tests/gpu/torch_beside.py
part "c deep_ep facade vs host backend" "$LOGS/facade_vs_host.log" \
  "$PYTHON" bindings/python/tests/test_deep_ep_torch.py --device cuda --ranks 2
part "d moeep on CUDA arrays (CAI, DLPack)" "$LOGS/cuda_arrays.log" "$PYTHON" tests/gpu/moeep_cuda_arrays.py
part "e deep_ep facade shrink" "$LOGS/facade_shrink.log" \
  "$PYTHON" bindings/python/tests/test_deep_ep_shrink.py --device cuda --ranks 4

echo
echo "| part | result |"
echo "| --- | --- |"
status=0
for name in "a nccl_beside" "b torch_beside" "c deep_ep facade vs host backend" "d moeep on CUDA arrays (CAI, DLPack)"; do
  echo "| $name | ${result[$name]} |"
  case "${result[$name]}" in FAILED*) status=1 ;; esac
done
exit $status
