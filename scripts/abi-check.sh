#!/usr/bin/env bash
# The ABI check:
#  1. libmoeep.so exports only ep* symbols, each with a MOEEP_* version;
#  2. both public headers compile alone as C11 and as C++17, without CUDA;
#  3. abidiff of the built library against abi/libmoeep.abi finds no change.
# `--update` rewrites the baseline (do that only with a CHANGELOG entry).
set -euo pipefail
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
lib="$BUILD/lib/libmoeep.so"
baseline=abi/libmoeep.abi
fail=0

# 1. Exported symbols.
exports=$(nm -D --defined-only --with-symbol-versions "$lib" | awk '{print $3}')
bad=$(echo "$exports" | grep -v '^ep[A-Z][A-Za-z]*@@\?MOEEP_[0-9.]*$' | grep -v '^MOEEP_[0-9.]*$' || true)
if [ -n "$bad" ]; then
  echo "abi-check: symbols exported that are not versioned ep* functions:"; echo "$bad" | head -20; fail=1
fi
count=$(echo "$exports" | grep -c '^ep' || true)
echo "abi-check: $count ep* symbols exported, all versioned"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libmoeep.so.0" ] || { echo "abi-check: SONAME is '$soname', want libmoeep.so.0"; fail=1; }

# 2. Headers alone.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for h in moeep.h moeep_transport.h; do
  printf '#include <%s>\nint main(void) { return 0; }\n' "$h" > "$tmp/c.c"
  cc -std=c11 -Wall -Wextra -pedantic -Werror -Iinclude -c "$tmp/c.c" -o "$tmp/c.o" || { echo "abi-check: $h fails as C11"; fail=1; }
  cp "$tmp/c.c" "$tmp/cc.cc"
  c++ -std=c++17 -Wall -Wextra -pedantic -Werror -Iinclude -c "$tmp/cc.cc" -o "$tmp/cc.o" || { echo "abi-check: $h fails as C++17"; fail=1; }
done
# Initialisers must be valid in both languages.
cat > "$tmp/init.c" <<'C'
#include <moeep.h>
int main(void) {
  epConfig_t c = EP_CONFIG_INITIALIZER; epLayoutArgs_t l = EP_LAYOUT_ARGS_INITIALIZER;
  epDispatchArgs_t d = EP_DISPATCH_ARGS_INITIALIZER; epCombineArgs_t k = EP_COMBINE_ARGS_INITIALIZER;
  epCommPeerInfo_t p = EP_COMM_PEER_INFO_INITIALIZER;
  return (c.size == sizeof c && l.size == sizeof l && d.size == sizeof d && k.size == sizeof k &&
          p.size == sizeof p && p.via_rank == -1) ? 0 : 1;
}
C
cc -std=c11 -Wall -Wextra -Werror -Iinclude "$tmp/init.c" -o "$tmp/init_c" && "$tmp/init_c" || { echo "abi-check: initialisers fail in C"; fail=1; }
cp "$tmp/init.c" "$tmp/init.cc"
c++ -std=c++17 -Wall -Wextra -Werror -Iinclude "$tmp/init.cc" -o "$tmp/init_cc" && "$tmp/init_cc" || { echo "abi-check: initialisers fail in C++"; fail=1; }
echo "abi-check: headers compile alone as C11 and C++17"

# 3. abidiff against the baseline.
if ! command -v abidw >/dev/null; then
  echo "abi-check: abidw not found (scripts/install-deps.sh installs abigail-tools)"; exit 1
fi
abidw --headers-dir include --drop-private-types --exported-interfaces-only --no-show-locs --no-corpus-path --no-comp-dir-path "$lib" > "$tmp/current.abi"
if [ "${1:-}" = "--update" ]; then
  mkdir -p abi; cp "$tmp/current.abi" "$baseline"; echo "abi-check: baseline $baseline updated"; exit $fail
fi
if [ ! -f "$baseline" ]; then echo "abi-check: no baseline $baseline (make abi-baseline)"; exit 1; fi
if abidiff --headers-dir2 include "$baseline" "$tmp/current.abi" > "$tmp/diff.txt"; then
  echo "abi-check: abidiff finds no change against $baseline"
else
  echo "abi-check: the ABI differs from $baseline:"; cat "$tmp/diff.txt"
  echo "abi-check: if intended, add a CHANGELOG entry and run 'make abi-baseline'"; fail=1
fi
exit $fail
