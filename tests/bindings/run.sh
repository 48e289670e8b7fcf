#!/usr/bin/env bash
# The Rust tests and the examples, as tests/run_all.sh runs them:
#   tests/bindings/run.sh BUILD rust-test|example-c|example-mpi|example-python|example-rust
# Debian's toolchains by absolute path (/usr/bin/rustc, /usr/bin/cargo,
# /usr/bin/python3 through the venv of bindings/python/tests/install_check.sh),
# so that a rustup or pyenv install earlier on PATH does not change the result.
# Exit 77: a prerequisite is missing (the last line says which); run_all.sh
# counts it as SKIPPED.
set -eu
BUILD=${1:-build}
what=${2:-}
cd "$(dirname "$0")/../.."
root=$PWD
lib="$root/$BUILD/lib"
mkdir -p "$BUILD/examples"

rust_env() {
  if [ ! -x /usr/bin/cargo ] || [ ! -x /usr/bin/rustc ]; then
    echo "SKIPPED: Debian's rustc / cargo are not installed (scripts/install-deps.sh installs them)"
    exit 77
  fi
  # CARGO_HOME of our own: no user config (a rustup install's) takes part.
  export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc CARGO_HOME="$root/$BUILD/cargo-home" \
    CARGO_TARGET_DIR="$root/$BUILD/rust-target" MOEEP_LIB_DIR="$lib" LD_LIBRARY_PATH="$lib"
}

case "$what" in
  rust-test)
    rust_env
    cd bindings/rust  # its .cargo/config.toml (offline) applies from here
    /usr/bin/cargo test --offline
    ;;
  example-rust)
    rust_env
    cd examples/rust
    /usr/bin/cargo run --offline -q -- 3
    ;;
  example-c)
    cc -std=c11 -Wall -Wextra -Werror examples/c/two_process.c -Iinclude -L"$lib" -lmoeep -Wl,-rpath,"$lib" \
      -o "$BUILD/examples/two_process"
    timeout 120 "$BUILD/examples/two_process"
    ;;
  example-mpi)
    if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
      echo "SKIPPED: mpicc / mpirun not found (scripts/install-deps.sh installs libopenmpi-dev and openmpi-bin)"
      exit 77
    fi
    mpicc -std=c11 -Wall -Wextra -Werror examples/mpi/mpi_moe.c -Iinclude -Iexamples/c -L"$lib" -lmoeep \
      -Wl,-rpath,"$lib" -o "$BUILD/examples/mpi_moe"
    as_root=()
    [ "$(id -u)" -eq 0 ] && as_root=(--allow-run-as-root)
    OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 mpirun "${as_root[@]}" --oversubscribe -np 4 \
      "$BUILD/examples/mpi_moe"
    ;;
  example-python)
    # The package and the library as installed in the venv (no MOEEP_LIBRARY).
    env -u MOEEP_LIBRARY timeout 120 "$BUILD/python-venv/bin/python" examples/python/moe_layer.py --ranks 3
    ;;
  *)
    echo "usage: $0 BUILD rust-test|example-c|example-mpi|example-python|example-rust" >&2
    exit 2
    ;;
esac
