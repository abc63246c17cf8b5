# Shared by the repository's scripts (source it): where cargo puts binaries, honouring
# CARGO_TARGET_DIR and .cargo/config.toml as cargo itself does.

# The target directory cargo uses for this workspace.
target_dir() {
  cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

# Builds the `baton` CLI (cargo shows its progress, which matters on a cold first build) and
# prints the path of the binary.
baton_bin() {
  if [[ ! -x "$(target_dir)/debug/baton" ]]; then
    echo "Building the baton binary first (cargo build -p baton-cli): a few minutes the first time, about ten on 2 cores." >&2
  fi
  cargo build -p baton-cli --bin baton >&2
  printf '%s/debug/baton\n' "$(target_dir)"
}

# A free port on loopback (the OS picks it), for a server a script starts.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits (up to a minute) until something listens on loopback port $1.
wait_port() { for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.2; done; echo "nothing on port $1" >&2; return 1; }
