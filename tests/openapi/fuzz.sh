#!/usr/bin/env bash
# The API against its own OpenAPI document: schemathesis (from PyPI, into a virtualenv under
# target/) fuzzes every operation of `baton dev` as served at /openapi.json — schema-valid and
# schema-breaking requests, then stateful sequences through the ids it is given — and fails on
# any 5xx, any status or body the document does not describe, any valid request refused, any
# secured route that answers without the token.
#
#   tests/openapi/fuzz.sh [max-examples per operation, default 50]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh

examples=${1:-50}
venv=target/schemathesis
if [ ! -x "$venv/bin/st" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'schemathesis==4.32.5'
fi
baton=$(baton_bin)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
data=$(mktemp -d)
BATON_TOKEN=fuzz-token "$baton" --data "$data" dev --script examples/orchestrator.json \
  --addr "127.0.0.1:$port" >"$data/dev.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.1
done
# A stream never ends on its own: two seconds of it are read, then checked event by event.
# One worker: schemathesis' workers are threads, and CPython 3.11 (this machine's, and CI's)
# shares the AST constructor's recursion counter between threads (python/cpython#106905), so
# two workers describing hypothesis filters at once can die with "AST constructor recursion
# depth mismatch" (CI did, in the coverage phase).
"$venv/bin/st" run "http://127.0.0.1:$port/openapi.json" \
  -H "Authorization: Bearer fuzz-token" --checks all --max-examples "$examples" \
  --workers 1 --request-timeout 2
if grep -q "panicked" "$data/dev.log"; then
  echo "baton dev panicked under the fuzzer:" >&2
  grep -A5 "panicked" "$data/dev.log" >&2
  exit 1
fi
