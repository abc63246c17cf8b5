#!/usr/bin/env python3
"""Checks what the docs say about the code where a check is cheap, so that they cannot drift:

- every count of Lambda functions written in words ("the five functions") in the README, the
  docs, the manifests and the code's comments matches the functions `template.yaml` declares;
- every repository path a doc names in backquotes (`shared/core/src/engine/mod.rs`,
  `tests/lambda/invoke.sh`) exists;
- the README's crate map (`<!-- crate-map -->`) names every crate of the workspace once, and
  each uses only crates on floors below its own (so the adapters, on one floor, none of each
  other), as `cargo metadata` reads the manifests;
- docs/design.md's table of effects names every variant of the engine's `Effect`.

Exit 1 listing every mismatch. Run from anywhere: `python3 scripts/check-docs.py`."""
import json
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parent.parent
problems: list[str] = []

NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten".split())}
TOP = ("shared/", "functions/", "tests/", "scripts/", "docs/", "cli/", "infra/",
       "examples/", ".ci/")

docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
prose = [*docs, *sorted(root.glob("shared/*/Cargo.toml")),
         *sorted(root.glob("shared/*/src/**/*.rs")), *sorted(root.glob("functions/*/src/*.rs"))]


def rel(p: pathlib.Path) -> str:
    return str(p.relative_to(root))


# 1. How many Lambda functions.
template = (root / "template.yaml").read_text()
functions = len(re.findall(r"^\s+Type: AWS::Serverless::Function\s*$", template, re.M))
if functions == 0:
    problems.append("template.yaml: no AWS::Serverless::Function found")
count = re.compile(r"\b(" + "|".join(NUMBERS) + r")\s+(?:Lambda\s+)?functions\b", re.I)
for page in prose:
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for word in count.findall(line):
            if NUMBERS[word.lower()] != functions:
                problems.append(f"{rel(page)}:{n}: says {word} functions; "
                                f"template.yaml declares {functions}")

# 2. Paths the docs name.
for page in docs:
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for path in re.findall(r"`([\w./-]+)`", line):
            if not path.startswith(TOP) or "*" in path or "<" in path:
                continue
            if not (root / path.rstrip("/")).exists():
                problems.append(f"{rel(page)}:{n}: names `{path}`, which does not exist")

# 3. The crate map.
readme = (root / "README.md").read_text()
found = re.search(r"<!-- crate-map -->\n```\n(.*?)```", readme, re.S)
if not found:
    problems.append("README.md: no <!-- crate-map --> block")
else:
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=root,
        check=True, capture_output=True, text=True).stdout)
    packages = {p["name"]: p for p in meta["packages"] if p["name"] != "baton-tests"}
    floor: dict[str, int] = {}
    for line in found.group(1).splitlines():
        head = re.match(r"\s*(\d)\s+(.*)", line)
        if not head:
            continue
        text = re.sub(r"\([^)]*\)", "", head.group(2))
        for name in re.findall(r"[a-z][a-z0-9-]*", text):
            if name in packages:
                if name in floor:
                    problems.append(f"README.md crate map: {name} is on two floors")
                floor[name] = int(head.group(1))
    for name in sorted(set(packages) - set(floor)):
        problems.append(f"README.md crate map: the workspace's {name} is not on it")
    for name, p in packages.items():
        for dep in p["dependencies"]:
            d = dep["name"]
            if dep["kind"] is not None or d not in floor or name not in floor:
                continue
            if floor[d] >= floor[name]:
                problems.append(f"crate map: {name} (floor {floor[name]}) uses {d} "
                                f"(floor {floor[d]})")

# 4. Every effect in docs/design.md's table.
message = (root / "shared/engine/src/message.rs").read_text()
body = re.search(r"pub enum Effect \{\n(.*?)\n\}", message, re.S)
if not body:
    problems.append("shared/engine/src/message.rs: no `pub enum Effect`")
else:
    variants = re.findall(r"^    ([A-Z]\w*)\b", body.group(1), re.M)
    design = (root / "docs/design.md").read_text()
    for v in variants:
        if not re.search(rf"^\| `{v}` \|", design, re.M):
            problems.append(f"docs/design.md: the effects table leaves out `Effect::{v}`")

if problems:
    print("docs drifted from the code:", *problems, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print(f"docs: {functions} functions, paths, the crate map ({len(floor)} crates) and {len(variants)} effects hold")
