#!/usr/bin/env bash
# Installs the moeep package as Debian 12 allows (PEP 668: not into the
# system, but into a venv made with --system-site-packages, so that Debian's
# python3-numpy is seen), offline (--no-build-isolation --no-index, Debian's
# setuptools), and libmoeep into the same prefix (make install
# PREFIX=$VENV). Then, with MOEEP_LIBRARY unset and from outside the source
# tree, `import moeep` must load the library from that prefix; and with
# MOEEP_LIBRARY naming a library that is not there, fail with a message
# saying so. The venv stays for the tests that follow (run_all.sh).
#   bindings/python/tests/install_check.sh BUILD VENV
set -eu
BUILD=${1:-build}
VENV=${2:-$BUILD/python-venv}
cd "$(dirname "$0")/../../.."
root=$PWD
case "$VENV" in /*) ;; *) VENV=$root/$VENV ;; esac
rm -rf "$VENV"
/usr/bin/python3 -m venv --system-site-packages "$VENV"
# pip builds a local directory in place: build from a copy, so that the
# source tree keeps no build/ or egg-info.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp -r bindings/python/. "$src/"
rm -rf "$src/build" "$src"/*.egg-info
"$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir --no-build-isolation --no-index "$src"
make -s install BUILD="$BUILD" PREFIX="$VENV" >/dev/null
cd "$src/.."  # not the source tree: the installed package is the one imported
env -u MOEEP_LIBRARY "$VENV/bin/python" - "$VENV" <<'PY'
import os, sys
import moeep
venv = os.path.realpath(sys.argv[1])
pkg = os.path.realpath(moeep.__file__)
assert pkg.startswith(venv), "moeep imported from %s, not from the venv" % pkg
assert moeep.version() == (0, 1, 0), moeep.version()
loaded = [l.split()[-1] for l in open("/proc/self/maps") if "libmoeep.so" in l]
assert loaded and all(os.path.realpath(p).startswith(venv) for p in loaded), "libmoeep loaded from %s" % loaded
print("moeep %s from %s, libmoeep %s from %s" % (moeep.__version__, pkg, ".".join(map(str, moeep.version())), loaded[0]))
PY
out=$(MOEEP_LIBRARY=/nonexistent/libmoeep.so.0 "$VENV/bin/python" -c 'import moeep; moeep.version()' 2>&1 || true)
grep -q "MOEEP_LIBRARY: /nonexistent/libmoeep.so.0 (no such file)" <<<"$out" ||
  { echo "a missing MOEEP_LIBRARY was not reported: $out"; exit 1; }
echo "install_check: the venv at $VENV imports moeep and finds libmoeep through its prefix"
