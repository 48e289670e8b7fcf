#!/usr/bin/env bash
# Two host-backend ranks in different pid namespaces (rank 0 under
# `unshare --pid`), as in containers that share /dev/shm but not their pids:
# each rank's pid means nothing to the other, so neither may take the other
# for exited (before the ranks watched pids only within one namespace, rank 0
# reported "rank 1 (pid N) exited" at its first wait of a millisecond).
#   tests/mp/pid_namespace.sh BUILD_DIR
# Exit 0: both ranks passed ep_bench --check; 77: unshare is not permitted here.
set -u
B=${1:-build}
if ! unshare --pid --fork --mount-proc true 2>/dev/null; then
  echo "pid_namespace: unshare --pid is not permitted here"
  exit 77
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
port=$((20000 + RANDOM % 20000))
args=(--check --iters 20 --warmup 2 --shape 520:5:24:200)
export EP_COMM_ID=127.0.0.1:$port OMPI_COMM_WORLD_SIZE=2
OMPI_COMM_WORLD_RANK=0 unshare --pid --fork --mount-proc "$B/bin/ep_bench" "${args[@]}" >"$logs/0" 2>&1 &
pid0=$!
sleep 0.5  # rank 0 serves the bootstrap root
OMPI_COMM_WORLD_RANK=1 "$B/bin/ep_bench" "${args[@]}" >"$logs/1" 2>&1
rc1=$?
wait "$pid0"
rc0=$?
for r in 0 1; do
  echo "--- rank $r"
  tail -n 3 "$logs/$r"
done
echo "pid_namespace: rank 0 (own pid namespace) exit $rc0, rank 1 exit $rc1"
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ]
