#!/usr/bin/env bash
# Measures release-profile choices for the Lambda binaries: for each variant, a cold
# `cargo lambda build --release` (x86_64) of the four functions in its own target directory,
# then each bootstrap's size, zipped size and init time (scripts/lambda_init.py).
# Prints a Markdown table. Slow: every variant rebuilds every dependency.
#
#   scripts/lambda-profiles.sh [variant ...]     # default: all variants below
set -euo pipefail
cd "$(dirname "$0")/.."
functions=(api orchestrator subagent cta)
declare -A variants=(
  [baseline]=""
  [thin-lto]="CARGO_PROFILE_RELEASE_LTO=thin"
  [fat-lto-cgu1]="CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1"
  [fat-lto-cgu1-abort]="CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 CARGO_PROFILE_RELEASE_PANIC=abort"
  [opt-s-fat-lto-cgu1]="CARGO_PROFILE_RELEASE_OPT_LEVEL=s CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1"
)
order=(baseline thin-lto fat-lto-cgu1 fat-lto-cgu1-abort opt-s-fat-lto-cgu1)
(($#)) && order=("$@")
root=${BATON_PROFILE_DIR:-$(mktemp -d)}
echo "| variant | build s | function | bytes | zipped | init ms (median / p90) |"
echo "|---|---|---|---|---|---|"
for v in "${order[@]}"; do
  dir="$root/$v"
  args=()
  for f in "${functions[@]}"; do args+=(-p "$f"); done
  if [[ ! -s "$root/$v.secs" ]]; then # a finished variant is measured again, not rebuilt
    start=$(date +%s)
    env ${variants[$v]} CARGO_TARGET_DIR="$dir" cargo lambda build --release "${args[@]}" >"$root/$v.log" 2>&1 ||
      { echo "build of $v failed: $root/$v.log" >&2; exit 1; }
    echo $(($(date +%s) - start)) >"$root/$v.secs"
  fi
  for f in "${functions[@]}"; do
    python3 scripts/lambda_init.py "$dir/lambda/$f/bootstrap" --runs 20 |
      python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
v, secs, f = sys.argv[1:4]
print("| {} | {} | {} | {:,} | {:,} | {} / {} |".format(
    v, secs, f, r["bytes"], r["zip_bytes"], r["init_ms_median"], r["init_ms_p90"]))
' "$v" "$(cat "$root/$v.secs")" "$f"
  done
done
