#!/usr/bin/env bash
# Installs into a scratch prefix and builds a C11 program with pkg-config only.
set -eu
BUILD=${1:-build}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
make -s install BUILD="$BUILD" PREFIX="$prefix" >/dev/null
cat > "$prefix/hello.c" <<'C'
#include <moeep.h>
#include <stdio.h>
int main(void) {
  int v = 0;
  if (epGetVersion(&v) != epSuccess || v != EP_VERSION_CODE) return 1;
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = 4; cfg.hidden = 64; cfg.max_tokens_per_rank = 8; cfg.max_topk = 2;
  cfg.backend = epBackendHost;
  epComm_t comm;
  if (epCommInitAll(&comm, 1, NULL, &cfg) != epSuccess) { printf("%s\n", epGetLastError(NULL)); return 1; }
  int first = -1, count = -1;
  epCommLocalExperts(comm, &first, &count);
  epCommDestroy(comm);
  printf("libmoeep %d via pkg-config: experts [%d, %d)\n", v, first, first + count);
  return (first == 0 && count == 4) ? 0 : 1;
}
C
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -std=c11 -Wall -Werror "$prefix/hello.c" -o "$prefix/hello" $(pkg-config --cflags --libs moeep) \
  -Wl,-rpath,"$prefix/lib"
"$prefix/hello"
