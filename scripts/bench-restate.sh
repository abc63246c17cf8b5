#!/usr/bin/env bash
# The peer benchmark: Baton and Restate on one workload, side by side in one sitting, so the
# ratio holds whatever the machine's speed today. The workload is a durable loop of 1 KB
# echo steps: `baton bench --runs R --iterations N` (R runs of a scripted agent created
# through baton dev's API, each iteration one `echo` tool call with a 1 KB argument, every
# commit synced to disk), and on Restate R invocations through its ingress of a service
# whose handler journals N 1 KB echoes with `ctx.run`: by default through Restate's Rust SDK
# (scripts/peer/restate-rust), or its Python SDK with PEER_SDK=python
# (scripts/peer/restate_loop.py, served by hypercorn). Restate syncs its log too
# (rocksdb-disable-wal-fsync = false by default).
#
# usage: scripts/bench-restate.sh [RUNS [ITERATIONS [ROUNDS]]]   (default 100 1000 2)
# Installs what it needs under the target directory: Restate's server from npm; the Rust
# peer, built release like Baton (PEER_PROFILE=dev: a debug build, for a smoke run), or the
# Python SDK and hypercorn from PyPI in a virtualenv; and a release build of `baton` (or
# give one: BATON_BIN=path).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

runs=${1:-100} n=${2:-1000} rounds=${3:-2}
sdk=${PEER_SDK:-rust} profile=${PEER_PROFILE:-release}
case "$sdk" in rust | python) ;; *) echo "PEER_SDK is rust or python, not $sdk" >&2; exit 2 ;; esac
case "$profile" in release | dev) ;; *) echo "PEER_PROFILE is release or dev, not $profile" >&2; exit 2 ;; esac
RESTATE_VERSION=1.7.12 SDK_VERSION=1.3.0 HYPERCORN_VERSION=0.18.0
peer="$(target_dir)/peer"
mkdir -p "$peer"

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) platform=linux-x64 ;;
  Linux/aarch64) platform=linux-arm64 ;;
  Darwin/x86_64) platform=darwin-x64 ;;
  Darwin/arm64) platform=darwin-arm64 ;;
  *) echo "Restate's npm package has no server for $(uname -s) $(uname -m)" >&2; exit 2 ;;
esac
server="$peer/node_modules/@restatedev/restate-server-$platform/bin/restate-server"
if [[ ! -x "$server" ]]; then
  echo "Installing Restate's server $RESTATE_VERSION from npm under $peer" >&2
  npm install --silent --no-audit --no-fund --prefix "$peer" "@restatedev/restate-server@$RESTATE_VERSION" >&2
fi
# Python's virtualenv serves the driver in any case (the standard library is all it uses).
if [[ ! -x "$peer/venv/bin/python" ]]; then
  python3 -m venv "$peer/venv"
fi
if [[ "$sdk" == python && ! -x "$peer/venv/bin/hypercorn" ]]; then
  echo "Installing restate-sdk $SDK_VERSION and hypercorn in $peer/venv" >&2
  "$peer/venv/bin/pip" install -q "restate-sdk==$SDK_VERSION" "hypercorn==$HYPERCORN_VERSION" >&2
fi
if [[ "$sdk" == rust ]]; then
  echo "Building the Rust peer (scripts/peer/restate-rust, $profile)" >&2
  CARGO_TARGET_DIR="$peer/rust-target" cargo build -q --locked --profile "$profile" \
    --manifest-path scripts/peer/restate-rust/Cargo.toml >&2
  loop_bin="$peer/rust-target/$([[ $profile == dev ]] && echo debug || echo release)/restate-loop"
fi
if [[ -n "${BATON_BIN:-}" ]]; then
  baton="$BATON_BIN"   # CI's smoke run uses the debug build it already has
else
  echo "Building baton (release)" >&2
  cargo build -q --release -p baton-cli --bin baton >&2
  baton="$(target_dir)/release/baton"
fi

data="$(mktemp -d)"
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$data"
}
trap stop EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ingress=$(free_port) admin=$(free_port) node=$(free_port) svc=$(free_port)

RESTATE_DISABLE_TELEMETRY=true RESTATE_LOG_FILTER=error \
  RESTATE_INGRESS__BIND_ADDRESS="127.0.0.1:$ingress" RESTATE_ADMIN__BIND_ADDRESS="127.0.0.1:$admin" \
  "$server" --no-logo --base-dir "$data/restate" --listen-mode tcp --bind-address "127.0.0.1:$node" \
  >"$data/restate.log" 2>&1 &
pids+=($!)
restate_pid=$!
if [[ "$sdk" == rust ]]; then
  # One process on a multi-thread runtime, which uses every core, as Baton's worker does.
  "$loop_bin" "127.0.0.1:$svc" >"$data/service.log" 2>&1 &
else
  # One service process per core, as Baton's worker uses every core.
  cat >"$data/hypercorn.toml" <<TOML
bind = "127.0.0.1:$svc"
h2_max_concurrent_streams = 2147483647
keep_alive_max_requests = 2147483647
keep_alive_timeout = 2147483647
workers = $(getconf _NPROCESSORS_ONLN)
TOML
  (cd scripts/peer && exec "$peer/venv/bin/hypercorn" --config "$data/hypercorn.toml" restate_loop:app) \
    >"$data/service.log" 2>&1 &
fi
pids+=($!)
svc_pid=$!

for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$admin/health" >/dev/null && curl -sf -o /dev/null "http://127.0.0.1:$svc/discover" -H 'accept: application/vnd.restate.endpointmanifest.v1+json' && break
  sleep 0.2
done
curl -sf -X POST "http://127.0.0.1:$admin/deployments" -H 'content-type: application/json' \
  -d "{\"uri\": \"http://127.0.0.1:$svc\"}" >/dev/null ||
  { echo "Restate did not register the service; its log:" >&2; tail -20 "$data/restate.log" >&2; exit 1; }

for round in $(seq "$rounds"); do
  echo "round $round: baton bench --runs $runs --iterations $n" >&2
  b=$("$baton" bench --runs "$runs" --iterations "$n")
  echo "round $round: restate ($sdk SDK), $runs invocations of $n steps" >&2
  r=$("$peer/venv/bin/python" scripts/peer/drive_restate.py "http://127.0.0.1:$ingress" "$runs" "$n" "$restate_pid" "$svc_pid")
  python3 - "$b" "$r" "$sdk" <<'PY'
import json, sys
b, r = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"baton": {k: b[k] for k in ("runs", "iterations", "wall_s", "steps", "steps_per_s", "cpu_ms_per_step", "cache_hit_rate", "bytes_read_per_step_with_api", "written", "fsyncs_per_step", "disk_sync", "cpu_steal_pct")},
                  "restate": dict(r, sdk=sys.argv[3]),
                  "baton_over_restate": round(b["steps_per_s"] / r["steps_per_s"], 2)}))
PY
done
