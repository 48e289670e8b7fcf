#!/usr/bin/env bash
# Boots 1 or 2 VMs (qemu, TCG: no KVM needed) with Soft-RoCE and runs
# JOB/job.sh in each (after JOB/env), JOB being a folder the caller made.
#   tests/rdma/vm_run.sh [-n 1|2] [-t SECONDS] [-p] JOB
#   -n  VMs (default 1). Two VMs are joined by a link of unix datagram
#       sockets in JOB (no IP port of the host is used): 10.77.0.1 and
#       10.77.0.2 exist only inside them.
#   -t  limit for the whole run (default 300)
#   -p  every frame of VM N goes to JOB/net.N.pcap (2 VMs)
#   -r  the link goes through tests/rdma/relay.py, which drops every frame
#       for a while when a VM writes JOB/outage (2 VMs)
# Each VM's console is in JOB/console.N.log; the job's status in JOB/rc.N.
# Exit status: the largest of the VMs' statuses; 124: a VM ran past the
# limit; 125: a VM gave no status (it did not boot).
# RDMA_VM_WORK: where vm_image.sh keeps the kernel (default /tmp/moeep-rdma-vm).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${RDMA_VM_WORK:-/tmp/moeep-rdma-vm}
nodes=1 limit=300 pcap=0 relay=0
while getopts n:t:pr opt; do
  case $opt in n) nodes=$OPTARG ;; t) limit=$OPTARG ;; p) pcap=1 ;; r) relay=1 ;; *) sed -n 2,16p "$0"; exit 2 ;; esac
done
shift $((OPTIND - 1))
JOB=$(cd "${1:?usage: vm_run.sh [-n N] [-t S] [-p] JOB}" && pwd)
"$HERE/vm_image.sh" "$W" >&2 || exit $?
chmod 777 "$JOB"
rm -f "$JOB"/rc.* "$JOB"/net.*.sock "$JOB"/relay.*
relay_pid=
if [ "$relay" = 1 ]; then
  /usr/bin/python3 "$HERE/relay.py" "$JOB" &
  relay_pid=$!
  for _ in $(seq 1 50); do [ -S "$JOB/relay.2.sock" ] && break; sleep 0.1; done
fi
# The guest's memory: its root's writes and /dev/shm (the ranks' segments) live there.
mem=${RDMA_VM_MEM:-1024}
pids=()
for n in $(seq 1 "$nodes"); do
  net=(-nic none)
  if [ "$nodes" -gt 1 ]; then
    other=$((3 - n))
    peer=$JOB/net.$other.sock
    [ "$relay" = 1 ] && peer=$JOB/relay.$n.sock
    net=(-nic none -netdev "dgram,id=n0,local.type=unix,local.path=$JOB/net.$n.sock,remote.type=unix,remote.path=$peer"
         -device "virtio-net-pci,romfile=,netdev=n0,mac=52:54:00:4d:45:0$n")
    [ "$pcap" = 1 ] && net+=(-object "filter-dump,id=dump0,netdev=n0,file=$JOB/net.$n.pcap")
  fi
  timeout "$limit" qemu-system-x86_64 -accel tcg -cpu max -smp 1 -m "$mem" -nographic -no-reboot -nodefaults \
    -serial stdio -monitor none -kernel "$W/vmlinuz" -initrd "$W/initramfs.gz" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 moeep.node=$n moeep.nodes=$nodes moeep.job=$JOB" \
    "${net[@]}" \
    -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$JOB,mount_tag=job,security_model=none,multidevs=remap" \
    </dev/null >"$JOB/console.$n.log" 2>&1 &
  pids+=($!)
done
worst=0
for n in $(seq 1 "$nodes"); do
  wait "${pids[$((n - 1))]}"
  q=$?
  if [ "$q" = 124 ]; then rc=124; elif [ -f "$JOB/rc.$n" ]; then rc=$(cat "$JOB/rc.$n"); else rc=125; fi
  [ "$rc" -gt "$worst" ] && worst=$rc
done
if [ -n "$relay_pid" ]; then
  : >"$JOB/relay.stop"
  wait "$relay_pid"
fi
exit "$worst"
