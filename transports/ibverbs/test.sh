#!/usr/bin/env bash
# The ibverbs transport's tests (tests/run_all.sh runs this; exit 77:
# skipped, the last line says why).
#  1. On this machine: where there is no RDMA device, the module loads and
#     moeep_info says why it is unavailable; an unknown EP_IB_CM is refused.
#  2. tests/rdma/run.sh: real verbs in Soft-RoCE VMs (one, then two).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
[ -e "$BUILD/lib/libmoeep-transport-ibverbs.so" ] ||
  { echo "libmoeep-transport-ibverbs.so not built: no libibverbs-dev / librdmacm-dev headers (scripts/install-deps.sh)"; exit 77; }
info="$BUILD/bin/moeep_info"
if [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  out=$("$info" -t)
  echo "$out" | grep ibverbs
  echo "$out" | grep -q "ibverbs *unavailable *init failed: .*no RDMA device" ||
    { echo "FAIL: moeep_info does not say why ibverbs is unavailable here"; exit 1; }
fi
out=$(EP_TRANSPORTS=shm,ibverbs "$info" -t)
echo "$out" | grep -q "ibverbs" || { echo "FAIL: moeep_info does not list the ibverbs module"; exit 1; }
exec bash tests/rdma/run.sh
