#!/bin/bash
# ep_bench --backend cuda runs ep_bench_gpu (beside it) with the other
# arguments, whichever way getopt accepts the option: "--backend cuda",
# abbreviated ("--back cuda"), "--backend=cuda", "--backe=cuda". Without
# ep_bench_gpu (a build without CUDA) every spelling is refused by the parser.
#   tests/mp/bench_backend.sh BUILD
set -uo pipefail
BUILD=${1:-build}
spellings=("--backend cuda" "--back cuda" "--backend=cuda" "--backe=cuda")
fails=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

if [ -x "$BUILD/bin/ep_bench_gpu" ]; then
  for s in "${spellings[@]}"; do
    # ep_bench_gpu's usage, not its "unknown argument": the option was taken off.
    # shellcheck disable=SC2086
    out=$(timeout 60 "$BUILD/bin/ep_bench" $s --help 2>&1)
    if [[ "$out" == "usage: ep_bench_gpu"* ]]; then echo "ok: $s runs ep_bench_gpu"
    else echo "FAIL: $s: $(head -n 2 <<<"$out")"; fails=$((fails + 1)); fi
  done
else
  echo "no $BUILD/bin/ep_bench_gpu: only the build without it is checked"
fi

# The same tool without ep_bench_gpu beside it.
mkdir "$scratch/bin"
cp "$BUILD/bin/ep_bench" "$scratch/bin/"
ln -s "$(cd "$BUILD/lib" && pwd)" "$scratch/lib"
for s in "${spellings[@]}"; do
  # shellcheck disable=SC2086
  out=$(timeout 60 "$scratch/bin/ep_bench" $s --help 2>&1)
  rc=$?
  if [ "$rc" -eq 2 ] && [[ "$out" == *"--backend cuda is not implemented in this build of the tool"* ]]; then
    echo "ok: $s without ep_bench_gpu: refused"
  else
    echo "FAIL: $s without ep_bench_gpu: exit $rc: $(head -n 2 <<<"$out")"; fails=$((fails + 1))
  fi
done
[ "$fails" -eq 0 ]
