#!/usr/bin/env bash
# Builds what the RDMA test VMs boot: Debian's kernel (unpacked from its .deb,
# not installed) and a small initramfs holding busybox, the kernel modules for
# virtio, 9p, overlayfs, veth and Soft-RoCE (rdma_rxe), and guest_init.sh as
# /init. Userspace is not in it: the guest mounts the host's / read-only and
# runs there (guest_init.sh).
#   tests/rdma/vm_image.sh WORK     -> WORK/vmlinuz, WORK/initramfs.gz
# Rebuilt only when guest_init.sh changed. Exit 77: cannot be built here (why
# on the last line).
set -euo pipefail
W=${1:?usage: vm_image.sh WORKDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$W"
stamp=$(sha256sum "$HERE/guest_init.sh" "$HERE/vm_image.sh" | sha256sum | cut -c1-16)
if [ -f "$W/vmlinuz" ] && [ -f "$W/initramfs.gz" ] && [ "$(cat "$W/stamp" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
skip() { echo "$1"; exit 77; }
[ -x /bin/busybox ] && /bin/busybox --list | grep -x insmod >/dev/null || skip "no static busybox (scripts/install-deps.sh --rdma)"
command -v cpio >/dev/null || skip "no cpio (scripts/install-deps.sh --rdma)"
command -v depmod >/dev/null || [ -x /sbin/depmod ] || skip "no depmod (kmod; scripts/install-deps.sh --rdma)"
export PATH=$PATH:/sbin:/usr/sbin

# The kernel: the newest linux-image-6.* that linux-image-amd64 depends on.
mkdir -p "$W/deb"
deb=$(ls "$W"/deb/linux-image-6.*_amd64.deb 2>/dev/null | head -1 || true)
if [ -z "$deb" ]; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-6/{print $2; exit}')
  [ -n "$pkg" ] || skip "apt-cache knows no linux-image-amd64 (apt-get update?)"
  (cd "$W/deb" && apt-get download -q "$pkg" >/dev/null 2>&1) || skip "cannot download $pkg (no network?)"
  deb=$(ls "$W"/deb/linux-image-6.*_amd64.deb | head -1)
fi
rm -rf "$W/kernel" && mkdir -p "$W/kernel"
dpkg-deb -x "$deb" "$W/kernel"
kv=$(ls "$W/kernel/lib/modules" | head -1)
depmod -b "$W/kernel" "$kv"
cp "$W/kernel/boot/vmlinuz-$kv" "$W/vmlinuz"

# The initramfs: busybox, the modules in load order, /init.
ir="$W/initramfs"
rm -rf "$ir" && mkdir -p "$ir"/{bin,dev,proc,sys,mnt,root,etc}
cp /bin/busybox "$ir/bin/busybox"
for applet in sh mount umount mkdir insmod poweroff cat sleep echo chroot cut; do ln -s busybox "$ir/bin/$applet"; done
: > "$ir/etc/modules"
# crc32_generic: rdma_rxe asks the crypto API for crc32 by name, not as a module dependency.
for m in virtio_pci virtio_net 9pnet_virtio 9p overlay veth crc32_generic rdma_rxe rdma_ucm; do
  modprobe -d "$W/kernel" -S "$kv" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r f; do
  rel=${f#"$W/kernel"}
  mkdir -p "$ir$(dirname "$rel")"
  cp "$f" "$ir$rel"
  echo "$rel" >> "$ir/etc/modules"
done
cp "$HERE/guest_init.sh" "$ir/init"
chmod +x "$ir/init"
(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) > "$W/initramfs.gz"
mods=$(wc -l < "$ir/etc/modules")
rm -rf "$W/kernel" "$ir"
echo "$stamp" > "$W/stamp"
echo "vm_image: kernel $kv, $mods modules, initramfs $(du -h "$W/initramfs.gz" | cut -f1)"
