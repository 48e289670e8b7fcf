#!/bin/bash
# Ranks started by hand with a launcher's rank variables and no job id share
# the unique id through a file; two such runs one right after another must
# not take the first run's id (its rank 0, the root, has exited) in the second.
# Then the id file itself: mode 0600, removed after the run, a rename that
# fails is reported.
#   tests/mp/launch_by_hand.sh BUILD
set -uo pipefail
BUILD=${1:-build}
unset OMPI_MCA_ess_base_jobid PMIX_NAMESPACE PMI_JOBID SLURM_JOB_ID EP_COMM_ID
# Rank $1 of 2 of a small ep_bench run, with Open MPI's rank variables;
# TIMEOUT seconds at most (default 60); output to the caller's redirections.
bench_rank() {
  OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=2 timeout "${TIMEOUT:-60}" "$BUILD/bin/ep_bench" \
    --shape 64:2:4:16 --timeout-ms 5000
}
for run in 1 2; do
  start=$(date +%s)
  bench_rank 1 >/dev/null 2>&1 &
  other=$!
  bench_rank 0 >/dev/null 2>&1
  rc0=$?
  wait $other
  rc1=$?
  echo "run $run: rank 0 exit $rc0, rank 1 exit $rc1 ($(( $(date +%s) - start )) s)"
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || exit 1
done

# The id file, under a job id of this test's own: readable by its user only
# while rank 0 waits for rank 1, gone once both joined.
export OMPI_MCA_ess_base_jobid=by-hand-$$
idfile=/tmp/moeep-launch-by-hand-$$-$(id -u).id
trap 'rm -rf "$idfile" "$idfile.tmp"' EXIT
bench_rank 0 >/dev/null 2>&1 &
root=$!
for _ in $(seq 200); do [ -e "$idfile" ] && break; sleep 0.05; done
mode=$(stat -c %a "$idfile" 2>/dev/null)
bench_rank 1 >/dev/null 2>&1
rc1=$?
wait $root
rc0=$?
echo "id file: mode ${mode:-none} while rank 0 waited; ranks exit $rc0, $rc1"
[ "$mode" = 600 ] && [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || exit 1
[ ! -e "$idfile" ] || { echo "id file $idfile left after the run"; exit 1; }

# An id file that cannot be put in place (a directory has its name) fails
# rank 0 at once with the reason; its peers would have waited for it in vain.
mkdir "$idfile"
start=$(date +%s)
msg=$(TIMEOUT=30 bench_rank 0 2>&1 >/dev/null)
rc0=$?
echo "id file name taken by a directory: rank 0 exit $rc0 ($(( $(date +%s) - start )) s): $msg"
[ "$rc0" -ne 0 ] && [ "$rc0" -ne 124 ] && [[ "$msg" == *"cannot rename"* ]] || exit 1
