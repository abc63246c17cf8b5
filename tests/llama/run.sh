#!/usr/bin/env bash
# Baton against a real OpenAI-compatible server and a real model, as CI runs it: builds
# llama.cpp's server and fetches Gemma 3 270M the first time (tests/llama/setup.sh, cached
# under target/llama/), then runs the tests that drive them (tests/tests/real_model.rs).
#
#   tests/llama/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
env=$(tests/llama/setup.sh)
eval "$env"
# `--workspace`: the test command's build, features and all (`-p baton-tests` alone would
# build the libraries again with that crate's features only).
cargo test --workspace --test real_model
