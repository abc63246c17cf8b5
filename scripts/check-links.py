#!/usr/bin/env python3
"""Checks that every relative link in README.md, CHANGELOG.md and docs/*.md resolves: the file exists and,
for a `#fragment`, the target has a heading with that GitHub anchor. Exit 1 on the first
report of broken links, listing them all."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
pages = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]


def anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    out = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


broken = []
for page in pages:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(root)}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{page.relative_to(root)}: {target}: no such heading")
for b in broken:
    print(b)
print(f"links: {len(pages)} pages, {len(broken)} broken")
sys.exit(1 if broken else 0)
