# Shared by the guest jobs (sourced): checks that log their time and result.
# Each check's output goes to $OUT/NAME.log; "CHECK NAME: PASS|FAIL (S s)"
# lines go to the console and to $OUT/checks.$VM_NODE.
set -u
OUT=$JOB_DIR/out
mkdir -p "$OUT"
failures=0
CHECK=$BUILD/tests/ib_transport_check
# The ACK timeout: 4.096 us x 2^19 = 2.1 s. Shorter ones expire spuriously
# when the host is busy: a TCG VM whose qemu is not scheduled for seconds does
# not answer (seen with 2^18 x 6 retries on 2 loaded cores; 2^14 = 67 ms was
# worse still, and rxe's retransmissions then went wrong: remote access and
# invalid request errors). A dead peer whose packets go unanswered shows after
# 6 retries, about 13 s; rxe often refuses them at once instead.
export EP_IB_TIMEOUT=19
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc | awk '{printf "%.1f", $1}'; }
check() {  # check NAME [VAR=VALUE...] CMD...: CMD may be a function of these scripts
  local name=$1 t0 r
  shift
  [[ -n "${RDMA_ONLY:-}" && ! "$name" =~ $RDMA_ONLY ]] && return 0
  t0=$(now)
  if (while [[ "$1" == [A-Z]*=* ]]; do export "$1"; shift; done; "$@") >"$OUT/$name.log" 2>&1; then
    r=PASS
  else
    r=FAIL
    failures=$((failures + 1))
  fi
  echo "CHECK $name: $r ($(since "$t0") s)" | tee -a "$OUT/checks.$VM_NODE"
  [ $r = FAIL ] && tail -n 15 "$OUT/$name.log" | sed 's/^/    /'
  return 0
}
# ranks R... of ib_transport_check in this VM (N in all), rendezvous in DIR:
#   driver DIR N "R1 R2" [ARGS...]; EP_IB_FAULT_RANK=R gives rank R $EP_IB_FAULT_SPEC,
#   NO_CHANNEL_RANK=R gives rank R EP_IB_COMPLETION_CHANNEL=0
driver() {
  local dir=$JOB_DIR/$1 n=$2 ranks=$3 pids=() rc=0 r
  shift 3
  mkdir -p "$dir"
  for r in $ranks; do
    local vars=()
    [ "${EP_IB_FAULT_RANK:-x}" = "$r" ] && vars+=("EP_IB_FAULT=$EP_IB_FAULT_SPEC")
    [ "${NO_CHANNEL_RANK:-x}" = "$r" ] && vars+=("EP_IB_COMPLETION_CHANNEL=0")
    env "${vars[@]}" timeout 150 "$CHECK" --rank "$r" --nranks "$n" --dir "$dir" "$@" >"$dir/r$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cat "$dir"/r*.log
  return $rc
}
# The library's ranks of this VM (two VMs: ranks 2N-2 and 2N-1 here), rank
# 0's bootstrap at 10.77.0.1.
ranks() {  # ranks PORT N "R..." CMD...: launcher variables for each rank here
  local port=$1 n=$2 list=$3 pids=() rc=0 r
  shift 3
  for r in $list; do
    EP_COMM_ID=10.77.0.1:$port OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$n timeout "${RANKS_TIMEOUT:-200}" "$@" \
      >"$OUT/rank$r.$port.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cat "$OUT"/rank*."$port".log
  return $rc
}
