#!/usr/bin/env bash
# The AWS scenario tests and the Lambda invoke tests against LocalStack, in host mode (no
# Docker), as CI runs them: starts LocalStack on a free port (installing it under target/
# the first time: tests/localstack/localstack.sh), runs the tests against it, stops it.
#
#   tests/localstack/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Taken first, then evaluated: `eval "$(...)"` would hide a failed start.
env=$(tests/localstack/localstack.sh start "$port")
eval "$env"
trap 'tests/localstack/localstack.sh stop' EXIT
# Every test shares this one LocalStack; each names its resources its own way.
export BATON_TEST_AWS_ENDPOINT=$AWS_ENDPOINT_URL

echo "== LocalStack $AWS_ENDPOINT_URL: a smoke check of each service"
"${CARGO_TARGET_DIR:-target}/localstack/venv/bin/python" tests/localstack/probe.py
echo "== LocalStack: the AWS scenarios and the adapters' port contracts"
# `--workspace`: the test command's build, features and all (`-p baton-tests` alone would
# build the libraries again with that crate's features only). Calm: the test command ran
# the scenarios under the fault layer; here they meet LocalStack's own pace.
BATON_TEST_FAULTS=0 cargo test --workspace --test e2e --test crashes -- \
  aws_flow:: aws_questions:: aws_batches:: aws_outages:: question_defaults:: \
  aws_crashes:: follow_up_crashes:: plans:: files:: contract:: secret_rotation:: \
  service::a_run_past_its_context_budget releases::every_releases_dynamodb \
  quotas::aws:: assignees::aws assignees::notified_aws assignees::bus assignees::a_notification_given_up \
  calls_once::a_reply_is_asked_for_once_and_a_once_call_runs_at_most_once_on_the_aws_host \
  calls_once::a_reply_whose_call step_errors::a_reply_whose_commit_is_throttled_or_conflicts_is_not_asked_for_again_on_aws \
  budgets::aws:: \
  --skip aws_batches::ten_runs_in_one_batch
echo "== LocalStack: the Lambda invoke tests (tests/lambda/invoke.sh)"
tests/lambda/invoke.sh
