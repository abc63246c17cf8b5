#!/usr/bin/env bash
# Checks that the five Lambda functions build every third-party crate they share with the
# same features. `sam build` builds each function alone and cargo resolves features per
# build: a crate that one function asks more of is compiled again for it, and with it
# everything above it (the AWS SDK, most of a function's build). shared/lambda/Cargo.toml names
# the union; this says when a dependency change needs it widened.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
functions=(api events live orchestrator subagent)
for f in "${functions[@]}"; do
  # "name version|features" of each third-party crate (workspace members carry a path).
  cargo tree -p "$f" -e normal --prefix none -f '{p}|{f}' --target x86_64-unknown-linux-gnu \
    | sed 's/ (\*)$//' | grep -v ' (/' | sort -u >"$work/$f"
done
# The crates all five use, and for each, the features each function gives it.
cut -d'|' -f1 "$work/api" | sort -u >"$work/common"
for f in "${functions[@]}"; do
  cut -d'|' -f1 "$work/$f" | sort -u | comm -12 "$work/common" - >"$work/next"
  mv "$work/next" "$work/common"
done
status=0
while read -r crate; do
  seen=$(for f in "${functions[@]}"; do grep -F "$crate|" "$work/$f" | head -1; done | sort -u)
  if [ "$(wc -l <<<"$seen")" -gt 1 ]; then
    echo "$crate is built with different features by the functions:" >&2
    for f in "${functions[@]}"; do echo "  $f: $(grep -F "$crate|" "$work/$f" | head -1 | cut -d'|' -f2)" >&2; done
    status=1
  fi
done <"$work/common"
[ $status -eq 0 ] && echo "the functions share $(wc -l <"$work/common") crates, each with one feature set"
exit $status
