#!/bin/bash
# The launcher's variables the tools read (tools/common/launcher_env.h): a
# rank without a job size, or values that are no rank / size, are refused
# with a message naming the variables, by ep_bench (which forked its own ranks
# before) and by moeep_info (whose ranks above 0 exited silently).
#   tests/mp/launcher_env.sh BUILD
set -uo pipefail
BUILD=${1:-build}
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK PMI_SIZE SLURM_NTASKS EP_COMM_ID
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fails=0

# expect_refusal TEXT VAR=VALUE... -- CMD...: CMD fails, and says TEXT on stderr.
expect_refusal() {
  local text=$1; shift
  local vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  env "${vars[@]}" timeout 60 "$@" >/dev/null 2>"$out"
  local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -qF -- "$text" "$out"; then
    echo "FAIL: ${vars[*]} $*: exit $rc, wanted a refusal saying '$text'; stderr:"; cat "$out"
    fails=$((fails + 1))
  else
    echo "ok: ${vars[*]} $(basename "$1"): $(head -n 1 "$out")"
  fi
}

bench=("$BUILD/bin/ep_bench" -n 2 --shape 64:2:4:16 --iters 1 --warmup 0)
expect_refusal "no job size is (OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS)" PMIX_RANK=1 -- "${bench[@]}"
expect_refusal "PMI_RANK=0 is set but no job size" PMI_RANK=0 -- "${bench[@]}"
expect_refusal "no job size" PMIX_RANK=1 -- "$BUILD/bin/moeep_info" -v
expect_refusal "OMPI_COMM_WORLD_RANK='-1' is not a rank" OMPI_COMM_WORLD_RANK=-1 OMPI_COMM_WORLD_SIZE=2 \
  -- "${bench[@]}"
expect_refusal "OMPI_COMM_WORLD_RANK='1x' is not a rank" OMPI_COMM_WORLD_RANK=1x OMPI_COMM_WORLD_SIZE=2 \
  -- "${bench[@]}"
expect_refusal "OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2" OMPI_COMM_WORLD_RANK=2 \
  OMPI_COMM_WORLD_SIZE=2 -- "${bench[@]}"
expect_refusal "PMI_SIZE='0' is not a job size" PMI_RANK=0 PMI_SIZE=0 -- "${bench[@]}"
expect_refusal "is not below SLURM_NTASKS=1" PMIX_RANK=1 SLURM_NTASKS=1 -- "$BUILD/bin/moeep_info" -v
[ "$fails" -eq 0 ]
