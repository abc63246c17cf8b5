#!/usr/bin/env bash
# The main job, end to end on one machine: start `baton dev` with the bundled example
# script, start a run, show it parked on a CTA, answer it, print the finished timeline.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
baton=$(baton_bin)
data=$(mktemp -d)
port=${BATON_DEMO_PORT:-8787}
export BATON_ENDPOINT="http://127.0.0.1:$port"
unset BATON_TOKEN

"$baton" dev --addr "127.0.0.1:$port" --data "$data" --script examples/orchestrator.json >"$data/dev.log" 2>&1 &
dev=$!
trap 'kill $dev 2>/dev/null; wait $dev 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do
  curl -fs "$BATON_ENDPOINT/health" >/dev/null 2>&1 && break
  sleep 0.1
done

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "baton run (the orchestrator fans out to two explore subagents, then asks for approval)"
"$baton" --data "$data" run "Map the repo and list its tests, then ship" --wait
run_id=$("$baton" --data "$data" --json ctas | python3 -c 'import json,sys; print(json.load(sys.stdin)["ctas"][0]["runId"])')
cta_id=$("$baton" --data "$data" --json ctas | python3 -c 'import json,sys; print(json.load(sys.stdin)["ctas"][0]["ctaId"])')

say "baton ctas (parked, costing nothing while it waits)"
"$baton" --data "$data" ctas

say "baton answer $cta_id --approve"
"$baton" --data "$data" answer "$cta_id" --approve

for _ in $(seq 100); do
  status=$("$baton" --data "$data" --json show "$run_id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
  [[ $status == completed ]] && break
  sleep 0.1
done

say "baton show $run_id"
"$baton" --data "$data" show "$run_id"
[[ $status == completed ]] || { echo "demo: run ended $status" >&2; exit 1; }
