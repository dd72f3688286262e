"""The user documentation holds together: every relative link in README.md and docs/*.md names a file of the
repository, and every #anchor a heading (or an explicit <a id>) of the page it points at. User pages (all but the
developer pages) also keep to what a user can follow: no links out of the repository's tree, no internal issue
numbers, no paths into tests/. Spark-free, reads text files only."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEVELOPER_PAGES = {"internals.md", "testing.md"}  # may name the test suite's files and harness

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((i, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # keeps letters, digits, '_', '-', spaces
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in _prose_lines(page.read_text()):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(EXPLICIT_ANCHOR.findall(line))
    return found


def links(page: Path) -> list[tuple[int, str]]:
    out = []
    for i, line in _prose_lines(page.read_text()):
        code_free = re.sub(r"`[^`]*`", "", line)
        out += [(i, t) for t in LINK.findall(code_free)]
        out += [(i, t) for t in IMAGE.findall(code_free)]
    return out


def _broken(page: Path) -> list[str]:
    bad = []
    for line, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{line}: {target}"
        if not dest.is_relative_to(ROOT):
            bad.append(f"{where}: points outside the repository")
        elif not dest.exists():
            bad.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where}: no heading or <a id> '{anchor}' in {dest.relative_to(ROOT)}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    assert _broken(page) == []


USER_PAGE_RULES = [
    (re.compile(r"\.\./shared/|\bwire doc\b|\bwal doc\b"), "a document outside the repository"),
    (re.compile(r"(?<![\w/])tests/[\w./-]*"), "a path into the test suite (developer pages only)"),
    (re.compile(r"(?<![\w/&#])#\d+\b|\b[Ii]ssue \d+\b"), "an internal issue number"),
]


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in DEVELOPER_PAGES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_stay_inside_what_a_user_can_follow(page):
    bad = []
    for i, line in _prose_lines(page.read_text()):
        text = re.sub(r"\]\([^)]*\)", "]", line)  # link targets (public URLs may hold numbers) are not prose
        text = re.sub(r"<!--.*?-->", "", text)
        for rule, what in USER_PAGE_RULES:
            bad += [f"{page.relative_to(ROOT)}:{i}: {m.group(0)!r}: {what}" for m in rule.finditer(text)]
    assert bad == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_document_outside_the_repository(page):
    """Developer pages too: ``../shared/`` (the project's working notes) is not in a checkout."""
    bad = [f"{page.relative_to(ROOT)}:{i}: {m.group(0)!r}" for i, line in enumerate(page.read_text().splitlines(), 1)
           for m in re.finditer(r"\.\./shared/\S*", line)]
    assert bad == []


def test_the_checker_finds_a_broken_anchor_and_a_missing_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title\n\n## Some `code` heading?\n\n```\n[x](nowhere.md)\n```\n"
                                   "[ok](#some-code-heading) [bad](#nope) [gone](b.md) [web](https://x.org/#1)\n")
    got = _broken(tmp_path / "a.md")
    assert [g.split(": ", 1)[1] for g in got] == ["#nope: no heading or <a id> 'nope' in a.md",
                                                 "b.md: no such file"]
    assert slug("Is the table right? `msgstream mirror verify`") == "is-the-table-right-msgstream-mirror-verify"
    assert slug("Reading without Spark: `read_arrow`") == "reading-without-spark-read_arrow"
