#!/usr/bin/env python3
"""baton-sdk's public API — its own items and the members of every item it re-exports from
Baton's core and engine — against the API as released (shared/sdk/public-api.txt).

cargo-public-api lists a crate's public items, one a line, from its rustdoc JSON; it shows a
re-export as a `pub use` line alone, and most of baton-sdk is re-exports. So the lists of
baton-core's and baton-engine's public items are read too, and of them kept what belongs to
an item baton-sdk re-exports (its fields, variants, methods, trait impls). A trait's method
without a default is marked `(required)`: adding one breaks every implementor.

    scripts/sdk-api.py check    exit 1 if a line of the release is gone or changed (a breaking
                                change), or a required trait method was added; additions are
                                listed
    scripts/sdk-api.py bless    at a release: writes the current API as the released one
    scripts/sdk-api.py install  only installs cargo-public-api (CI, meanwhile)

The rustdoc JSON is made with this toolchain (`RUSTC_BOOTSTRAP=1`: its JSON output is
unstable); cargo-public-api is installed under the target directory if missing.
"""
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RELEASED = ROOT / "shared/sdk/public-api.txt"
PUBLIC_API = "0.52.0"
CRATES = ("baton-sdk", "baton-core", "baton-engine")


def target_dir():
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                          cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return pathlib.Path(json.loads(meta)["target_directory"])


def tools():
    """cargo-public-api on PATH, installed under the target directory if it is not."""
    root = target_dir() / "tools"
    env = dict(os.environ, PATH=f"{root / 'bin'}:{os.environ['PATH']}")
    have = subprocess.run(["cargo", "public-api", "--version"], env=env,
                          capture_output=True, text=True)
    if PUBLIC_API not in have.stdout:
        print(f"sdk-api: installing cargo-public-api {PUBLIC_API} under {root}", file=sys.stderr)
        subprocess.run(["cargo", "install", "-q", "--locked", "--root", str(root),
                        "cargo-public-api", "--version", PUBLIC_API], check=True)
    return env


def rustdoc_json():
    """The three crates' rustdoc JSON, made now; the directory that holds it."""
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    for crate in CRATES:
        subprocess.run(["cargo", "rustdoc", "-q", "-p", crate, "--",
                        "-Zunstable-options", "--output-format", "json"],
                       cwd=ROOT, env=env, check=True)
    return target_dir() / "doc"


ENV = None


def listing(json_path):
    out = subprocess.run(
        ["cargo", "public-api", "--rustdoc-json", str(json_path), "--omit", "blanket-impls"],
        env=ENV, check=True, capture_output=True, text=True).stdout
    return [l for l in out.splitlines() if l.strip()]


def item_path(line):
    """The path of the item a line is about (an impl's: the type it is for)."""
    l = re.sub(r"^(#\[[^\]]*\]\s*)+", "", line)
    if l.startswith("impl"):
        m = re.search(r" for ([\w:]+)", l) or re.match(r"impl(?:<[^>]*>)? ([\w:]+)", l)
        return m.group(1) if m else ""
    m = re.search(r"(baton_\w+(?:::\w+)+)", l)
    return m.group(1) if m else ""


def reexported(sdk):
    """(crate, name) of every item baton-sdk re-exports from another Baton crate."""
    names = set()
    for item in sdk["index"].values():
        use = item["inner"].get("use")
        if not use or use.get("id") is None:
            continue
        path = sdk["paths"].get(str(use["id"]), {}).get("path", [])
        if path and path[0] in ("baton_core", "baton_engine"):
            names.add((path[0], path[-1]))
    return names


def required(doc, names=None):
    """(trait, method) of the trait methods without a default: of the traits named (all of
    the crate's when `names` is None)."""
    out = set()
    crate = doc["index"][str(doc["root"])]["name"]
    for item in doc["index"].values():
        tr = item["inner"].get("trait")
        if not tr or (names is not None and (crate, item.get("name")) not in names):
            continue
        for i in tr["items"]:
            m = doc["index"].get(str(i))
            f = m and m["inner"].get("function")
            if f is not None and not f.get("has_body", True):
                out.add((item["name"], m["name"]))
    return out


def mark(line, req):
    segs = item_path(line).split("::")
    if line.startswith("pub fn") and len(segs) >= 2 and (segs[-2], segs[-1]) in req:
        return line + " (required)"
    return line


def current(docs):
    sdk = json.loads((docs / "baton_sdk.json").read_text())
    names = reexported(sdk)
    own = required(sdk)
    lines = {mark(l, own) for l in listing(docs / "baton_sdk.json")}
    for crate in ("baton_core", "baton_engine"):
        doc = json.loads((docs / f"{crate}.json").read_text())
        req = required(doc, names)
        ours = {n for c, n in names if c == crate}
        for line in listing(docs / f"{crate}.json"):
            segs = item_path(line).split("::")
            if segs[0] == crate and ours.intersection(segs[1:]):
                lines.add(mark(line, req))
    return sorted(lines)


def main():
    global ENV
    if len(sys.argv) != 2 or sys.argv[1] not in ("check", "bless", "install"):
        sys.exit(__doc__)
    ENV = tools()
    if sys.argv[1] == "install":
        return
    now = current(rustdoc_json())
    if sys.argv[1] == "bless":
        RELEASED.write_text("\n".join(now) + "\n")
        print(f"sdk-api: {len(now)} lines written to {RELEASED.relative_to(ROOT)}")
        return
    released = [l for l in RELEASED.read_text().splitlines() if l.strip()]
    gone = sorted(set(released) - set(now))
    added = sorted(set(now) - set(released))
    for line in added:
        print(f"sdk-api: added: {line}")
    breaking = gone + [l for l in added if l.endswith("(required)")]
    for line in gone:
        print(f"sdk-api: BREAKING: gone or changed: {line}", file=sys.stderr)
    for line in added:
        if line.endswith("(required)"):
            print(f"sdk-api: BREAKING: a method every implementor must add: {line}",
                  file=sys.stderr)
    if breaking:
        sys.exit(f"sdk-api: {len(breaking)} breaking changes against the release "
                 f"({RELEASED.relative_to(ROOT)}); a release that means them is a new major "
                 "version: `scripts/sdk-api.py bless` then")
    print(f"sdk-api: {len(now)} lines, nothing of the release broken ({len(added)} added)")


main()
