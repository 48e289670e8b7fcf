#!/bin/bash
# A/B of library revisions on the GPU machine, in one process tree so that the
# runs share the machine state: builds libmoeep.so at each revision, builds
# the benchmarks once from the working tree (the ABI is stable, so one binary
# runs against every library through LD_LIBRARY_PATH), then runs them for each
# revision in turn, `--rounds` times interleaved (A B C A B C ...), so that
# drift of the machine shows as spread within a revision, not as a difference.
#
#   tests/gpu/ab.sh [--ll] [--ht "GPU_BENCH ARGS"] [--rounds N] [--check full|small|none]
#                   [--budget SECONDS] [--build-only] REV...
#     REV           a git revision (branch, tag, sha), WORKTREE (the working
#                   tree as it is, uncommitted changes included), or dir:PATH
#                   (a source tree exported elsewhere, e.g. with git archive,
#                   where this checkout has no git history), or lib:PATH (a
#                   libmoeep.so built elsewhere: PATH is its directory)
#     --ll          low-latency kernel times and per-call figures
#                   (gpu_ll_test --bench, EP_CUDA_LL_TIMING=1); the default
#     --ht ARGS     the high-throughput benchmark (ep_bench_gpu ARGS --no-nccl)
#     --rounds N    runs per revision (default 2)
#     --check small the tests with --small (gpu_ll_test: a few shapes, EP1 and
#                   EP2; gpu_test: EP1 only) instead of all their cases
#     --check none  no test pass first: for a revision older than the tests,
#                   whose new cases it fails (ep_bench_gpu still checks the
#                   outputs of the cases it times; gpu_ll_test --bench does not)
#     --budget S    start no run after S seconds from the start (what ran is
#                   reported; a command limit then cuts nothing half-done)
#     --build-only  build everything, run nothing (works without a GPU)
# Unless --check none, every revision must pass gpu_ll_test (or gpu_test for --ht) before it is
# timed; a revision that fails is reported and skipped. Logs: $OUT or
# build/ab-logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC="$CUDA_HOME/bin/nvcc"
ROOT=$PWD
WORK=${AB_WORK:-/tmp/moeep-ab}
LOGS=${OUT:-$ROOT/build/ab-logs}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

ll=0 ht="" rounds=2 build_only=0 check=full budget=0 revs=()
START=$(date +%s)
while [ $# -gt 0 ]; do
  case "$1" in
    --ll) ll=1 ;;
    --ht) ht="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --check) check="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --build-only) build_only=1 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    -*) echo "ab.sh: unknown option $1" >&2; exit 2 ;;
    *) revs+=("$1") ;;
  esac
  shift
done
[ ${#revs[@]} -ge 1 ] || { echo "ab.sh: name at least one revision (see --help)" >&2; exit 2; }
case "$check" in full) check_arg="" ;; small) check_arg="--small" ;; none) check_arg="" ;;
  *) echo "ab.sh: --check full, small or none, not $check" >&2; exit 2 ;; esac
case "$budget" in ''|*[!0-9]*) echo "ab.sh: --budget takes whole seconds, not $budget" >&2; exit 2 ;; esac
# True while the budget (if any) allows another run; says so once when spent.
within_budget() {
  [ "$budget" = 0 ] && return 0
  [ $(( $(date +%s) - START )) -lt "$budget" ] && return 0
  [ -z "${budget_said:-}" ] && echo "== budget of $budget s spent: the remaining runs are skipped"
  budget_said=1
  return 1
}
[ -n "$ht" ] || ll=1
mkdir -p "$WORK" "$LOGS" build/tests

# The tree of each revision under $WORK/<name>, built there. Two revisions
# with one name would share that tree (the second replacing the first, and
# the A/B timing one library twice): refused.
names=()
taken() {
  local n
  for n in "${names[@]}"; do
    [ "$n" = "$1" ] && { echo "ab.sh: two revisions are named $1 (give their directories other names)" >&2; exit 2; }
  done
  return 0
}
for rev in "${revs[@]}"; do
  if [ "${rev#lib:}" != "$rev" ]; then
    src="${rev#lib:}"
    [ -f "$src/libmoeep.so" ] || { echo "ab.sh: no libmoeep.so in $src" >&2; exit 2; }
    name="lib-$(basename "$src")"
    taken "$name"
    rm -rf "$WORK/$name" && mkdir -p "$WORK/$name/build/lib"
    cp -a "$src"/libmoeep.so* "$WORK/$name/build/lib/"
    echo "== prebuilt $rev ($name)"
    names+=("$name")
    continue
  elif [ "$rev" = WORKTREE ]; then
    name=worktree
    taken "$name"
    rm -rf "$WORK/$name" && mkdir -p "$WORK/$name"
    git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$WORK/$name" -xf -
  elif [ "${rev#dir:}" != "$rev" ]; then
    src="${rev#dir:}"
    [ -f "$src/Makefile" ] || { echo "ab.sh: $src is not a source tree" >&2; exit 2; }
    name="dir-$(basename "$src")"
    taken "$name"
    rm -rf "$WORK/$name" && mkdir -p "$WORK/$name"
    tar -C "$src" --exclude=./build -cf - . | tar -C "$WORK/$name" -xf -
  else
    # A revision is built from git's history, not from the files here: where
    # they differ from HEAD (uncommitted work, or a copy of the files over an
    # older clone) say so, since the A/B may not be of what the files hold.
    git diff --quiet HEAD -- src include transports Makefile 2>/dev/null ||
      echo "ab.sh: warning: the library sources here differ from HEAD ($(git rev-parse --short HEAD)); $rev is built from git's history (WORKTREE or dir:PATH build the files)" >&2
    sha=$(git rev-parse --short "$rev^{commit}") || { echo "ab.sh: no revision $rev" >&2; exit 2; }
    name="$sha"
    taken "$name"
    rm -rf "$WORK/$name" && mkdir -p "$WORK/$name"
    git archive "$sha" | tar -C "$WORK/$name" -xf -
  fi
  echo "== build $rev ($name)"
  (cd "$WORK/$name" && make -j"$(nproc)" CUDA=1 lib) >"$LOGS/build-$name.log" 2>&1 ||
    { tail -20 "$LOGS/build-$name.log"; echo "ab.sh: $rev does not build"; exit 1; }
  names+=("$name")
done

# The benchmarks, once, from the working tree.
if [ $ll = 1 ]; then
  "$NVCC" -std=c++17 -O2 -x cu -arch=sm_90 -Iinclude -Itools tests/gpu/gpu_ll_test.cc -o build/tests/ab_ll_test \
    -L"$WORK/${names[0]}/build/lib" -lmoeep || exit 1
fi
if [ -n "$ht" ]; then
  "$NVCC" -std=c++17 -O2 -arch=sm_90 -Iinclude tools/gpu/ep_bench_gpu.cu -o build/tests/ab_bench \
    -L"$WORK/${names[0]}/build/lib" -lmoeep -ldl || exit 1
  g++ -std=c++17 -O2 -Iinclude -Itools -isystem "$CUDA_HOME/include" tests/gpu/gpu_test.cc -o build/tests/ab_test \
    -L"$WORK/${names[0]}/build/lib" -lmoeep -L"$CUDA_HOME/lib64" -lcudart -pthread || exit 1
fi
[ $build_only = 1 ] && { echo "ab.sh: built ${names[*]}"; exit 0; }
nvidia-smi -L >/dev/null 2>&1 || { echo "ab.sh: no GPU visible (--build-only builds without one)"; exit 1; }

# Correctness first.
ok=()
for name in "${names[@]}"; do
  within_budget || break
  lib="$WORK/$name/build/lib"
  good=1
  if [ "$check" = none ]; then ok+=("$name"); continue; fi
  if [ $ll = 1 ]; then
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH="$lib" timeout 300 build/tests/ab_ll_test $check_arg >"$LOGS/check-ll-$name.log" 2>&1 || good=0
  fi
  if [ -n "$ht" ]; then
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH="$lib" timeout 540 build/tests/ab_test $check_arg >"$LOGS/check-ht-$name.log" 2>&1 || good=0
  fi
  if [ $good = 1 ]; then ok+=("$name"); else echo "== $name: FAILED its tests (logs in $LOGS), not timed"; fi
done

# Interleaved timing.
for round in $(seq 1 "$rounds"); do
  for name in "${ok[@]}"; do
    within_budget || break 2
    lib="$WORK/$name/build/lib"
    if [ $ll = 1 ]; then
      echo "== round $round $name: low latency"
      LD_LIBRARY_PATH="$lib" EP_CUDA_LL_TIMING=1 EP_DEBUG=INFO EP_DEBUG_SUBSYS=CUDA timeout 300 build/tests/ab_ll_test --bench 2>&1 |
        tee -a "$LOGS/ll-$name.log" | grep -E "kernel time|phase marks|graph without events" |
        sed -e 's/^.*EP INFO //' -e 's/low-latency //' -e 's/, mean [^,]*, p99/, p99/'
    fi
    if [ -n "$ht" ]; then
      echo "== round $round $name: high throughput"
      # shellcheck disable=SC2086
      LD_LIBRARY_PATH="$lib" timeout 400 build/tests/ab_bench $ht --no-nccl 2>&1 | tee -a "$LOGS/ht-$name.log" |
        grep -vE '^\{' | grep -E ' us '
    fi
  done
done
