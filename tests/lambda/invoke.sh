#!/usr/bin/env bash
# The Lambda layer: serves the functions with `cargo lambda watch` against moto's server
# on loopback (or the emulator at BATON_TEST_AWS_ENDPOINT: tests/localstack/run.sh), invokes each with the sample events in tests/events/, and asserts the answers
# (including a partial batch failure) and the spans each sends before its invocation
# returns (to an OTLP receiver); then starts each function's binary with the
# environment template.yaml gives it (tests/lambda/start_from_template.py). Needs
# cargo-lambda and moto on PATH (.ci/run installs both); on moto, measures each function's
# memory at its worst case (tests/lambda/memory.py). Exits non-zero on the first wrong
# answer.
#
#   tests/lambda/invoke.sh                 everything above
#   tests/lambda/invoke.sh --memory-only   on moto, only the memory measurement (CI runs the
#                                          invocations against LocalStack: tests/localstack/run.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
memory_only=false
case "${1:-}" in
  "") ;;
  --memory-only) memory_only=true ;;
  *) echo "usage: tests/lambda/invoke.sh [--memory-only]" >&2; exit 2 ;;
esac
if $memory_only && [ -n "${BATON_TEST_AWS_ENDPOINT:-}" ]; then
  echo "--memory-only measures on moto: unset BATON_TEST_AWS_ENDPOINT" >&2; exit 2
fi

source scripts/lib.sh

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

if [ -n "${BATON_TEST_AWS_ENDPOINT:-}" ]; then
  endpoint=$BATON_TEST_AWS_ENDPOINT
else
  moto_port=$(free_port)
  moto_server -H 127.0.0.1 -p "$moto_port" >"$work/moto.log" 2>&1 &
  pids+=($!)
  wait_port "$moto_port"
  endpoint="http://127.0.0.1:$moto_port"
fi

export AWS_ENDPOINT_URL="$endpoint" AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test \
  AWS_SECRET_ACCESS_KEY=test AWS_EC2_METADATA_DISABLED=true
# The test command's build (its features: `--tests` unifies the test crates' dev-dependencies
# as `cargo test --workspace` does), so that after it only the five functions are linked
# here, not their dependencies built a second time with other features. `sam build` (.ci/run)
# builds each function alone, as it deploys.
cargo build --workspace --bins --tests
eval "$("$(target_dir)/debug/baton" bootstrap --prefix baton)"
# `cargo lambda watch` gives every function one environment: tell the step functions that
# the sample dead-letter event's queue is their dead-letter queue.
BATON_DEAD_LETTER_QUEUE_ARN=$(python3 -c 'import json; print(json.load(open("tests/events/steps-dead-letter.json"))["Records"][0]["eventSourceARN"])')
export BATON_DEAD_LETTER_QUEUE_ARN
# A model endpoint that refuses connections, tried once: a step that must think fails.
export OPENAI_BASE_URL="http://127.0.0.1:$(free_port)/v1" BATON_LLM_MAX_RETRIES=0 RUST_LOG=warn

memory() { # each function's most resident memory at its worst case (see below)
  MEMORY_LOG_DIR="$work" python3 tests/lambda/memory.py "$(target_dir)/debug" ||
    { tail -n 20 "$work"/memory-*.log >&2; exit 1; }
}
if $memory_only; then
  memory
  exit 0
fi

# Traces: every function sends its spans to a test receiver that decodes them with the
# official protobuf definitions (tests/otlp/receiver.py), before each invocation returns.
otlp_python="$(target_dir)/otlp-receiver/bin/python"
if ! "$otlp_python" -c 'import opentelemetry.proto' 2>/dev/null; then
  python3 -m venv "$(target_dir)/otlp-receiver"
  "$otlp_python" -m pip install -q --disable-pip-version-check 'opentelemetry-proto==1.45.2' 'protobuf>=5.29,<8'
fi
"$otlp_python" -u tests/otlp/receiver.py --port 0 --out "$work/spans.jsonl" >"$work/otlp.url" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/otlp.url" ] && break; sleep 0.1; done
OTEL_EXPORTER_OTLP_ENDPOINT=$(head -1 "$work/otlp.url")
export OTEL_EXPORTER_OTLP_ENDPOINT
spans() { python3 -c 'import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])]))' "$work/spans.jsonl" 2>/dev/null || echo '[]'; }

# An agents file in the environment, as the template passes `AgentsJson`: every function
# that builds a catalog parses it at start-up (a bad one fails every invocation below). Its
# agent lists a built-in tool: Baton's functions ship no others (a project's own Rust tools
# are its own functions', `baton new`; scripts/starter.sh invokes one of those).
export BATON_AGENTS_JSON='{"agents": {"reader": {"system": "You ask people.", "tools": ["request_human_feedback"]}}}'

watch_port=$(free_port)
cargo lambda watch --invoke-address 127.0.0.1 --invoke-port "$watch_port" >"$work/watch.log" 2>&1 &
pids+=($!)
wait_port "$watch_port"

invoke() { # function event-file → the response JSON on stdout
  cargo lambda invoke --invoke-address 127.0.0.1 --invoke-port "$watch_port" --output-format json \
    "$1" --data-file "$2" 2>>"$work/invoke.log"
}
check() { # name json python-expression-over-r
  if python3 -c "import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if ($3) else 1)" "$2"; then
    echo "ok   $1"
  else
    echo "FAIL $1: $2" >&2; tail -20 "$work/watch.log" >&2; exit 1
  fi
}
body() { python3 -c "import json,sys; print(json.loads(json.loads(sys.argv[1])['body'])$2)" "$1"; }

# api: every route, a bad request, a request without identity.
r=$(invoke api tests/events/api-health.json);                 check "api GET /health" "$r" 'r["statusCode"] == 200'
r=$(invoke api tests/events/api-create-run.json);             check "api POST /runs" "$r" 'r["statusCode"] == 202'
run_id=$(body "$r" '["runId"]')
r=$(invoke api tests/events/api-create-run-bad.json);         check "api POST /runs (bad JSON) → 400" "$r" 'r["statusCode"] == 400 and "invalid" in r["body"]'
r=$(invoke api tests/events/api-create-run-no-identity.json); check "api POST /runs (no identity) → 401" "$r" 'r["statusCode"] == 401'
for ev in get-run timeline message cancel; do
  sed "s/run_00000000000000000000000000000000/$run_id/" "tests/events/api-$ev.json" >"$work/api-$ev.json"
done
r=$(invoke api "$work/api-get-run.json");  check "api GET /runs/{id}" "$r" 'r["statusCode"] == 200 and json.loads(r["body"])["status"] == "queued"'
r=$(invoke api "$work/api-timeline.json"); check "api GET /runs/{id}/timeline" "$r" 'r["statusCode"] == 200'
r=$(invoke api "$work/api-message.json");  check "api POST /runs/{id}/messages (active run) → 202, queued" "$r" 'r["statusCode"] == 202 and json.loads(r["body"])["queued"] is True'
r=$(invoke api tests/events/api-list-ctas.json);  check "api GET /ctas" "$r" 'r["statusCode"] == 200 and json.loads(r["body"])["ctas"] == []'
r=$(invoke api tests/events/api-get-cta.json);    check "api GET /ctas/{id} (unknown) → 404" "$r" 'r["statusCode"] == 404'
r=$(invoke api tests/events/api-answer-cta.json); check "api POST /ctas/{id}/response (unknown) → 404" "$r" 'r["statusCode"] == 404'

# orchestrator: the run's start fails (the model is unreachable), so its later message in the
# same group is reported failed too; another run's stale message and a poison message succeed.
sed "s/RUN_ID/$run_id/g" tests/events/steps-batch.json >"$work/steps-batch.json"
r=$(invoke orchestrator "$work/steps-batch.json")
check "orchestrator partial batch failure (FIFO group)" "$r" 'sorted(f["itemIdentifier"] for f in r["batchItemFailures"]) == ["m1", "m2"]'
# The failed step's span reached the receiver before the invocation returned: under the
# run's span, its status the error, with the function's resource attributes.
check "orchestrator: the failed step's span, sent before the invocation returned" "$(spans)" \
  "any(s['name'] == 'step orchestrator' and s['status'] == 'STATUS_CODE_ERROR' and s['attributes']['baton.run.id'] == '$run_id' and s['attributes']['error.type'] == 'step_failed' and s['attributes']['baton.step.input'] == 'start' and s['resource'].get('cloud.platform') == 'aws_lambda' for s in r)"
r=$(invoke subagent tests/events/subagent-steps-batch.json)
check "subagent (unknown run) acknowledged" "$r" 'r["batchItemFailures"] == []'
r=$(invoke events tests/events/cta-inbox-batch.json)
check "events (unknown and invalid events rejected, not retried)" "$r" 'r["batchItemFailures"] == []'
# A dead-lettered step whose deliveries all failed because the model is unreachable (the
# run's start, four times now) goes back to its queue: a provider's outage fails no run, which
# waits, its last error the provider's, and goes on once it answers (a failure of the run's
# own ends it: tests/tests/service.rs).
for _ in 1 2 3; do
  r=$(invoke orchestrator "$work/steps-batch.json")
  check "orchestrator start failing again" "$r" '"m1" in [f["itemIdentifier"] for f in r["batchItemFailures"]]'
done
sed "s/RUN_ID/$run_id/g" tests/events/steps-dead-letter.json >"$work/steps-dead-letter.json"
r=$(invoke orchestrator "$work/steps-dead-letter.json"); check "orchestrator dead letter" "$r" 'r["batchItemFailures"] == []'
check "orchestrator: four failed deliveries, and no run failed" "$(spans)" \
  "len({s['span_id'] for s in r if s['attributes'].get('error.type') == 'step_failed' and s['attributes']['baton.run.id'] == '$run_id'}) == 4 and not any(s['name'] == 'invoke_agent orchestrator' and s['status'] == 'STATUS_CODE_ERROR' and s['attributes']['baton.run.id'] == '$run_id' for s in r)"
r=$(invoke api "$work/api-get-run.json")
check "the dead-lettered run waits for the model provider" "$r" 'json.loads(r["body"])["status"] == "queued" and json.loads(r["body"])["lastError"]["provider"] is True'
r=$(invoke api "$work/api-cancel.json"); check "api POST /runs/{id}/cancel (waiting) → 202" "$r" 'r["statusCode"] == 202'
echo "cargo lambda invoke: all passed"

# Each function's own binary, started with exactly the environment template.yaml gives it
# (PublicUrl set and unset, a Bedrock model, an agents file): a variable or a secret the
# template forgets fails its cold start here, as it would on AWS.
python3 tests/lambda/start_from_template.py "$(target_dir)/debug" "${BATON_TEMPLATE:-template.yaml}"

# Each function's most resident memory at its worst case (the largest context budget, 20
# runs past the timeline cache, 6 MB API replies), against its MemorySize. Once, on moto.
if [ -z "${BATON_TEST_AWS_ENDPOINT:-}" ]; then
  memory
fi
