# Two VMs whose link runs through tests/rdma/relay.py (vm_run.sh -r), which
# drops every frame for as long as a VM asks (JOB/outage, in ms):
#  - an outage shorter than the QPs' retry window is survived: a soak of
#    checked rounds runs through it, nothing lost or duplicated;
#  - a longer one ends, on every rank, in an error naming another rank within
#    the bound (a rank may hear first that a rank beside it failed), at least
#    one rank of each VM naming a rank of the other VM and the link's cause,
#    and the communicator is then destroyed with no verbs object left.
# The retry window: 4.096 us x 2^19 = 2.1 s a try, ib_retry_cnt 6 (rxe: 7
# retries for ever) + 1 tries, about 15 s.
. "$MOEEP_ROOT/tests/rdma/guest_lib.sh"
first=$(( (VM_NODE - 1) * 2 ))
mine="$first $((first + 1))"
export EP_HOST_ID=vm$VM_NODE EP_COMM_SECRET=rdma-vm-test EP_IB_TIMEOUT=19 EP_IB_RETRY_CNT=6
WINDOW=15 LONG_BOUND=40
cs() { local up; read -r up _ </proc/uptime; echo $(( ${up%.*} * 100 + 10#${up#*.} )); }

# outage_after SECONDS MS NAME: VM 1 asks the relay for an outage of MS ms
# once SECONDS passed (the ranks are then in their calls); its start time goes
# to $OUT/outage.NAME (centiseconds of this VM's uptime).
outage_after() {
  [ "$VM_NODE" = 1 ] || return 0
  sleep "$1"
  cs >"$OUT/outage.$3"
  echo "$2 $3" >"$JOB_DIR/outage.tmp" && mv "$JOB_DIR/outage.tmp" "$JOB_DIR/outage"  # whole, or not at all
}

short_outage() {
  outage_after 8 1500 short &
  ranks 29601 4 "$mine" "$BUILD/tests/mp_dispatch" --soak 150 --warmup 10
  local rc=$?
  wait
  if [ "$VM_NODE" = 1 ]; then
    sleep 1
    cat "$JOB_DIR/relay.log"
    # The outage happened, and during traffic.
    grep -A1 '^outage short of' "$JOB_DIR/relay.log" | grep -Eq 'outage over at .*: [1-9][0-9]* frames dropped' ||
      { echo "no frame dropped"; rc=1; }
  fi
  return $rc
}

# Each rank's first error line, timed from the outage's start; the bound is
# the retry window and the time to tell the others.
long_outage() {
  local port=29602 pids=() r
  # A rank's first error: its own link's, or a peer of its node that failed
  # first and left the call (that rank's error names the link's cause; at
  # least one rank per VM must, below).
  local failure="(failed|timeout|remote|left the call|exited)"
  outage_after 8 $(( (WINDOW + 30) * 1000 )) long &
  local asker=$!
  for r in $mine; do
    EP_COMM_ID=10.77.0.1:$port OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=4 timeout 150 \
      "$BUILD/tests/mp_dispatch" --soak 100000 --warmup 5 >"$OUT/long$r.log" 2>&1 &
    pids+=($!)
  done
  local seen=() t0=0 end
  for r in $mine; do seen[$r]=0; done
  # VM 2 times from when the relay's log (in the job folder both VMs see)
  # says the outage began: within 0.1 s of its start.
  local give_up=$(( $(cs) + 6000 ))
  while [ "$t0" = 0 ]; do
    [ "$(cs)" -lt "$give_up" ] || { echo "the outage never began"; kill "${pids[@]}" 2>/dev/null; return 1; }
    if [ "$VM_NODE" = 1 ] && [ -s "$OUT/outage.long" ]; then t0=$(<"$OUT/outage.long"); fi
    if [ "$VM_NODE" = 2 ] && grep -q '^outage long of' "$JOB_DIR/relay.log" 2>/dev/null; then t0=$(cs); fi
    sleep 0.1
  done
  end=$((t0 + (LONG_BOUND + 5) * 100))
  local pending=1
  while [ "$(cs)" -lt "$end" ] && [ "$pending" = 1 ]; do
    pending=0
    for r in $mine; do
      if [ "${seen[$r]}" = 0 ]; then
        if grep -Eq "^rank $r: .*$failure" "$OUT/long$r.log"; then seen[$r]=$(cs); else pending=1; fi
      fi
    done
    sleep 0.1
  done
  for p in "${pids[@]}"; do wait "$p"; done
  wait "$asker"
  local ok=0 n=0 cause=0
  for r in $mine; do
    n=$((n + 1))
    local line took others
    line=$(grep -Em1 "^rank $r: .*$failure" "$OUT/long$r.log")
    if [ "${seen[$r]}" = 0 ]; then echo "rank $r: no error within $((LONG_BOUND + 5)) s"; tail -5 "$OUT/long$r.log"; continue; fi
    took=$(( seen[r] - t0 ))
    echo "rank $r: error after $((took / 100)).$(printf '%02d' $((took % 100))) s: $line"
    echo "LINK rank $r: $((took / 100)).$(printf '%02d' $((took % 100))) s" >>"$OUT/times.$VM_NODE"
    [ "$VM_NODE" = 1 ] && others="2|3" || others="0|1"
    grep -m1 'verbs objects after destroy' "$OUT/long$r.log"
    local named=${line#"rank $r: "}
    if [ "$took" -lt $((LONG_BOUND * 100)) ] && [[ "$named" =~ rank\ [0-9]+ ]] &&
       grep -q "soak rank $r: 0 verbs objects after destroy" "$OUT/long$r.log"; then
      ok=$((ok + 1))
    fi
    [[ "$line" =~ rank\ ($others)[^0-9] && "$line" == *"retry counter exceeded"* ]] && cause=1
  done
  [ "$cause" = 1 ] || echo "no rank here named a rank of the other VM and the link's cause"
  [ "$ok" = "$n" ] && [ "$cause" = 1 ]
}

check link_outage_1500ms_survived_$VM_NODE short_outage
check link_outage_45s_named_$VM_NODE long_outage
exit $((failures > 100 ? 100 : failures))
