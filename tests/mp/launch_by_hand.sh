#!/bin/bash
# Ranks started by hand with a launcher's rank variables and no job id share
# the unique id through a file; two such runs one right after another must
# not take the first run's id (its rank 0, the root, has exited) in the second.
#   tests/mp/launch_by_hand.sh BUILD
set -uo pipefail
BUILD=${1:-build}
unset OMPI_MCA_ess_base_jobid PMIX_NAMESPACE PMI_JOBID SLURM_JOB_ID EP_COMM_ID
for run in 1 2; do
  start=$(date +%s)
  OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 timeout 60 "$BUILD/bin/ep_bench" --shape 64:2:4:16 \
    --timeout-ms 5000 >/dev/null 2>&1 &
  other=$!
  OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 timeout 60 "$BUILD/bin/ep_bench" --shape 64:2:4:16 \
    --timeout-ms 5000 >/dev/null 2>&1
  rc0=$?
  wait $other
  rc1=$?
  echo "run $run: rank 0 exit $rc0, rank 1 exit $rc1 ($(( $(date +%s) - start )) s)"
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || exit 1
done
