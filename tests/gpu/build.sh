#!/bin/bash
# Builds the GPU test programs (gpu_test, gpu_arch_test, gpu_mp_test, gpu_ll_test,
# fp8_soft_test, pdl_streams, gpu_host_test, notice_probe, proxy_gpu_test) and the GPU benchmark
# (tools/gpu/ep_bench_gpu.cu) into $BUILD/tests, against $BUILD/lib/libmoeep.so, as
# tests/gpu/run.sh runs them. The helpers they share are in tools/gpu/ (-Itools).
#   tests/gpu/build.sh [--no-mp] [--no-ll]
# Needs nvcc and the CUDA headers, not a GPU: the CPU-only test suite runs it
# too (tests/run_all.sh), against the host-only library, so that a test source
# that no longer compiles fails there and not first on a GPU machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mp=1 ll=1
for a in "$@"; do
  case "$a" in
    --no-mp) mp=0 ;;
    --no-ll) ll=0 ;;
    *) echo "build.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
mkdir -p "$BUILD/tests"
RPATH="$PWD/$BUILD/lib"
fail() { echo "gpu-test: FAILED to build $1"; exit 1; }

g++ -std=c++17 -O2 -g -Wall -Iinclude -Itools -isystem "$CUDA_HOME/include" tests/gpu/gpu_test.cc -o "$BUILD/tests/gpu_test" \
  -L"$BUILD/lib" -lmoeep -L"$CUDA_HOME/lib64" -lcudart -pthread -Wl,-rpath,"$RPATH" || fail gpu_test
g++ -std=c++17 -O2 -g -Wall -Iinclude -isystem "$CUDA_HOME/include" tests/gpu/gpu_arch_test.cc \
  -o "$BUILD/tests/gpu_arch_test" -L"$BUILD/lib" -lmoeep -L"$CUDA_HOME/lib64" -lcudart -Wl,-rpath,"$RPATH" ||
  fail gpu_arch_test
if [ "$mp" != 0 ]; then
  g++ -std=c++17 -O2 -g -Wall -Iinclude -Itools -isystem "$CUDA_HOME/include" tests/gpu/gpu_mp_test.cc \
    tools/common/launch.cc -o "$BUILD/tests/gpu_mp_test" \
    -L"$BUILD/lib" -lmoeep -L"$CUDA_HOME/lib64" -lcudart -pthread -Wl,-rpath,"$RPATH" || fail gpu_mp_test
fi
"$CUDA_HOME/bin/nvcc" -std=c++17 -O2 -arch=sm_90 -Iinclude tools/gpu/ep_bench_gpu.cu -o "$BUILD/tests/ep_bench_gpu" \
  -L"$BUILD/lib" -lmoeep -ldl -Xlinker -rpath -Xlinker "$RPATH" || fail ep_bench_gpu
if [ "$ll" != 0 ]; then
  "$CUDA_HOME/bin/nvcc" -std=c++17 -O2 -arch=sm_90 -Isrc tests/gpu/fp8_soft_test.cu -o "$BUILD/tests/fp8_soft_test" ||
    fail fp8_soft_test
  "$CUDA_HOME/bin/nvcc" -O2 -arch=sm_90 -Itools tests/gpu/pdl_streams.cu -o "$BUILD/tests/pdl_streams" || fail pdl_streams
  "$CUDA_HOME/bin/nvcc" -std=c++17 -O2 -x cu -arch=sm_90 -Iinclude -Itools tests/gpu/gpu_ll_test.cc -o "$BUILD/tests/gpu_ll_test" \
    -L"$BUILD/lib" -lmoeep -Xlinker -rpath -Xlinker "$RPATH" || fail gpu_ll_test
fi
"$CUDA_HOME/bin/nvcc" -std=c++17 -O2 -arch=sm_90 -Iinclude -Itools tests/gpu/gpu_host_test.cu tests/gpu/alloc_count.cc -o "$BUILD/tests/gpu_host_test" \
  -L"$BUILD/lib" -lmoeep -Xlinker -rpath -Xlinker "$RPATH" -Xlinker --export-dynamic || fail gpu_host_test
"$CUDA_HOME/bin/nvcc" -O2 -arch=sm_90 tests/gpu/notice_probe.cu -o "$BUILD/tests/notice_probe" || fail notice_probe
# The proxy with a kernel as its producer: the proxy's own sources, not the library.
"$CUDA_HOME/bin/nvcc" -std=c++17 -O2 -arch=sm_90 -Isrc -Iinclude tests/gpu/proxy_gpu_test.cu src/proxy/proxy.cc \
  src/cuda/stream_flags.cc -o "$BUILD/tests/proxy_gpu_test" || fail proxy_gpu_test
exit 0
