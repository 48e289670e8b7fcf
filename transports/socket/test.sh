#!/usr/bin/env bash
# The socket transport's tests (tests/run_all.sh runs this; exit 77: skipped,
# the last line says why). Everything over loopback (EP_SOCKET_IFNAME=lo).
#   1. socket_transport_test: the module alone, two processes (ordering on 1
#      and 3 streams, killed peers, goodbye, bad endpoints, bandwidth beside
#      plain TCP)
#   2. the host backend across nodes faked on this machine (EP_NODE_SIZE=2)
#      over the socket module: mp_dispatch on 2 nodes x 2 and 4 nodes x 2,
#      ep_bench --check (high throughput and low latency), and tiny buffers
#      (EP_BUFFER_BYTES_CAP) so that the rings wrap many times; each run's log
#      must show that ranks on other nodes went through socket; mp_errors
#      cases with every rank a node (a rank that exits is named by socket);
#      low-latency and high-throughput calls interleaved (mp_lowlat
#      --interleave-ht); the staged path of GPU ranks across nodes
#      (EP_TEST_STAGED=1); connections per traffic class; the QP budget
# Builds nothing: `make` (or `make modules tests tools`) first.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.."
need=("$BUILD/lib/libmoeep-transport-socket.so" "$BUILD/tests/socket_transport_test" "$BUILD/tests/mp_dispatch"
      "$BUILD/bin/ep_bench")
for f in "${need[@]}"; do
  [ -x "$f" ] || { echo "SKIPPED: $f is not built (run make first)"; exit 77; }
done
if ! grep -q '^ *lo:' /proc/net/dev; then echo "SKIPPED: no loopback interface"; exit 77; fi

export EP_SOCKET_IFNAME=lo
passed=0; failed=0
log=$(mktemp)
notes=$(mktemp)  # each failed check's name and last lines, printed again at the end
trap 'rm -f "$log" "$notes"' EXIT
note_failure() {  # note_failure NAME [LOG]
  { echo "--- socket: $1 failed"; [ -n "${2:-}" ] && tail -15 "$2"; } >>"$notes"
}

run() {  # run NAME CMD...: the module's own test program
  local name=$1; shift
  echo "=== socket: $name: $*"
  local start=$SECONDS
  if timeout 120 "$@"; then passed=$((passed + 1)); echo "=== socket: $name: PASSED ($((SECONDS - start)) s)"
  else failed=$((failed + 1)); note_failure "$name"; echo "=== socket: $name: FAILED ($((SECONDS - start)) s)"; fi
}

# across NAME RANKS CMD...: the host backend with nodes of NODE ranks (2
# unless set), the socket module between them; passes when CMD passes, every
# rank's log says that it reached the other nodes through socket, and the
# log matches EXPECT (an extended regular expression, when set).
across() {
  local name=$1 ranks=$2; shift 2
  local node=${NODE:-2} expect=${EXPECT:-}
  echo "=== socket: $name: EP_NODE_SIZE=$node $*"
  local start=$SECONDS rc
  EP_TRANSPORTS=shm,socket EP_NODE_SIZE=$node EP_DEBUG=INFO EP_DEBUG_SUBSYS=INIT,TRANSPORT timeout 300 "$@" >"$log" 2>&1
  rc=$?
  local through connected
  through=$(grep -c 'ranks on other nodes through socket' "$log")
  connected=$(grep -c 'transport socket: rank [0-9]*: connected to rank' "$log")
  grep -E 'passed|all checks|FAIL|WARN' "$log" | grep -v 'transport .* (ABI' | sort | uniq -c | sed 's/^/    /' | head -12
  echo "    logs: $through lines 'through socket', $connected socket connections made"
  if [ -n "$expect" ] && ! grep -qE -- "$expect" "$log"; then echo "    the log lacks: $expect"; rc=99; fi
  if [ $rc -eq 0 ] && [ "$through" -ge "$ranks" ] && [ "$connected" -ge "$ranks" ]; then
    passed=$((passed + 1)); echo "=== socket: $name: PASSED ($((SECONDS - start)) s)"
  else
    tail -20 "$log"; failed=$((failed + 1)); note_failure "$name (exit $rc)" "$log"
    echo "=== socket: $name: FAILED (exit $rc, $((SECONDS - start)) s)"
  fi
}

run "module alone (order, killed, goodbye, endpoint)" "$BUILD/tests/socket_transport_test"
run "bandwidth beside plain TCP (117 MB, 5 runs)" "$BUILD/tests/socket_transport_test" --case bench --runs 5

across "mp_dispatch 2 nodes x 2" 4 "$BUILD/tests/mp_dispatch" -n 4 --cases 10 --seed 4204
across "mp_dispatch 4 nodes x 2" 8 "$BUILD/tests/mp_dispatch" -n 8 --cases 5 --seed 4208
across "mp_dispatch 4 threads (epCommInitAll), 2 nodes x 2" 4 "$BUILD/tests/mp_dispatch" -n 4 --threads --cases 4
across "ep_bench 2 nodes x 2 --check" 4 "$BUILD/bin/ep_bench" -n 4 --check --iters 2 --warmup 1 \
  --shape 520:5:24:200 --shape 7168:8:64:64
across "ep_bench 2 nodes x 2 --mode ll --check (fp8)" 4 "$BUILD/bin/ep_bench" -n 4 --mode ll --check \
  --iters 2 --warmup 1 --shape 7168:8:288:16 --shape 2064:5:12:37
across "ep_bench 2 nodes x 2 --mode ll --check (bf16, --split)" 4 "$BUILD/bin/ep_bench" -n 4 --mode ll \
  --type bf16 --split --check --iters 2 --warmup 1 --shape 2056:5:12:37
# Rings of 1 to 4 records (the cap shrinks chunks, then slots): they wrap on every few tokens.
across "mp_dispatch 2 nodes x 2, EP_BUFFER_BYTES_CAP=400000" 4 env EP_BUFFER_BYTES_CAP=400000 \
  "$BUILD/tests/mp_dispatch" -n 4 --cases 6 --seed 4304
across "mp_dispatch 4 nodes x 2, EP_BUFFER_BYTES_CAP=900000" 8 env EP_BUFFER_BYTES_CAP=900000 \
  "$BUILD/tests/mp_dispatch" -n 8 --cases 3 --seed 4308
across "ep_bench --mode ll 2 nodes x 2, EP_BUFFER_BYTES_CAP=600000" 4 env EP_BUFFER_BYTES_CAP=600000 \
  "$BUILD/bin/ep_bench" -n 4 --mode ll --check --iters 2 --warmup 1 --shape 7168:8:288:16

# Low-latency and high-throughput calls interleaved on one communicator: the
# rings change connection (traffic class) at each switch, which is safe only
# once the old connection's chunks were taken (a test that failed with that
# wait removed). Tiny buffers: every ring wraps.
across "mp_lowlat 2 nodes x 2 --interleave-ht, EP_BUFFER_BYTES_CAP=400000" 4 env EP_BUFFER_BYTES_CAP=400000 \
  "$BUILD/tests/mp_lowlat" -n 4 --cases 8 --seed 71 --interleave-ht
across "mp_lowlat 4 nodes x 2 --interleave-ht" 8 "$BUILD/tests/mp_lowlat" -n 8 --cases 4 --seed 72 --interleave-ht
# epCommShrink across nodes: rank 1 dies; the socket transport forgets it
# (drop_peer) and the survivors' layers, low latency and high throughput (a
# dead rail peer's substitute forwarding), match the reference without it.
# --rounds-after 40: then 40 checked layers, nothing growing, the dead
# rank's connections closed on the other node. --shrink-first-ll: no
# low-latency call before the death (the class was connected at init:
# config.enable_shrink).
across "mp_lowlat 2 nodes x 2, a rank dies, the survivors shrink" 4 "$BUILD/tests/mp_lowlat" -n 4 --cases 2 \
  --seed 73 --shrink --rounds-after 40
NODE=1 across "mp_lowlat 5 ranks a node each, a rank dies, the survivors shrink" 5 "$BUILD/tests/mp_lowlat" -n 5 \
  --cases 1 --seed 74 --shrink
# A rank that hangs (SIGSTOP: its sockets stay open) instead of dying: the
# survivors' call ends at their timeout (6 s), the shrink finds it silent
# (its recovery listener never answers) and decides it dead.
across "mp_lowlat 2 nodes x 2, a rank hangs, the survivors shrink" 4 "$BUILD/tests/mp_lowlat" -n 4 --cases 1 \
  --seed 79 --shrink-hang
across "mp_lowlat 2 nodes x 2, one begins a shrink while the others wait" 4 "$BUILD/tests/mp_lowlat" -n 4 --cases 1 \
  --seed 76 --shrink-notice
across "mp_lowlat 2 nodes x 2, a rank dies before any low-latency call" 4 "$BUILD/tests/mp_lowlat" -n 4 --cases 1 \
  --seed 77 --shrink-first-ll
# Two deaths one after the other, two shrinks: rank 1 (rank 3's rail peer on
# node 0: rank 0 substitutes), then rank 5 (the last of node 2).
across "mp_lowlat 3 nodes x 2, two ranks die one after the other" 6 "$BUILD/tests/mp_lowlat" -n 6 --cases 1 \
  --seed 80 --shrink-twice
# Two connections (streams) per peer and class: each call ends once its peers
# took its last chunks (what a transport may post only at a later progress).
across "mp_lowlat 2 nodes x 2 --interleave-ht, EP_IB_QPS_PER_PEER=2" 4 env EP_IB_QPS_PER_PEER=2 \
  "$BUILD/tests/mp_lowlat" -n 4 --cases 6 --seed 81 --interleave-ht

# The staged path (GPU ranks on different nodes, src/host/staged.cc) without a
# GPU: EP_TEST_STAGED=1 stages every call's buffers through copies of their
# exact size; every output is checked as above.
EXPECT='ready: host_staged backend' across "mp_dispatch 2 nodes x 2 through staging (EP_TEST_STAGED=1)" 4 \
  env EP_TEST_STAGED=1 "$BUILD/tests/mp_dispatch" -n 4 --cases 10 --seed 4504
EXPECT='ready: host_staged backend' across "mp_lowlat 2 nodes x 2 through staging (EP_TEST_STAGED=1)" 4 \
  env EP_TEST_STAGED=1 "$BUILD/tests/mp_lowlat" -n 4 --cases 8 --seed 4505
# epCommShrink on the staged path (GPUs across nodes delegate it to the host
# backend inside): rank 1 dies, the survivors shrink, the layers after match
# the reference without it.
EXPECT='ready: host_staged backend' across "mp_lowlat 2 nodes x 2 through staging, a rank dies, the survivors shrink" \
  4 env EP_TEST_STAGED=1 "$BUILD/tests/mp_lowlat" -n 4 --cases 2 --seed 4507 --shrink --rounds-after 10
EXPECT='ready: host_staged backend' across "ep_bench --mode ll --split --check through staging" 4 \
  env EP_TEST_STAGED=1 "$BUILD/bin/ep_bench" -n 4 --mode ll --split --check --iters 2 --warmup 1 \
  --shape 7168:8:288:16 --shape 2064:5:12:37

# A soak: one communicator, 400 rounds each checked; descriptors and threads
# the same after the warm-up, resident memory within 4 MiB (docs/BENCHMARKS.md
# has the 10,000-round run).
EXPECT='soak rank 3: 400 rounds' across "mp_dispatch --soak 400, 2 nodes x 2" 4 \
  "$BUILD/tests/mp_dispatch" -n 4 --soak 400 --warmup 20

# The QP budget (docs/TOPOLOGY.md, "Queue pairs"): 4 nodes x 2 give each rank
# 6 ranks on other nodes, 3 of them its rail peers. mp_dispatch leaves
# config.low_latency at 0, so no low-latency QP can be made: throughput 3 x 1
# + control 6 x 1 = 9 QPs (stream sets). A budget of 9 runs, one of 8 is
# refused at init by every rank, naming the numbers. The run connects each
# class to whom it should: throughput to the 3 rail peers, control to all 6,
# low latency to none.
across "mp_dispatch 4 nodes x 2, EP_IB_QP_BUDGET=9 (= the count)" 8 env EP_IB_QP_BUDGET=9 \
  "$BUILD/tests/mp_dispatch" -n 8 --cases 1 --seed 4408
classes=$(for c in 0 1 2; do grep -c "connected to rank .*, class $c:" "$log"; done | tr '\n' ' ')
echo "=== socket: connections per class (throughput, low latency, control) of 8 ranks: $classes(want 24 0 48)"
if [ "$classes" = "24 0 48 " ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); note_failure "connections per class: $classes, not 24 0 48"; fi
echo "=== socket: EP_IB_QP_BUDGET=8 refused at init"
start=$SECONDS
EP_TRANSPORTS=shm,socket EP_NODE_SIZE=2 EP_IB_QP_BUDGET=8 timeout 120 "$BUILD/tests/mp_dispatch" -n 8 --cases 1 \
  >"$log" 2>&1
rc=$?
refusals=$(grep -c 'would open 9 queue pairs (throughput 3 peers x 1, low latency 0 x 1 (config.low_latency = 0), control 6 x 1), more than ib_qp_budget = 8' "$log")
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$refusals" -eq 8 ]; then
  passed=$((passed + 1)); echo "=== socket: EP_IB_QP_BUDGET=8 refused at init: PASSED ($((SECONDS - start)) s)"
else
  tail -20 "$log"; failed=$((failed + 1)); note_failure "EP_IB_QP_BUDGET=8 refused at init (exit $rc)" "$log"
  echo "=== socket: EP_IB_QP_BUDGET=8 refused at init: FAILED (exit $rc, $refusals of 8 ranks named the budget)"
fi
# With config.low_latency (ep_bench --mode ll), the low-latency QPs count
# although made later: 2 nodes x 2 give 1 x 1 + 2 x 1 + 2 x 1 = 5; 4 is refused.
echo "=== socket: EP_IB_QP_BUDGET=4 with config.low_latency refused at init"
EP_TRANSPORTS=shm,socket EP_NODE_SIZE=2 EP_IB_QP_BUDGET=4 timeout 120 "$BUILD/bin/ep_bench" -n 4 --mode ll \
  --iters 1 --warmup 0 --shape 2064:5:12:37 >"$log" 2>&1
rc=$?
refusals=$(grep -c 'would open 5 queue pairs (throughput 1 peers x 1, low latency 2 x 1, control 2 x 1), more than ib_qp_budget = 4' "$log")
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$refusals" -ge 4 ]; then
  passed=$((passed + 1)); echo "=== socket: EP_IB_QP_BUDGET=4 with config.low_latency refused: PASSED"
else
  tail -20 "$log"; failed=$((failed + 1)); note_failure "EP_IB_QP_BUDGET=4 with low latency (exit $rc)" "$log"
  echo "=== socket: EP_IB_QP_BUDGET=4 with config.low_latency refused: FAILED (exit $rc, $refusals ranks named it)"
fi

# Low-latency calls connect their class at the first call, to every rank on
# another node (2 x 2 ranks: 2 each), and only then: of ep_bench's two
# communicators (the one of the timed calls, and the one its barriers run on), only the one that
# makes low-latency calls opens them. Connections in all: throughput 4 x 1 per
# communicator, control 4 x 2, low latency 4 x 2 once.
across "ep_bench 2 nodes x 2 --mode ll, one shape: low-latency connections at the first call" 4 \
  "$BUILD/bin/ep_bench" -n 4 --mode ll --check --iters 1 --warmup 0 --shape 2064:5:12:37
classes=$(for c in 0 1 2; do grep -c "connected to rank .*, class $c:" "$log"; done | tr '\n' ' ')
lazy=$(grep -c 'connected its low-latency class to 2 ranks on other nodes' "$log")
echo "=== socket: low-latency run: connections per class $classes(want 8 8 16); $lazy ranks (want 4) connected" \
  "low latency at a call"
if [ "$classes" = "8 8 16 " ] && [ "$lazy" -eq 4 ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); note_failure "low-latency connections: $classes, $lazy ranks, not 8 8 16 and 4"; fi
# EP_TRANSPORTS=socket alone chooses TCP between nodes and keeps shm inside
# them; a network transport named but unavailable is an error, never a quiet
# fall-back (ibverbs: no RDMA device on the machines that run this).
across "mp_dispatch 2 nodes x 2, EP_TRANSPORTS=socket alone" 4 env EP_TRANSPORTS=socket \
  "$BUILD/tests/mp_dispatch" -n 4 --cases 2 --seed 4412
if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  echo "=== socket: EP_TRANSPORTS=ibverbs without a device: SKIPPED (this machine has an RDMA device)"
elif [ ! -f "$BUILD/lib/libmoeep-transport-ibverbs.so" ]; then
  echo "=== socket: EP_TRANSPORTS=ibverbs without a device: SKIPPED (the ibverbs module is not built)"
else
  echo "=== socket: EP_TRANSPORTS=ibverbs without a device refused"
  start=$SECONDS
  EP_TRANSPORTS=ibverbs EP_NODE_SIZE=2 timeout 120 "$BUILD/tests/mp_dispatch" -n 4 --cases 1 >"$log" 2>&1
  rc=$?
  named=$(grep -c 'EP_TRANSPORTS names ibverbs for the ranks on other nodes, and it is unavailable here' "$log")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$named" -eq 4 ]; then
    passed=$((passed + 1)); echo "=== socket: EP_TRANSPORTS=ibverbs without a device refused: PASSED ($((SECONDS - start)) s)"
  else
    tail -20 "$log"; failed=$((failed + 1)); note_failure "EP_TRANSPORTS=ibverbs without a device (exit $rc)" "$log"
    echo "=== socket: EP_TRANSPORTS=ibverbs without a device refused: FAILED (exit $rc, $named of 4 ranks said why)"
  fi
fi

# Errors across nodes (every rank a node of its own): a rank that exits in
# a call is named, by the socket's error or by the core's check of its pid,
# whichever comes first; the others end as they do over shm.
# Which words the socket says depends on the moment rank 1 exits: "closed the
# connection" (its socket was empty), "connection error (Connection reset by
# peer)" (rank 0's counts were unread in it), or a send's "Broken pipe"; each
# adds "its process exited or failed".
NODE=1 EXPECT='over socket: rank 1 \(127\.0\.0\.1:[0-9]+\): .*its process exited or failed|rank 1 \(pid [0-9]+\) exited' across "mp_errors rank-exits, a node per rank" 2 \
  "$BUILD/tests/mp_errors" --only rank-exits
for sc in abort rank-skips-call order-mismatch ll-first-out-of-step; do
  NODE=1 across "mp_errors $sc, a node per rank" 2 "$BUILD/tests/mp_errors" --only "$sc"
done
# The waiting rank sleeps in the transport's wait (its I/O thread wakes it):
# at most 5% of a core; napping between looks, as with a transport without a
# wait (EP_NET_WAIT=0), about 9%.
NODE=1 across "mp_errors late-peer-idle, a node per rank" 2 env MP_IDLE_CPU_MAX=0.05 "$BUILD/tests/mp_errors" \
  --only late-peer-idle
# The same faults through the staged path (what GPU ranks on different nodes run).
for sc in rank-exits abort; do
  NODE=1 across "mp_errors $sc, a node per rank, staged" 2 env EP_TEST_STAGED=1 "$BUILD/tests/mp_errors" --only "$sc"
done

cat "$notes"
echo "socket transport: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
