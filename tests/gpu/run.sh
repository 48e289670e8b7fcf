#!/bin/bash
# GPU level of the tests (`make gpu-test`): builds the library with CUDA and
# (tests/gpu/build.sh) the GPU tests and the GPU benchmark, runs the tests, a
# small case under compute-sanitizer (memcheck, racecheck) and the benchmark.
# Fails when no GPU is visible. Logs go to $OUT (if set) or $BUILD/gpu-logs.
#   EP_GPU_BENCH=0   skip the benchmark
#   EP_GPU_SANITIZER=0  skip the sanitizer runs
#   EP_GPU_HOST_SANITIZER=0  skip the host code under ASan/UBSan (tests/gpu/host_sanitize.sh)
#   EP_GPU_HOST_CASES=0  skip the host-code cases (tests/gpu/host_cases.sh, gpu_host_test)
#   EP_GPU_LL=0      skip the low-latency test and its benchmark (gpu_ll_test)
#   EP_GPU_RANKS="4 8"  the rank counts of gpu_test / gpu_ll_test --ranks (empty: none;
#                    default "4 8", and "2 4 8" on one GPU)
#   EP_GPU_MP=0      skip the test with ranks as processes (gpu_mp_test: cross-process
#                    CUDA IPC against the host backend; on one GPU two processes share it)
#   EP_GPU_STAGED=0  skip the staged path across nodes (tests/gpu/staged.sh)
#   EP_GPU_ARCH=0    skip the check that init refuses a library built for another
#                    GPU architecture (gpu_arch_test: builds one into $BUILD/arch-smXY)
#   EP_GPU_RANDOM=N  cases drawn at random per test (gpu_test / gpu_ll_test --random;
#                    default 150 / 300, 0 skips them); EP_GPU_RANDOM_SEED their seed
#                    (default: the day's date, printed, so a failure can be drawn again)
#   EP_GPU_BENCH_ARGS  arguments of ep_bench_gpu (tools/gpu/ep_bench_gpu.cu; see its main)
#   EP_GPU_TEST_TIMEOUT, EP_GPU_LL_RANKS_TIMEOUT (gpu_ll_test --ranks, default 900),
#   EP_GPU_SANITIZER_TIMEOUT, EP_GPU_BENCH_TIMEOUT: seconds
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
LOGS=${OUT:-$BUILD/gpu-logs}
mkdir -p "$LOGS" "$BUILD/tests"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

make -j16 CUDA=1 lib modules >"$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; echo "gpu-test: FAILED to build"; exit 1; }
MP=${EP_GPU_MP:-1}
LL=${EP_GPU_LL:-1}
build_args=()
[ "$MP" != 0 ] || build_args+=(--no-mp)
[ "$LL" != 0 ] || build_args+=(--no-ll)
BUILD="$BUILD" CUDA_HOME="$CUDA_HOME" bash tests/gpu/build.sh "${build_args[@]}" || exit 1

status=0
if [ "$LL" != 0 ]; then
# The FP8 conversion of GPUs before sm_89 against this GPU's instruction, all 2^32 floats.
timeout 120 "$BUILD/tests/fp8_soft_test" 2>&1 | tee "$LOGS/fp8_soft_test.log" | tail -2
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fp8_soft_test: FAILED"; status=1; }
# Programmatic dependent launch, as the LL kernels are launched, on every kind of stream.
timeout 60 "$BUILD/tests/pdl_streams" 2>&1 | tee "$LOGS/pdl_streams.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "pdl_streams: FAILED"; status=1; }
timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" 2>&1 | tee "$LOGS/gpu_ll_test.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test: FAILED"; status=1; }
# The dispatch's row-slice kernels take only small calls by default; here every call.
EP_CUDA_LL_SLICES=1 timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" --small 2>&1 |
  tee "$LOGS/gpu_ll_test_slices.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test (EP_CUDA_LL_SLICES=1): FAILED"; status=1; }
# Flagged records for calls of at most 2 tokens only (8 by default): the 3-
# to 8-token cases send plain records, beside peers that send flagged ones
# (EP_CUDA_LL_FLAGGED_PEERS=0: also once they have seen those peers).
EP_CUDA_LL_FLAGGED=2 EP_CUDA_LL_FLAGGED_PEERS=0 timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" 2>&1 |
  tee "$LOGS/gpu_ll_test_flagged.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test (EP_CUDA_LL_FLAGGED=2 EP_CUDA_LL_FLAGGED_PEERS=0): FAILED"; status=1; }
# The most flagged tokens (16): the 9- to 16-token cases send flagged records
# too (two header records per warp, the largest stage).
EP_CUDA_LL_FLAGGED=16 timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" 2>&1 |
  tee "$LOGS/gpu_ll_test_flagged16.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test (EP_CUDA_LL_FLAGGED=16): FAILED"; status=1; }
# No rank sends flagged records: the whole-row receive kernels without their
# code; and the kernels launched the usual way, without programmatic
# dependent launch.
EP_CUDA_LL_FLAGGED=0 EP_CUDA_LL_PDL=0 timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" 2>&1 |
  tee "$LOGS/gpu_ll_test_plain.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test (EP_CUDA_LL_FLAGGED=0 EP_CUDA_LL_PDL=0): FAILED"; status=1; }
# Ranks of uneven batches (two, sharing the GPU when there is one). With
# EP_CUDA_LL_FLAGGED_PEERS=0 the small ranks send flagged records beside the
# large ones' plain records at every call (the mixed receive; elsewhere only
# where a small rank chose before it saw a large one); by default they send
# plain ones once they have seen a large peer, as the INFO line (once per
# communicator) says.
EP_CUDA_LL_FLAGGED_PEERS=0 timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" --mixed 2>&1 |
  tee "$LOGS/gpu_ll_test_mixed.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test --mixed (EP_CUDA_LL_FLAGGED_PEERS=0): FAILED"; status=1; }
rm -f "$LOGS"/ll_peers.*.log
EP_DEBUG=INFO EP_DEBUG_SUBSYS=CUDA EP_DEBUG_FILE="$LOGS/ll_peers.%p.log" \
  timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" --mixed 2>&1 |
  tee "$LOGS/gpu_ll_test_mixed_peers.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test --mixed: FAILED"; status=1; }
grep -q "dispatch sends plain records where its size" "$LOGS"/ll_peers.*.log 2>/dev/null ||
  { echo "gpu_ll_test --mixed: no small call sent plain records beside a large peer"; status=1; }
fi
timeout ${EP_GPU_TEST_TIMEOUT:-540} "$BUILD/tests/gpu_test" 2>&1 | tee "$LOGS/gpu_test.log"
rc=${PIPESTATUS[0]}
if grep -q "^SKIPPED gpu_test: no GPU" "$LOGS/gpu_test.log"; then echo "gpu-test: FAILED: no GPU visible"; exit 1; fi
[ "$rc" -eq 0 ] || { echo "gpu_test: exit $rc"; status=1; }
# config.max_nodes_per_token checked by the kernels: each rank a node (two ranks,
# sharing a GPU when there is one).
EP_NODE_SIZE=1 timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_test" --node-limit 2>&1 |
  tee "$LOGS/gpu_test_node_limit.log" | tail -2
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_test --node-limit: FAILED"; status=1; }
if [ "$LL" != 0 ]; then
  EP_NODE_SIZE=1 timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" --node-limit 2>&1 |
    tee "$LOGS/gpu_ll_test_node_limit.log" | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test --node-limit: FAILED"; status=1; }
fi
# The proxy protocol with a kernel as producer: ring, device flags written by
# stream writes, errors and a stopped proxy seen by the kernel's waits.
timeout 120 "$BUILD/tests/proxy_gpu_test" 2>&1 | tee "$LOGS/proxy_gpu_test.log" | grep -E "round trip|stream writes|FAIL|proxy_gpu_test:"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "proxy_gpu_test: FAILED"; status=1; }
# EP4 / EP8: on fewer GPUs the ranks share GPUs (each a share of the SMs);
# gpu_ll_test's EP8 on one GPU takes ~450 s (its host side: inputs and the
# reference of 8 ranks), hence its own timeout.
# (gpu_ll_test's own run above already covers EP = all GPUs, at most 8.)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -gt 8 ] && ngpu=8
# On one GPU the EP2 cases run as two ranks sharing it (they print SKIPPED otherwise).
default_ranks="4 8"
[ "$ngpu" -lt 2 ] && default_ranks="2 4 8"
for n in ${EP_GPU_RANKS-$default_ranks}; do
  timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_test" --ranks "$n" 2>&1 | tee "$LOGS/gpu_test_ranks$n.log" | tail -1
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_test --ranks $n: FAILED"; status=1; }
  if [ "$LL" != 0 ] && [ "$n" != "$ngpu" ]; then
    timeout ${EP_GPU_LL_RANKS_TIMEOUT:-900} "$BUILD/tests/gpu_ll_test" --ranks "$n" 2>&1 | tee "$LOGS/gpu_ll_test_ranks$n.log" | tail -2
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test --ranks $n: FAILED"; status=1; }
  fi
  # The mixed receive with several flagged sources (the run above takes it
  # only where a small rank chose before it saw a large one).
  if [ "$LL" != 0 ] && [ "$n" -gt 2 ]; then
    EP_CUDA_LL_FLAGGED_PEERS=0 timeout ${EP_GPU_LL_RANKS_TIMEOUT:-900} "$BUILD/tests/gpu_ll_test" --mixed --ranks "$n" \
      2>&1 | tee "$LOGS/gpu_ll_test_mixed_ranks$n.log" | tail -1
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test --mixed --ranks $n (EP_CUDA_LL_FLAGGED_PEERS=0): FAILED"; status=1; }
  fi
done
# The backend's host code, a case per promise (tests/gpu/gpu_host_test.cu),
# each in a process of its own; the init steps also under the leak check.
if [ "${EP_GPU_HOST_CASES:-1}" != 0 ]; then
  OUT="$LOGS" BUILD="$BUILD" CUDA_HOME="$CUDA_HOME" bash tests/gpu/host_cases.sh 2>&1 | tee "$LOGS/host_cases.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "host cases: FAILED"; status=1; }
  timeout 60 "$BUILD/tests/notice_probe" 2>&1 | tee "$LOGS/notice_probe.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "notice_probe: FAILED (a copy did not get through a device-wide wait)"; status=1; }
fi
# Cases drawn at random (tests/gpu/random_cases.h): 1-8 ranks sharing the
# visible GPUs, any hidden size, top-k, expert count, batch per rank and
# option, against the host backend. A new seed each day widens what the
# runs cover; a failure prints the seed and case number that draw it again.
random_n=${EP_GPU_RANDOM:-}
random_seed=${EP_GPU_RANDOM_SEED:-$(date +%Y%m%d)}
if [ "${random_n:-1}" != 0 ]; then
  echo "random cases: seed $random_seed"
  timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_test" --random "${random_n:-150}" "$random_seed" 2>&1 |
    tee "$LOGS/gpu_test_random.log" | tail -1
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_test --random ${random_n:-150} $random_seed: FAILED"; status=1; }
  if [ "$LL" != 0 ]; then
    timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_ll_test" --random "${random_n:-300}" "$random_seed" 2>&1 |
      tee "$LOGS/gpu_ll_test_random.log" | tail -1
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_ll_test --random ${random_n:-300} $random_seed: FAILED"; status=1; }
  fi
fi
# A library built for another architecture than GPU 0's: init must refuse it
# with the build that would run (gpu_arch_test.cc), and the normal build not.
if [ "${EP_GPU_ARCH:-1}" != 0 ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
  other=80
  [ "${cap%%.*}" = 8 ] && other=90
  if make -j16 CUDA=1 CUDA_ARCHS=$other BUILD="$BUILD/arch-sm$other" lib >"$LOGS/build_sm$other.log" 2>&1; then
    timeout 60 "$BUILD/tests/gpu_arch_test" 2>&1 | tee "$LOGS/gpu_arch_test.log" | tail -1
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_arch_test: FAILED"; status=1; }
    LD_LIBRARY_PATH="$PWD/$BUILD/arch-sm$other/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      timeout 60 "$BUILD/tests/gpu_arch_test" --expect-refused 2>&1 | tee -a "$LOGS/gpu_arch_test.log" | tail -2
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_arch_test --expect-refused (sm_$other library): FAILED"; status=1; }
  else
    tail -20 "$LOGS/build_sm$other.log"
    echo "gpu_arch_test: FAILED to build the sm_$other library"
    status=1
  fi
fi
if [ "$MP" != 0 ]; then
# A process per GPU; on one GPU two processes share it (slow without MPS, but
# the same cross-process path).
mp_args=()
[ "$ngpu" -lt 2 ] && mp_args=(--ranks 2)
timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_mp_test" "${mp_args[@]}" 2>&1 | tee "$LOGS/gpu_mp_test.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_mp_test: FAILED"; status=1; }
# Shrink on GPUs (docs/SHRINK.md, "GPUs"): 4 processes, the last exits, the
# others shrink and go on, a graph captured before the death included.
timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_mp_test" --ranks 4 --shrink 2>&1 | tee "$LOGS/gpu_mp_shrink.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_mp_test --shrink: FAILED"; status=1; }
# The same with no flagged records: every receive after the shrink takes the
# whole-row kernel, which must not read a dead source's ntok word.
EP_CUDA_LL_FLAGGED=0 timeout ${EP_GPU_TEST_TIMEOUT:-300} "$BUILD/tests/gpu_mp_test" --ranks 4 --shrink 2>&1 |
  tee "$LOGS/gpu_mp_shrink_plain.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_mp_test --shrink (EP_CUDA_LL_FLAGGED=0): FAILED"; status=1; }
# The staged path (GPUs on different nodes: 2 x 2 over socket on loopback,
# no graphs): the survivors shrink through the host backend inside it.
EP_CUDA_NETWORK=1 EP_NODE_SIZE=2 EP_TRANSPORTS=shm,socket EP_SOCKET_IFNAME=lo timeout ${EP_GPU_TEST_TIMEOUT:-300} \
  "$BUILD/tests/gpu_mp_test" --ranks 4 --shrink 2>&1 | tee "$LOGS/gpu_mp_shrink_staged.log" | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_mp_test --shrink (staged, 2 x 2): FAILED"; status=1; }
fi

# The staged path of GPU ranks on different nodes (tests/gpu/staged.sh): 2
# ranks as 2 nodes and 4 as 2 x 2 over the socket transport on loopback,
# against the host backend, and its eager latency beside one node's.
if [ "${EP_GPU_STAGED:-1}" != 0 ]; then
  OUT="$LOGS" BUILD="$BUILD" bash tests/gpu/staged.sh 2>&1 | tee "$LOGS/staged.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "staged path: FAILED"; status=1; }
fi

# sanitize TOOL LOGNAME PROGRAM: PROGRAM --small under compute-sanitizer TOOL.
sanitize() {
  timeout ${EP_GPU_SANITIZER_TIMEOUT:-300} "$CUDA_HOME/bin/compute-sanitizer" --tool "$1" --error-exitcode 9 \
    "$BUILD/tests/$3" --small >"$LOGS/$2.log" 2>&1
  local rc=$?
  tail -3 "$LOGS/$2.log"
  echo "compute-sanitizer $1 ($3 --small): exit $rc"
  [ "$rc" -eq 0 ] || status=1
}
if [ "${EP_GPU_SANITIZER:-1}" != 0 ]; then
  if [ -x "$CUDA_HOME/bin/compute-sanitizer" ]; then
    for tool in memcheck racecheck; do
      sanitize $tool "sanitizer_$tool" gpu_test
      [ "$LL" != 0 ] && sanitize $tool "sanitizer_ll_$tool" gpu_ll_test
    done
  else  # asked for (the default), so its absence is a failure, not a silent pass
    echo "compute-sanitizer: FAILED: $CUDA_HOME/bin/compute-sanitizer not found (EP_GPU_SANITIZER=0 skips it)"
    status=1
  fi
fi

# The backend's host code under ASan and UBSan (tests/gpu/host_sanitize.sh).
if [ "${EP_GPU_HOST_SANITIZER:-1}" != 0 ] && [ "$LL" != 0 ] && [ "$MP" != 0 ]; then
  OUT="$LOGS" BUILD="$BUILD" bash tests/gpu/host_sanitize.sh || status=1
fi

if [ "${EP_GPU_BENCH:-1}" != 0 ]; then
  if [ "$LL" != 0 ]; then
    timeout 300 "$BUILD/tests/gpu_ll_test" --bench 2>&1 | tee "$LOGS/gpu_ll_bench.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    # Kernel time (the kernels time themselves; the communicator logs medians at destroy).
    EP_CUDA_LL_TIMING=1 EP_DEBUG=INFO EP_DEBUG_SUBSYS=CUDA timeout 300 "$BUILD/tests/gpu_ll_test" --bench 2>&1 |
      grep "kernel time" | tee "$LOGS/gpu_ll_kernel_time.log"
    "$CUDA_HOME/bin/nvcc" -O2 -arch=sm_90 -Itools tests/gpu/ll_floor.cu -o "$BUILD/tests/ll_floor" &&
      timeout 120 "$BUILD/tests/ll_floor" 2>&1 | tee "$LOGS/ll_floor.log"
    "$CUDA_HOME/bin/nvcc" -O2 -arch=sm_90 -Itools tests/gpu/ll_probe.cu -o "$BUILD/tests/ll_probe" &&
      timeout 120 "$BUILD/tests/ll_probe" 2>&1 | tee "$LOGS/ll_probe.log"
  fi
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/libnccl.so.2" ] && export EP_BENCH_NCCL_LIB="$NCCL_DIR/libnccl.so.2"
  # On one GPU the high-throughput table runs at EP1 (every row local: the
  # kernels' own work and their checks, without a link), unless the
  # arguments name the ranks.
  bench_args=${EP_GPU_BENCH_ARGS:-}
  [ "$ngpu" -lt 2 ] && [[ "$bench_args" != *--ranks* ]] && bench_args="--ranks 1 $bench_args"
  timeout ${EP_GPU_BENCH_TIMEOUT:-400} "$BUILD/tests/ep_bench_gpu" $bench_args 2>&1 | tee "$LOGS/ep_bench_gpu.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
[ $status -eq 0 ] && echo "gpu-test: PASSED" || echo "gpu-test: FAILED"
exit $status
