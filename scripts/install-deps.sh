#!/usr/bin/env bash
# Installs the Debian packages that building and testing libmoeep needs.
# Used by the README's test command and by .ci/run, so both stay in step.
#   --rdma  also what tests/rdma needs to run the ibverbs transport on real
#           verbs in Soft-RoCE VMs: qemu, a static busybox, cpio and kmod
#           (the VMs' initramfs), the rxe provider, iproute2 (rdma link)
set -euo pipefail
PKGS=(build-essential pkg-config libcmocka-dev openmpi-bin libopenmpi-dev
      abigail-tools libhwloc-dev hwloc python3
      libibverbs-dev librdmacm-dev  # headers of the ibverbs module (it opens the libraries at run time)
      libasan8 libubsan1  # the sanitizer runtimes of gcc 12 (tests/sanitize.sh)
      # bindings/: the Python package (installed offline into a venv with
      # Debian's setuptools; NumPy from Debian), the Rust crates (Debian's
      # rustc and cargo, used by path: /usr/bin/rustc, /usr/bin/cargo)
      python3-numpy python3-venv python3-setuptools python3-pip rustc cargo
      # moeep.deep_ep's tests on CPU tensors (Debian's torch 1.13, through
      # the venv's system site packages); without it they print SKIPPED
      python3-torch)
for arg in "$@"; do
  case $arg in
    --rdma) PKGS+=(qemu-system-x86 busybox-static cpio kmod ibverbs-providers iproute2 bc) ;;
    *) echo "install-deps: unknown option $arg (--rdma)"; exit 2 ;;
  esac
done
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
