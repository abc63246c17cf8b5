#!/usr/bin/env bash
# Runs the README's shell recipes as a user would paste them: every ```sh block that follows a
# `<!-- recipe: NAME -->` line, in order, each in a bash of its own from the repository's root
# (`set -e`: a command that fails fails the recipe). A `<!-- recipe: skip (why) -->` block is
# listed with its reason, not run. Blocks without a marker are not recipes (commands with
# placeholders such as an API key: `cli/tests/cli/` starts those configurations itself).
#
# The recipes use what a user's machine would: `cargo install` puts `baton` under the target
# directory here (CARGO_INSTALL_ROOT), on PATH; `baton dev` listens on 127.0.0.1:8787 and its
# data is ./.baton (an existing one is set aside and put back); moto listens on 5000; the team
# recipe's `baton dev` on 8798 and its webhook receiver on 8799.
#
# BATON_RECIPES_INSTALL_DEBUG=1 makes each `cargo install` a debug one (`--debug`): it then
# reuses the `cargo build -p baton-cli` the demo made (same package, features and profile)
# instead of compiling every dependency again. CI sets it: the recipe's commands are what it
# checks, not the optimiser.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
# Absolute: a recipe that builds elsewhere (the starter's project, in a temporary directory)
# shares this target directory, as its text says it may, instead of compiling every
# dependency again there (minutes, and gigabytes of a temporary directory that may be small).
mkdir -p "$(target_dir)"
target=$(cd "$(target_dir)" && pwd)
export CARGO_TARGET_DIR="$target" CARGO_INSTALL_ROOT="$target/recipes"
export PATH="$CARGO_INSTALL_ROOT/bin:$PATH"
unset BATON_TOKEN BATON_ENDPOINT AWS_ENDPOINT_URL
dir="$target/recipes/scripts"
rm -rf "$dir" && mkdir -p "$dir"

for port in 8787 5000 8798 8799; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "recipes: something already listens on 127.0.0.1:$port, which the recipes use" >&2
    exit 1
  fi
done
if [[ -e .baton ]]; then
  mv .baton .baton.before-recipes
  trap 'rm -rf .baton; mv .baton.before-recipes .baton' EXIT
else
  trap 'rm -rf .baton' EXIT
fi

python3 - "$dir" "${BATON_RECIPES_INSTALL_DEBUG:-0}" <<'PY'
import re, sys, pathlib
out = pathlib.Path(sys.argv[1])
install_debug = sys.argv[2] == "1"
text = pathlib.Path("README.md").read_text()
found = re.findall(r"<!-- recipe: ([^>]*?) -->\n```sh\n(.*?)```", text, re.S)
if not found:
    sys.exit("recipes: no recipe in README.md")
for i, (name, body) in enumerate(found):
    name = name.strip()
    if name.startswith("skip"):
        print(f"recipes: not run: {body.splitlines()[0]} … ({name})")
        continue
    if install_debug:
        body = body.replace("cargo install ", "cargo install --debug ")
    (out / f"{i:02d}-{name}.sh").write_text(body)
PY

# The recipes leave Baton's checkout as they found it (the starter's project is written
# outside it): what git sees now is compared after the last one.
before=$(git status --porcelain --untracked-files=all 2>/dev/null || true)

failed=0
failures=()
for script in "$dir"/*.sh; do
  name=$(basename "$script" .sh)
  echo "== recipe ${name#*-}"
  # A session of its own, so that what it leaves running (a `&` it did not kill because a
  # command failed) is stopped with it. What it prints is kept, for a failure's summary.
  setsid bash -e -x "$script" </dev/null > >(tee "$dir/$name.log") 2>&1 &
  pid=$!
  if wait "$pid"; then
    echo "== recipe ${name#*-}: ok"
  else
    echo "== recipe ${name#*-}: FAILED" >&2
    failures+=("$name")
    failed=1
  fi
  kill -- -"$pid" 2>/dev/null || true
  sleep 0.5
done
after=$(git status --porcelain --untracked-files=all 2>/dev/null || true)
if [[ "$before" != "$after" ]]; then
  echo "recipes: the checkout changed:" >&2
  diff <(echo "$before") <(echo "$after") >&2 || true
  failed=1
fi
# A failed recipe's end again, last: CI shows the end of what a run printed.
for name in "${failures[@]}"; do
  echo "== recipe ${name#*-} FAILED; the last 40 lines it printed:" >&2
  tail -n 40 "$dir/$name.log" >&2
done
exit "$failed"
