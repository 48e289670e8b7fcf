#!/usr/bin/env bash
# make lint: cppcheck and clang-tidy on the C++ files changed against main's
# merge base (or all files with --all).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--all" ]; then
  files=$(git ls-files 'src/*.cc' 'src/**/*.cc' 'transports/**/*.cc' 'tools/*.cc')
else
  base=$(git merge-base HEAD origin/main 2>/dev/null || git rev-list --max-parents=0 HEAD | tail -1)
  files=$(git diff --name-only --diff-filter=d "$base" -- '*.cc' | grep -E '^(src|transports|tools)/' || true)
fi
[ -z "$files" ] && { echo "lint: no changed C++ files"; exit 0; }
status=0
if command -v cppcheck >/dev/null; then
  cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability --std=c++17 \
    --suppress=missingIncludeSystem -Iinclude -Isrc $files || status=1
fi
if command -v clang-tidy >/dev/null; then
  for f in $files; do
    clang-tidy --quiet -checks='-*,bugprone-*,-bugprone-easily-swappable-parameters,performance-*' \
      "$f" -- -std=c++17 -Iinclude -Isrc -Itools 2>/dev/null | grep -E "warning|error" && status=1
  done
fi
exit $status
