#!/usr/bin/env bash
# The project `baton new` writes, as SAM builds it and Lambda runs it (CI runs both: .ci/run).
#
#   scripts/starter.sh build DIR    writes a project in DIR (made anew) over this checkout
#                                   (`--baton-path`), `sam build`s it, and checks that its own
#                                   tools are in every packaged function that builds a catalog,
#                                   and not in the live channel's authorizer. The build's
#                                   CARGO_TARGET_DIR and profile are the caller's; BATON_BIN, a
#                                   `baton` to write it with (else built here, debug).
#   scripts/starter.sh invoke DIR   starts the project's packaged functions (DIR/.aws-sam/build),
#                                   one at a time, under cargo-lambda's runtime API, against
#                                   moto: its `api` creates a run of the project's own agent,
#                                   its `orchestrator` steps it, as SQS would hand it the message.
#
# Needs cargo-lambda, the SAM CLI and moto on PATH (.ci/run installs them); `invoke`, a debug
# build of `baton` (for `baton bootstrap`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source scripts/lib.sh
mode=${1:-}
dir=${2:-}
if [[ -z "$dir" || ! "$mode" =~ ^(build|invoke)$ ]]; then
  echo "usage: scripts/starter.sh build|invoke DIR" >&2
  exit 2
fi
# What the project's own tools leave in a binary: `github_read`'s description.
marker="of the run's GitHub repository at its ref"

if [[ $mode == build ]]; then
  rm -rf "$dir"
  if [[ -n "${BATON_BIN:-}" ]]; then
    # CI hands over the test stage's debug build, which it links early: wait for it.
    for _ in $(seq 900); do [[ -x "$BATON_BIN" ]] && break; sleep 2; done
    "$BATON_BIN" new "$dir" --baton-path "$root"
  else
    cargo run -q -p baton-cli --bin baton -- new "$dir" --baton-path "$root"
  fi
  cd "$dir"
  sam build
  for f in Api Orchestrator Subagent Events; do
    grep -q "$marker" ".aws-sam/build/${f}Function/bootstrap" ||
      { echo "${f}Function: the project's own tools are not in what sam build packaged" >&2; exit 1; }
  done
  if grep -q "$marker" .aws-sam/build/LiveFunction/bootstrap; then
    echo "LiveFunction links the project's tools, which it never uses" >&2
    exit 1
  fi
  echo "starter: sam build packaged the project's tools in every function that uses them"
  exit 0
fi

baton="$(target_dir)/debug/baton"
dir=$(cd "$dir" && pwd)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

moto_port=$(free_port)
moto_server -H 127.0.0.1 -p "$moto_port" >"$work/moto.log" 2>&1 &
pids+=($!)
wait_port "$moto_port"
export AWS_ENDPOINT_URL="http://127.0.0.1:$moto_port" AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test \
  AWS_SECRET_ACCESS_KEY=test AWS_EC2_METADATA_DISABLED=true
eval "$("$baton" bootstrap --prefix starter)"
# An agents file whose agent lists the project's own tool: a function whose catalog lacks it
# fails its start-up. A model endpoint that refuses connections, tried once: the step thinks,
# and fails there, the run left waiting for the provider.
export BATON_AGENTS_JSON='{"agents": {"reader": {"system": "You read repositories.", "tools": ["github_read"]}}}'
export OPENAI_BASE_URL="http://127.0.0.1:$(free_port)/v1" BATON_LLM_MAX_RETRIES=0 RUST_LOG=warn

rt_port=$(free_port)
(cd "$dir" && exec cargo lambda watch --only-lambda-apis --invoke-address 127.0.0.1 \
  --invoke-port "$rt_port") >"$work/runtime.log" 2>&1 &
pids+=($!)
wait_port "$rt_port"

fn_pid=
serve() { # FUNCTION: its packaged bootstrap, the only one the runtime API hands events to
  [[ -n "$fn_pid" ]] && { kill "$fn_pid" 2>/dev/null || true; wait "$fn_pid" 2>/dev/null || true; }
  AWS_LAMBDA_FUNCTION_VERSION=1 AWS_LAMBDA_FUNCTION_MEMORY_SIZE=1024 \
    AWS_LAMBDA_RUNTIME_API="http://127.0.0.1:$rt_port/.rt" AWS_LAMBDA_FUNCTION_NAME=_ \
    "$dir/.aws-sam/build/$1/bootstrap" >>"$work/functions.log" 2>&1 &
  fn_pid=$!
  pids+=("$fn_pid")
}
invoke() { # EVENT-FILE → the response JSON
  cargo lambda invoke --invoke-address 127.0.0.1 --invoke-port "$rt_port" --output-format json \
    _ --data-file "$1" 2>>"$work/invoke.log"
}
check() { # name json python-expression-over-r
  if python3 -c "import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if ($3) else 1)" "$2"; then
    echo "ok   $1"
  else
    echo "FAIL $1: $2" >&2
    tail -20 "$work/functions.log" "$work/invoke.log" >&2
    exit 1
  fi
}
body() { python3 -c "import json,sys; print(json.loads(json.loads(sys.argv[1])['body'])$2)" "$1"; }

# The project's api: a run of its own agent (one its tools crate adds in code).
python3 - "$root/tests/events/api-create-run.json" "$work/create.json" <<'PY'
import json, sys
event = json.load(open(sys.argv[1]))
event["body"] = json.dumps({"prompt": "What is in the README?", "agent": "repo_assistant",
                            "github": {"repo": "acme/shop", "ref": "main"}})
event["isBase64Encoded"] = False
json.dump(event, open(sys.argv[2], "w"))
PY
serve ApiFunction
r=$(invoke "$work/create.json")
check "the project's api: POST /runs of its own agent → 202" "$r" 'r["statusCode"] == 202'
run_id=$(body "$r" '["runId"]')

# Its orchestrator: the run's start, as SQS hands it over. The model is unreachable, so the
# step fails after it read the run and its agent: the message is reported failed, in order.
sed "s/RUN_ID/$run_id/g" "$root/tests/events/steps-batch.json" >"$work/steps.json"
serve OrchestratorFunction
r=$(invoke "$work/steps.json")
check "the project's orchestrator: the run's step, failed at the model (FIFO group)" "$r" \
  'sorted(f["itemIdentifier"] for f in r["batchItemFailures"]) == ["m1", "m2"]'

sed "s/run_00000000000000000000000000000000/$run_id/" "$root/tests/events/api-get-run.json" >"$work/get.json"
serve ApiFunction
r=$(invoke "$work/get.json")
check "the run of the project's agent waits for the model provider" "$r" \
  'json.loads(r["body"])["agent"] == "repo_assistant" and json.loads(r["body"])["lastError"]["provider"] is True'
echo "starter: the packaged functions served their events"
