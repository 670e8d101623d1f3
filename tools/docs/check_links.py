#!/usr/bin/env python3
"""Checks the relative links of the project's Markdown pages.

Every relative link `[text](path)`, `[text](path#anchor)`, `[text](#anchor)` and reference
definition `[label]: path` in README.md, BENCHMARKS.md and docs/**/*.md (or in the files given
as arguments) must name a file or folder that exists, and its anchor must be a heading of the
Markdown file it names, as GitHub makes anchors: the heading's text lowercased, everything but
letters, digits, spaces, `-` and `_` removed, each space a `-`, and a repeated anchor suffixed
`-1`, `-2`, ... (`<a id="...">` and `<a name="...">` count too). Links inside code spans and
fenced code blocks are not links; `http:`, `https:` and `mailto:` links are not checked.

    python3 tools/docs/check_links.py            # the default pages; exit 1 on a broken link
    python3 tools/docs/check_links.py --all      # every *.md of the repository (not target/)
    python3 tools/docs/check_links.py FILE.md ...

Python 3.8 or later, standard library only.
"""

import os
import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title"): the text may hold one level of brackets; the target may be <...>.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^()\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def default_pages():
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    return [p for p in pages if p.exists()]


def all_pages():
    skip = {"target", ".git", "node_modules"}
    return sorted(p for p in ROOT.rglob("*.md") if not skip & set(p.relative_to(ROOT).parts))


def lines_outside_fences(text):
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
                continue
            if mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark):].strip():
                fence = None
                continue
        if fence is None:
            yield number, line


def heading_text(raw):
    """A heading's text as GitHub renders it: code spans keep their content, links their text,
    emphasis and HTML tags go."""
    text = CODE_SPAN.sub(lambda m: m.group(2), raw)
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("*", "")
    text = re.sub(r"(^|\s)_+|_+(\s|$)", r"\1\2", text)
    return text.strip()


def slug(text):
    kept = []
    for ch in text.lower():
        if ch in " -_" or unicodedata.category(ch)[0] in "LNM":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


_anchor_cache = {}


def anchors_of(path):
    path = path.resolve()
    if path not in _anchor_cache:
        found, seen = set(), {}
        text = path.read_text(encoding="utf-8")
        for _, line in lines_outside_fences(text):
            for m in HTML_ANCHOR.finditer(line):
                found.add(m.group(1))
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(heading_text(m.group(2)))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchor_cache[path] = found
    return _anchor_cache[path]


def links_of(text):
    """(line number, target) of every link outside code."""
    for number, line in lines_outside_fences(text):
        plain = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE_LINK.finditer(plain):
            yield number, m.group(1)
        m = REFERENCE_DEF.match(plain)
        if m:
            yield number, m.group(1)


def rel(path):
    return os.path.relpath(path, ROOT)


def check(page):
    problems = []
    text = page.read_text(encoding="utf-8")
    for number, target in links_of(text):
        target = target.strip("<>")
        if EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        path_part = path_part.split("?", 1)[0]
        where = f"{rel(page)}:{number}: ({target})"
        dest = (page.parent / path_part).resolve() if path_part else page.resolve()
        if path_part.startswith("/"):
            dest = (ROOT / path_part.lstrip("/")).resolve()
        if not dest.exists():
            problems.append(f"{where}: no such file {path_part}")
            continue
        if not anchor:
            continue
        if dest.is_dir() or dest.suffix.lower() not in (".md", ".markdown"):
            problems.append(f"{where}: an anchor into {path_part}, which is not a Markdown file")
            continue
        if anchor not in anchors_of(dest):
            problems.append(f"{where}: no heading with anchor #{anchor} in {rel(dest)}")
    return problems


def main(argv):
    if argv == ["--all"]:
        pages = all_pages()
    else:
        pages = [Path(a).resolve() for a in argv] if argv else default_pages()
    problems, links = [], 0
    for page in pages:
        links += sum(1 for _ in links_of(page.read_text(encoding="utf-8")))
        problems += check(page)
    for p in problems:
        print(p)
    status = "broken" if problems else "ok"
    print(f"check_links: {len(pages)} pages, {links} links, {len(problems)} broken: {status}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
