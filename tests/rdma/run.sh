#!/usr/bin/env bash
# The ibverbs transport on real verbs: Soft-RoCE (rdma_rxe) in small qemu VMs
# booted from Debian's kernel, the host's / mounted read-only inside.
#   tests/rdma/run.sh [loopback|pair|links|all]      (default all)
#   loopback: one VM (frames loop back in rxe): the module's checks, its
#             faults, the library's ranks as nodes of their own
#   pair:     two VMs (two nodes): the module's checks and the library's ranks
#             across the link, the DSCP of each traffic class in a capture of
#             the link, a rank killed mid-call
#   links:    two VMs whose link a relay on this machine cuts: an outage
#             shorter than the retry window survived, a longer one named
# Exit 0: passed; 1: failed; 77: cannot run here (the last line says why).
# BUILD (default build) holds the library, the module and the test programs;
# RDMA_VM_WORK (default /tmp/moeep-rdma-vm) the kernel and the job folders.
# RDMA_ONLY=REGEX runs only the checks whose names match.
# RDMA_SOAK_ROUNDS=N: rounds of the pair soak (default 100; the VMs do about
# 4 a second).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BUILD=$(cd "${BUILD:-build}" 2>/dev/null && pwd) || { echo "no build folder: run make first"; exit 77; }
W=${RDMA_VM_WORK:-/tmp/moeep-rdma-vm}
what=${1:-all}
skip() { echo "$1"; exit 77; }
for f in lib/libmoeep-transport-ibverbs.so tests/ib_transport_check bin/ep_bench bin/moeep_info tests/mp_dispatch tests/mp_errors tests/mp_lowlat; do
  [ -e "$BUILD/$f" ] || skip "$BUILD/$f not built (the ibverbs module needs libibverbs-dev and librdmacm-dev: scripts/install-deps.sh)"
done
command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64 (scripts/install-deps.sh --rdma)"
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || ls /usr/lib/*/libibverbs/librxe-* >/dev/null 2>&1 ||
  skip "no rxe provider for libibverbs (ibverbs-providers; scripts/install-deps.sh --rdma)"
start=$(date +%s.%N)
"$ROOT/tests/rdma/vm_image.sh" "$W"
rc=$?
[ $rc = 0 ] || exit $rc
image_s=$(echo "$(date +%s.%N) - $start" | bc)

mkdir -p "$W/jobs"
: >"$W/jobs/failed.$$"
status=0
stage() {  # stage NAME VMS [vm_run options]: runs tests/rdma/guest_NAME.sh in each VM
  local name=$1 vms=$2 job t0 rc
  shift 2
  job=$(mktemp -d "$W/jobs/$name.XXXXXX")
  printf 'export MOEEP_ROOT=%q BUILD=%q JOB_DIR=%q RDMA_ONLY=%q RDMA_SOAK_ROUNDS=%q\n' "$ROOT" "$BUILD" "$job" \
    "${RDMA_ONLY:-}" "${RDMA_SOAK_ROUNDS:-100}" >"$job/env"
  printf 'exec /bin/bash %q\n' "$ROOT/tests/rdma/guest_$name.sh" >"$job/job.sh"
  t0=$(date +%s.%N)
  "$ROOT/tests/rdma/vm_run.sh" -n "$vms" "$@" "$job"
  rc=$?
  local took
  took=$(echo "$(date +%s.%N) - $t0" | bc)
  grep -ah "^CHECK\|^    " "$job"/console.*.log | tr -d '\r' | tee "$job/checks.txt"
  # Kept for the summary at the end: a failure's lines are far above the
  # last lines a caller may keep of this output.
  awk '/^CHECK .*: FAIL/ {keep = 1; print; next} /^CHECK / {keep = 0} keep && /^    / {print}' \
    "$job/checks.txt" >>"$W/jobs/failed.$$"
  [ $rc = 124 ] && echo "$name: the VMs ran past their limit"
  if [ $rc = 125 ]; then
    echo "$name: a VM gave no status; its console:"
    tail -n 20 "$job"/console.*.log
    # Never booted as far as its init: qemu or the kernel cannot run here.
    grep -q "guest: node" "$job"/console.*.log || skip "the test VM does not boot on this machine (qemu / kernel); console in $job"
  fi
  printf '%s: %d VM(s), %.1f s, status %d (logs in %s)\n' "$name" "$vms" "$took" "$rc" "$job"
  [ $rc = 0 ] || { status=1; echo "stage $name: status $rc (logs in $job)" >>"$W/jobs/failed.$$"; }
  LAST_JOB=$job
}
if [ "$what" = all ] || [ "$what" = loopback ]; then
  stage loopback 1 -t 300
fi
if [ "$what" = all ] || [ "$what" = pair ]; then
  stage pair 2 -t $((400 + ${RDMA_SOAK_ROUNDS:-100} / 3)) -p
  job=$LAST_JOB
  cat "$job"/out/times.* 2>/dev/null
  # The module checks' frames: each QP's class's DSCP (10, 46, 48); the
  # library's (its ranks' logs of ports 29501 and 29506): throughput 26, low
  # latency 30, control 28, each class on QPs of its own.
  if [ -n "${RDMA_ONLY:-}" ]; then
    rm -f "$job"/net.*.pcap
  else
  echo "=== DSCP on the wire (capture of VM 1's link)"
  if /usr/bin/python3 "$ROOT/tests/rdma/pcap_dscp.py" "$job/net.1.pcap" "$job"/p.ex/r*.log "$job"/p.cm/r*.log \
      "$job"/out/rank*.29501.log "$job"/out/rank*.29506.log >"$job/dscp.txt"; then
    grep -E "^class|^PASS" "$job/dscp.txt"
  else
    tail -n 20 "$job/dscp.txt"; status=1
    { echo "DSCP check of the capture failed:"; tail -n 20 "$job/dscp.txt"; } >>"$W/jobs/failed.$$"
  fi
  for c in "0 26 throughput" "1 30 low-latency" "2 28 control"; do
    read -r cls dscp cname <<<"$c"
    lib_frames=$(awk -v c="class $cls (DSCP $dscp):" 'index($0, c) == 1 {print $(NF - 1)}' "$job/dscp.txt")
    echo "library, $cname class: ${lib_frames:-no} frames with DSCP $dscp on its QPs"
    [ "${lib_frames:-0}" -gt 0 ] || { status=1; echo "no $cname frames with DSCP $dscp" >>"$W/jobs/failed.$$"; }
  done
  rm -f "$job"/net.*.pcap  # large; the counts are in dscp.txt
  fi
fi
if [ "$what" = all ] || [ "$what" = links ]; then
  stage links 2 -t 300 -r
  cat "$LAST_JOB"/out/times.* "$LAST_JOB"/relay.log 2>/dev/null
fi
if [ -s "$W/jobs/failed.$$" ]; then
  echo "=== what failed (each failed check with the last lines of its log)"
  cat "$W/jobs/failed.$$"
fi
rm -f "$W/jobs/failed.$$"
printf 'rdma: image %.1f s, total %.1f s: %s\n' "$image_s" "$(echo "$(date +%s.%N) - $start" | bc)" \
  "$([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
