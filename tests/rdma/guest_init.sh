#!/bin/sh
# /init of the RDMA test VMs (busybox sh). Kernel command line:
#   moeep.node=N    this VM's number: address 10.77.0.N
#   moeep.nodes=K   VMs in the run; 1: rxe on one end of a veth pair, so
#                   that RoCE frames loop back inside the VM
#   moeep.job=DIR   the job folder (9p tag "job", writable), same path as on the host
# The host's / (9p tag "host", read-only) under a tmpfs overlay becomes the
# root, so host programs and libraries run unchanged at their host paths.
# Runs DIR/job.sh with bash after sourcing DIR/env, writes DIR/rc.N, powers off.
PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for kv in $(cat /proc/cmdline); do
  case $kv in
    moeep.node=*) NODE=${kv#*=} ;;
    moeep.nodes=*) NODES=${kv#*=} ;;
    moeep.job=*) JOB=${kv#*=} ;;
  esac
done
while read -r m; do insmod "$m" || echo "guest: insmod $m failed"; done < /etc/modules
mkdir -p /mnt/host /mnt/rw /root
fail() { echo "guest: $1"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 host /mnt/host || fail "no host root"
mount -t tmpfs -o size=60% rw /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/host,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay /root || fail "no overlay"
R=/root
mount -t tmpfs run $R/run
# /tmp stays the overlay's (writable, in memory) rather than a fresh tmpfs:
# a checkout or build under the host's /tmp must stay visible to the guest.
mount -o bind /proc $R/proc
mount -o bind /sys $R/sys
mount -o bind /dev $R/dev
mkdir -p $R/dev/shm $R/dev/pts
ln -sf /proc/self/fd $R/dev/fd  # bash's process substitution
mount -t tmpfs shm $R/dev/shm
mount -t devpts pts $R/dev/pts
mkdir -p "$R$JOB"
mount -t 9p -o trans=virtio,version=9p2000.L,rw,cache=none,msize=262144 job "$R$JOB" || fail "no job folder"
# The network, with the host's iproute2 (by path: busybox has its own ip).
in_root() { chroot $R "$@"; }
in_root /usr/sbin/ip link set lo up
if [ "$NODES" -gt 1 ]; then
  NETDEV=eth0
  in_root /usr/sbin/ip link set eth0 up
  in_root /usr/sbin/ip addr add "10.77.0.$NODE/24" dev eth0
else
  NETDEV=veth0
  in_root /usr/sbin/ip link add veth0 type veth peer name veth1
  in_root /usr/sbin/ip link set veth0 up
  in_root /usr/sbin/ip link set veth1 up
  in_root /usr/sbin/ip addr add "10.77.0.$NODE/24" dev veth0
fi
in_root /usr/bin/rdma link add rxe0 type rxe netdev $NETDEV || echo "guest: rdma link add failed"
up=$(cut -d' ' -f1 /proc/uptime)
echo "guest: node $NODE of $NODES up in ${up}s, rxe0 on $NETDEV"
chroot $R /bin/bash -c "cd '$JOB' && export VM_NODE=$NODE VM_NODES=$NODES VM_NETDEV=$NETDEV HOME=/tmp && . '$JOB/env' && exec /bin/bash '$JOB/job.sh'"
echo $? > "$R$JOB/rc.$NODE"
umount "$R$JOB"
poweroff -f
