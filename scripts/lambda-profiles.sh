#!/usr/bin/env bash
# Measures the Lambda binaries under the release profile Cargo.toml declares: a cold
# `cargo lambda build --release` (x86_64) of the five functions in a target directory of its
# own, then each bootstrap's size, zipped size and init time (scripts/lambda_init.py), as
# Markdown table rows. To compare profiles, edit [profile.release] and run it again with
# another label. (cargo-lambda does not pass CARGO_PROFILE_* overrides through, so the
# profile must be in Cargo.toml.) Slow: every dependency is rebuilt.
#
#   scripts/lambda-profiles.sh LABEL [TARGET_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
label=${1:?usage: scripts/lambda-profiles.sh LABEL [TARGET_DIR]}
dir=${2:-$(mktemp -d)}
functions=(api orchestrator subagent events live)
args=()
for f in "${functions[@]}"; do args+=(-p "$f"); done
if [[ ! -s "$dir/build.secs" ]]; then # a finished build is measured again, not rebuilt
  start=$(date +%s)
  CARGO_TARGET_DIR="$dir" cargo lambda build --release "${args[@]}" >"$dir.log" 2>&1 ||
    { echo "build failed: $dir.log" >&2; exit 1; }
  echo $(($(date +%s) - start)) >"$dir/build.secs"
fi
for f in "${functions[@]}"; do
  python3 scripts/lambda_init.py "$dir/lambda/$f/bootstrap" --runs 20 |
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
label, secs, f = sys.argv[1:4]
print("| {} | {} | {} | {:,} | {:,} | {} / {} | {} |".format(
    label, secs, f, r["bytes"], r["zip_bytes"], r["init_ms_median"], r["init_ms_p90"],
    r["init_peak_rss_mb"]))
' "$label" "$(cat "$dir/build.secs")" "$f"
done
