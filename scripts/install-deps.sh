#!/usr/bin/env bash
# Installs the Debian packages that building and testing libmoeep needs.
# Used by the README's test command and by .ci/run, so both stay in step.
set -euo pipefail
PKGS=(build-essential pkg-config libcmocka-dev openmpi-bin libopenmpi-dev
      abigail-tools libhwloc-dev hwloc libibverbs-dev python3
      libasan8 libubsan1  # the sanitizer runtimes of gcc 12 (tests/sanitize.sh)
      # bindings/: the Python package (installed offline into a venv with
      # Debian's setuptools; NumPy from Debian), the Rust crates (Debian's
      # rustc and cargo, used by path: /usr/bin/rustc, /usr/bin/cargo)
      python3-numpy python3-venv python3-setuptools python3-pip rustc cargo)
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
