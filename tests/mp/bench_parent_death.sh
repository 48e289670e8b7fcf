#!/bin/bash
# The ranks ep_bench forks end with it: a SIGTERM to the launcher alone (a
# job manager's kill of the PID it started, not of the process group) must not
# leave its ranks running, re-parented to init, with nobody to wait for them.
#   tests/mp/bench_parent_death.sh BUILD
set -uo pipefail
BUILD=${1:-build}
# Long enough to be running when the launcher is killed (minutes when it is not).
"$BUILD/bin/ep_bench" -n 2 --shape 1024:4:8:1024 --warmup 0 --iters 1000000 >/dev/null 2>&1 &
parent=$!
ranks=()
for _ in $(seq 1 200); do  # up to 20 s for the ranks to start
  mapfile -t kids < <(pgrep -P "$parent")
  [ "${#kids[@]}" -ge 2 ] && { ranks=("${kids[@]}"); break; }
  sleep 0.1
done
if [ "${#ranks[@]}" -lt 2 ]; then
  echo "FAIL: the ranks of ep_bench (pid $parent) did not start"
  kill -KILL "$parent" 2>/dev/null
  exit 1
fi
sleep 1
kill -TERM "$parent"
wait "$parent" 2>/dev/null
left=()
for _ in $(seq 1 100); do  # up to 10 s for the ranks to go
  left=()
  for p in "${ranks[@]}"; do
    # Only ep_bench processes count: a pid may have been reused.
    if [ "$(ps -o comm= -p "$p" 2>/dev/null)" = ep_bench ]; then left+=("$p"); fi
  done
  [ "${#left[@]}" -eq 0 ] && break
  sleep 0.1
done
if [ "${#left[@]}" -ne 0 ]; then
  echo "FAIL: ranks ${left[*]} still running after their launcher $parent was killed"
  kill -KILL "${left[@]}" 2>/dev/null
  exit 1
fi
echo "ok: the ranks (${ranks[*]}) ended with their launcher"
