#!/usr/bin/env bash
# Runs every test level this machine supports and says which it skipped.
# Levels: abi, unit (CMocka), bootstrap selftest, multi-process (MPI-free launcher
# and Open MPI), GPU (only where a GPU is visible; `make gpu-test` requires one).
# Ends with one line "N passed, M failed[, K skipped]" counting test programs.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
passed=0; failed=0; skipped=0
failures=()
# The last lines of each failed test's output, printed again at the end: a
# log read from its end then shows why, not only which.
failure_tails=$(mktemp -d)
trap 'rm -rf "$failure_tails"' EXIT
keep_tail() {  # keep_tail NAME LOG
  { echo "--- the last lines of '$1':"; tail -n 40 "$2"; } >"$failure_tails/$(printf '%03d' ${#failures[@]})"
}

run() {  # run NAME CMD...: one test program, counted by its exit status
  local name=$1; shift
  echo "=== $name: $*"
  local start=$SECONDS log rc
  log=$(mktemp)
  # To a file, not a pipe: a process a test leaves behind cannot hold it open.
  "$@" >"$log" 2>&1
  rc=$?
  cat "$log"
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1)); echo "=== $name: PASSED ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1)); failures+=("$name"); keep_tail "$name" "$log"
    echo "=== $name: FAILED ($((SECONDS - start)) s)"
  fi
  rm -f "$log"
}
skip() { skipped=$((skipped + 1)); echo "=== $1: SKIPPED ($2)"; }
run_or_skip() {  # like run; exit status 77 means SKIPPED, the output's last line saying why
  local name=$1; shift
  echo "=== $name: $*"
  local start=$SECONDS log rc
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) passed=$((passed + 1)); echo "=== $name: PASSED ($((SECONDS - start)) s)" ;;
    77) skip "$name" "$(tail -n 1 "$log")" ;;
    *) failed=$((failed + 1)); failures+=("$name"); keep_tail "$name" "$log"
       echo "=== $name: FAILED ($((SECONDS - start)) s)" ;;
  esac
  rm -f "$log"
}

# --- ABI: exported symbols, headers alone, abidiff against the baseline
run abi-check env BUILD="$BUILD" bash scripts/abi-check.sh

# --- every CUDA kernel loaded at init (sources only: ranks sharing a GPU need it)
run "cuda kernels preloaded" python3 tests/check_preload.py
# --- no #include points from a lower layer to a higher one (docs/ARCHITECTURE.md, Layers)
run "include layers" python3 scripts/check_layers.py

# --- unit suites (CMocka) and the bootstrap selftest
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] && run "unit $(basename "$t")" timeout 300 "$t"
done
# --- transport modules: each module's own tests (transports/NAME/test.sh; exit 77: SKIPPED)
for t in transports/*/test.sh; do
  [ -f "$t" ] && run_or_skip "transport $(basename "$(dirname "$t")")" env BUILD="$BUILD" timeout 900 bash "$t"
done
run "bootstrap selftest" timeout 300 "$BUILD/tests/bootstrap_selftest"
run "bootstrap guard (strangers on the listening sockets)" timeout 300 "$BUILD/tests/bootstrap_guard"

# --- the host code under ASan, UBSan and LSan (a build of its own, CUDA=0)
run "sanitizers (ASan, UBSan, LSan; host code)" env BUILD="$BUILD" bash tests/sanitize.sh

# --- install + pkg-config: a C program links against the installed library
run "install + pkg-config" bash tests/install_check.sh "$BUILD"
# --- the C ABI from Python through ctypes alone: two ranks, dispatch + combine, an error
run "python ctypes" timeout 120 python3 tests/ffi/ctypes_check.py "$BUILD/lib/libmoeep.so"
# --- bindings and examples (bindings/, examples/): Debian's python3, rustc and cargo by path
# The Python package installed offline into a venv, which the Python tests then use.
PY="$BUILD/python-venv/bin/python"
run "python moeep: offline install into a venv, libmoeep found through its prefix" \
  bash bindings/python/tests/install_check.sh "$BUILD" "$BUILD/python-venv"
run "python moeep: 2 host ranks as processes (NumPy), every output" timeout 300 \
  "$PY" bindings/python/tests/test_host_ranks.py --ranks 2
run "python moeep: 3 host ranks through EP_COMM_ID" timeout 300 \
  "$PY" bindings/python/tests/test_host_ranks.py --ranks 3 --comm-id --cases 2 --seed 7
run "python moeep: Communicator.shrink, 3 host ranks, one dies" timeout 180 "$PY" bindings/python/tests/test_shrink.py
run "python moeep: arrays (NumPy, DLPack, CUDA array interface)" timeout 120 "$PY" bindings/python/tests/test_arrays.py
run "python moeep.deep_ep: DeepEP's surface, the argument table, refusals (no torch)" timeout 120 \
  "$PY" bindings/python/tests/test_deep_ep_args.py bindings/python/README.md
run_or_skip "python moeep.deep_ep on torch CPU tensors (host backend)" timeout 600 \
  "$PY" bindings/python/tests/test_deep_ep_torch.py --ranks 2
run_or_skip "python moeep.deep_ep: Buffer(enable_shrink=True), 4 host ranks, one dies, masked (torch CPU)" \
  timeout 300 "$PY" bindings/python/tests/test_deep_ep_shrink.py --ranks 4
run_or_skip "torch beside moeep.deep_ep: the MoE layer of tests/gpu/torch_beside.py on CPU tensors (gloo)" \
  timeout 600 "$PY" tests/gpu/torch_beside.py --cpu
run "python ctypes declarations against moeep.h" /usr/bin/python3 tests/ffi/python_layout_check.py
run "julia MoEEP.jl structs and ccalls against moeep.h (no Julia needed)" /usr/bin/python3 tests/ffi/julia_layout_check.py
run_or_skip "rust: cargo test (moeep-sys layout against the header, moeep host ranks)" timeout 600 \
  bash tests/bindings/run.sh "$BUILD" rust-test
run "example C: two processes sharing a unique id" bash tests/bindings/run.sh "$BUILD" example-c
run_or_skip "example MPI: mpirun -np 4, the id through MPI_Bcast" bash tests/bindings/run.sh "$BUILD" example-mpi
run "example Python: 3 ranks as processes" bash tests/bindings/run.sh "$BUILD" example-python
run_or_skip "example Rust: 3 ranks as processes" timeout 600 bash tests/bindings/run.sh "$BUILD" example-rust
# --- the target tables' parser on a real run's logs (no GPU needed)
run "issue tables from sample logs" bash tests/gpu/issue_tables_check.sh

# --- multi-process, MPI-free launcher: 1, 2, 3 and 4 ranks on random shapes
for n in 1 2 3 4; do
  run "mp_dispatch $n ranks" timeout 600 "$BUILD/tests/mp_dispatch" -n "$n" --cases 16 --seed $((1000 + n))
done
run "mp_dispatch 4 threads (epCommInitAll)" timeout 600 "$BUILD/tests/mp_dispatch" -n 4 --threads --cases 8
for n in 1 2 3 4; do
  run "mp_lowlat $n ranks" timeout 600 "$BUILD/tests/mp_lowlat" -n "$n" --cases 10 --seed $((2000 + n))
done
run "mp_lowlat 3 ranks, high-throughput calls between the low-latency ones" timeout 600 "$BUILD/tests/mp_lowlat" \
  -n 3 --cases 6 --seed 2010 --interleave-ht
# epCommShrink (docs/SHRINK.md): rank 1 dies between calls; the survivors' next
# dispatch fails naming it, they agree on it, and their layers after the
# shrink match the reference without it (its experts -1), high-throughput
# calls between them; a layout counts no token for it; then 40 checked
# layers with nothing growing (descriptors, threads, resident memory).
run "mp_lowlat 4 ranks, a rank dies, the survivors shrink" timeout 300 "$BUILD/tests/mp_lowlat" -n 4 --cases 3 \
  --seed 61 --shrink --interleave-ht --rounds-after 40
# A rank that calls epCommShrink ends the others' waits for it at once (its
# first message), well before their timeout; nobody is found dead.
run "mp_lowlat 4 ranks, one begins a shrink while the others wait" timeout 300 "$BUILD/tests/mp_lowlat" -n 4 \
  --cases 2 --seed 62 --shrink-notice
# Two deaths one after the other: the second shrink returns both (epoch 2).
run "mp_lowlat 4 ranks, two ranks die one after the other" timeout 300 "$BUILD/tests/mp_lowlat" -n 4 --cases 2 \
  --seed 63 --shrink-twice
run "test_fuzz_api 4 ranks (threads, the same random arguments on every rank)" timeout 300 \
  "$BUILD/tests/test_fuzz_api" --ranks 4 --iters 2000 --seed 4
run "mp_topo (4 ranks as 2 nodes of 2)" timeout 300 "$BUILD/tests/mp_topo"
run "mp_errors" timeout 300 "$BUILD/tests/mp_errors"
run "ep_bench 3 ranks --check" timeout 300 "$BUILD/bin/ep_bench" -n 3 --check --iters 1 --warmup 0 \
  --shape 520:5:24:200 --shape 2560:6:48:100
# --mode ll: the low-latency calls, FP8 and BF16 wires, hidden not a multiple of 128
# (2064 FP8, 2056 BF16: an FP8 row must be a multiple of 16 bytes), split halves,
# power-of-two scales, a rank without tokens; more than one iteration, so that
# both buffer sets are used
LL_SHAPES=(--shape 7168:8:288:16 --shape 2064:5:12:37)
LL_SHAPES_BF16=(--shape 7168:8:288:16 --shape 2056:5:12:37)
run "ep_bench --mode ll 2 ranks --check (fp8)" timeout 300 "$BUILD/bin/ep_bench" -n 2 --mode ll --check \
  --iters 2 --warmup 1 "${LL_SHAPES[@]}"
run "ep_bench --mode ll 2 ranks --check (bf16, --split)" timeout 300 "$BUILD/bin/ep_bench" -n 2 --mode ll \
  --type bf16 --split --check --iters 2 --warmup 1 "${LL_SHAPES_BF16[@]}"
run "ep_bench --mode ll 3 ranks --check (fp8, --pow2-scales, --zero-rank0)" timeout 300 "$BUILD/bin/ep_bench" \
  -n 3 --mode ll --pow2-scales --zero-rank0 --check --iters 2 --warmup 1 "${LL_SHAPES[@]}"
run "ep_bench --mode ll 3 ranks --check (bf16)" timeout 300 "$BUILD/bin/ep_bench" -n 3 --mode ll --type bf16 \
  --check --iters 2 --warmup 1 "${LL_SHAPES_BF16[@]}"

# --- ranks in two pid namespaces (containers that share /dev/shm, not their pids)
timeout 300 bash tests/mp/pid_namespace.sh "$BUILD" >/tmp/moeep-pidns-$$.log 2>&1
case $? in
  0) cat /tmp/moeep-pidns-$$.log; passed=$((passed + 1)); echo "=== pid namespaces: PASSED" ;;
  77) skip "pid namespaces" "$(tail -n 1 /tmp/moeep-pidns-$$.log)" ;;
  *) cat /tmp/moeep-pidns-$$.log; failed=$((failed + 1)); failures+=("pid namespaces"); echo "=== pid namespaces: FAILED" ;;
esac
rm -f /tmp/moeep-pidns-$$.log

# --- ranks started by hand with launcher variables: the id file of a run that ended is not taken
run "ep_bench started by hand twice in a row (id file)" bash tests/mp/launch_by_hand.sh "$BUILD"
run "launcher variables: a rank without a size, or out of range, is refused" \
  bash tests/mp/launcher_env.sh "$BUILD"

# --- the forked ranks end with their launcher (a SIGTERM to its pid alone)
run "ep_bench ranks end with a killed launcher" bash tests/mp/bench_parent_death.sh "$BUILD"
# --- --mode ll refuses T = 0 from --tokens as from --shape (a usage error, not a failed run)
run "ep_bench --mode ll --tokens 0 refused" bash -c \
  "out=\$($BUILD/bin/ep_bench -n 1 --mode ll --tokens 0 2>&1); [ \$? -eq 2 ] && grep -q 'needs at least 1 token' <<<\"\$out\""

# --- ep_bench --backend cuda, however getopt spells it, runs ep_bench_gpu (or is refused without it)
run "ep_bench --backend cuda in every spelling" bash tests/mp/bench_backend.sh "$BUILD"

# --- ep_bench --seed: an unsigned number, not " -1" read as 2^64 - 1 (a value that runs, then ones refused)
bench1=("$BUILD/bin/ep_bench" -n 1 --shape 64:2:4:16 --iters 1 --warmup 0)
run "ep_bench --seed refuses a sign or leading blanks" bash -c \
  "${bench1[*]} --seed 0x10 >/dev/null && out=\$(${bench1[*]} --seed 010) && grep -q 'seed 10\$' <<<\"\$out\" &&
   out=\$(${bench1[*]} --seed 08) && grep -q 'seed 8\$' <<<\"\$out\" && for s in ' -1' '-1' '+1' ' 1' ''; do
     ${bench1[*]} --seed \"\$s\" 2>&1 | grep -qF \"bad value '\$s' for --seed\" || exit 1; done"

# --- moeep_info: a dry-run plan from a fixture; options without their section are refused
info="$BUILD/bin/moeep_info" flat=tests/data/vm_flat.xml
run "moeep_info --plan from an XML topology" bash -c \
  "$info --topo-xml $flat --plan --ranks-per-node 4 --nodes 2 | grep -q 'rail+fwd via rank 4'"
run "moeep_info refuses --nodes without --plan, --topo-xml with --comm, --ranks without --comm" bash -c \
  "! $info --nodes 2 2>/dev/null && ! $info --comm --topo-xml $flat 2>/dev/null \
   && ! $info --ranks 2 >/dev/null 2>&1 && $info --ranks 2 2>&1 | grep -q -- '--ranks N goes with --comm'"
# --- moeep_info: whether the bootstrap of the environment is authenticated; a secret is never printed
run "moeep_info says whether the bootstrap is authenticated, and never prints EP_COMM_SECRET" bash -c \
  "$info -v | grep -q 'bootstrap: authenticated: each unique id' &&
   EP_COMM_ID=127.0.0.1:1 $info -v | grep -q 'bootstrap: UNAUTHENTICATED: EP_COMM_ID=127.0.0.1:1 without' &&
   out=\$(EP_COMM_ID=127.0.0.1:1 EP_COMM_SECRET=moeep-test-secret-42 $info -v -p) &&
   grep -q 'authenticated by EP_COMM_SECRET' <<<\"\$out\" && ! grep -q 'moeep-test-secret-42' <<<\"\$out\""

# --- multi-process under Open MPI (id shared through a file, and through EP_COMM_ID)
if command -v mpirun >/dev/null 2>&1; then
  MPIRUN=(mpirun --oversubscribe -n)
  [ "$(id -u)" -eq 0 ] && MPIRUN=(mpirun --allow-run-as-root --oversubscribe -n)
  export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
  for n in 2 4; do
    run "mp_dispatch mpirun $n ranks" timeout 300 "${MPIRUN[@]}" "$n" "$BUILD/tests/mp_dispatch" --case $((n + 1))
  done
  port=$((20000 + RANDOM % 20000))
  run "mp_dispatch mpirun 3 ranks EP_COMM_ID" timeout 300 env EP_COMM_ID=127.0.0.1:$port \
    "${MPIRUN[@]}" 3 "$BUILD/tests/mp_dispatch" --case 6
  run "moeep_info --comm under mpirun (4 ranks as 2 nodes)" bash -c \
    "EP_NODE_SIZE=2 ${MPIRUN[*]} 4 -x EP_NODE_SIZE $BUILD/bin/moeep_info --comm | grep 'rail+fwd via rank 2'"
  # ... with another section both are printed; --ranks (threads) is refused there
  run "moeep_info --comm -v under mpirun; --comm --ranks refused" bash -c \
    "out=\$(${MPIRUN[*]} 2 $BUILD/bin/moeep_info --comm -v) && grep -q 'libmoeep version' <<<\"\$out\" &&
     grep -q 'plan of rank 0' <<<\"\$out\" && ! ${MPIRUN[*]} 2 $BUILD/bin/moeep_info --comm --ranks 2 2>/dev/null"
  run "ep_bench mpirun 2 ranks --check" timeout 300 "${MPIRUN[@]}" 2 "$BUILD/bin/ep_bench" --check \
    --iters 1 --warmup 0 --shape 2560:6:64:100
else
  skip "multi-process under mpirun" "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
fi

# --- GPU level
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ -f tests/gpu/run.sh ]; then
  run "gpu" env BUILD="$BUILD" bash tests/gpu/run.sh
else
  skip "gpu" "no NVIDIA GPU visible on this machine (run make gpu-test on a GPU machine)"
  # Without a GPU, the GPU test programs are still built (against this library),
  # so that a test source that stopped compiling shows here.
  if [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
    run "gpu test programs build (no GPU needed)" env BUILD="$BUILD" bash tests/gpu/build.sh
    # The kernels for Ampere (CUDA_ARCHS="80 90" in the README): they must keep
    # compiling for sm_80, which has no Hopper-only instruction. (On a GPU
    # machine tests/gpu/run.sh builds them too, for gpu_arch_test.)
    run "CUDA kernels build for sm_80 (no GPU needed)" bash -c \
      "make -j2 CUDA=1 CUDA_ARCHS=80 BUILD='$BUILD/arch-sm80' lib >'$BUILD/arch-sm80.log' 2>&1 || { tail -30 '$BUILD/arch-sm80.log'; exit 1; }"
  else
    skip "gpu test programs build" "no nvcc at ${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
  fi
fi

echo
if [ ${#failures[@]} -gt 0 ]; then
  cat "$failure_tails"/* 2>/dev/null
  echo
  printf 'failed: %s\n' "${failures[@]}"
fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$failed" -eq 0 ]
