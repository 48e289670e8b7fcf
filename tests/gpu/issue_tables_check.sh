#!/bin/bash
# tests/gpu/issue_tables.py on logs of a real run (one H200, EP1: ep_bench_gpu,
# gpu_ll_test --bench and the library's kernel-time lines, in
# tests/data/issue_tables/): its tables must equal expected.md. Runs without
# a GPU, so that the parser follows the benchmarks' output formats.
set -uo pipefail
cd "$(dirname "$0")/../.."
data=tests/data/issue_tables
got=$(python3 tests/gpu/issue_tables.py "$data" 1 "NVIDIA H200 x 1" sample) || exit 1
if [ "$got" != "$(cat "$data/expected.md")" ]; then
  diff <(echo "$got") "$data/expected.md"
  echo "issue_tables.py: the tables differ from $data/expected.md"
  exit 1
fi
# Each table must hold figures, not dashes: a format change in a benchmark
# that the parser no longer reads shows here.
for want in "| dispatch BF16, 8192 tokens | 266.3 | 209.4 | 123.5 |" "| dispatch receive half | 5.5 | 9.2 | 8 | <= 5 |" \
            "| 1 token per rank: dispatch + combine | 11.1 (5.8 + 5.4) |"; do
  grep -qF -- "$want" <<<"$got" || { echo "issue_tables.py: no line \"$want\""; exit 1; }
done
echo "issue_tables.py: the sample's tables as expected"
