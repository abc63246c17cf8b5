#!/usr/bin/env bash
# Creates, in LocalStack or moto, the resources template.yaml declares (same names, from the
# prefix BATON_PREFIX, default `baton`), and prints the environment the functions read.
# Idempotent: running it twice is fine. Needs AWS_ENDPOINT_URL (e.g. http://127.0.0.1:5000)
# and any credentials (AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1).
#
#   eval "$(infra/local/bootstrap.sh)"
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${AWS_ENDPOINT_URL:?set AWS_ENDPOINT_URL to the emulator, e.g. http://127.0.0.1:5000}"
export AWS_REGION=${AWS_REGION:-us-east-1} AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}
source scripts/lib.sh
baton=$(baton_bin)
exec "$baton" bootstrap --prefix "${BATON_PREFIX:-baton}"
