#!/usr/bin/env bash
# {{name}}'s CI: formatting, lints, the tests, the template against Baton's, then `sam validate`
# and `sam build` (the SAM CLI and cargo-lambda installed into target/ci-venv if missing).
# `./ci.sh --no-sam` stops before SAM. SAM_CARGO_TARGET_DIR: where `sam build`'s cargo builds
# (its release profile shares nothing with the tests' build).
set -euo pipefail
cd "$(dirname "$0")"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
# template.yaml is the template of the Baton this project builds with.
if ! cargo run -q -p dev -- template | diff -q template.yaml - >/dev/null; then
  echo "template.yaml is not the Baton's this project builds with:" \
       "cargo run -p dev -- template > template.yaml" >&2
  exit 1
fi
[ "${1:-}" = --no-sam ] && exit 0
if ! command -v sam >/dev/null || ! command -v cargo-lambda >/dev/null; then
  python3 -m venv target/ci-venv
  target/ci-venv/bin/pip install -q cargo-lambda 'aws-sam-cli>=1.165'
  export PATH="$PWD/target/ci-venv/bin:$PATH"
fi
export SAM_CLI_TELEMETRY=0
sam validate --lint
if [ -n "${SAM_CARGO_TARGET_DIR:-}" ]; then export CARGO_TARGET_DIR="$SAM_CARGO_TARGET_DIR"; fi
sam build
