"""Every link into the docs lands: each relative link of README.md and docs/ names a file that
exists and, after ``#``, a heading of it (GitHub's anchors); and every file of the tree that names
a page of docs/ (a comment, a message, a test) names one that exists, and the heading it quotes
beside it (``docs/<page>.md, "Heading"``) is the start of one of that page's headings.  A page moved,
split or renamed fails here, naming each link still pointing at the old place."""

from __future__ import annotations

import functools
import glob
import os
import re

from tests.support.tree import tree_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A page of docs/ named in any file: docs/<name>.md, optionally with the heading it points to quoted after it.
MENTION = re.compile(r"\bdocs/([\w-]+\.md)(?:(?:,\s*|\s+)([\"'])(.+?)\2)?")


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        return handle.read()


def prose(text: str) -> str:
    """The Markdown outside fenced blocks (a ``#`` comment in a shell block is no heading)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def headings(path: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", prose(read(path)), re.M)]


@functools.cache
def anchors(path: str) -> set[str]:
    found: set[str] = set()
    for heading in headings(path):
        anchor, number = slug(heading), 0
        while anchor in found:  # a repeated heading: -1, -2, ... as GitHub numbers them
            number += 1
            anchor = f"{slug(heading)}-{number}"
        found.add(anchor)
    return found


def link_problems(doc: str) -> list[str]:
    problems = []
    for target in LINK.findall(prose(read(doc))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue  # https:, mailto:, or a route of the app
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not os.path.exists(os.path.join(ROOT, resolved)):
            problems.append(f"{doc}: ({target}): no file {resolved}")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            problems.append(f"{doc}: ({target}): {resolved} has no heading with the anchor #{anchor}")
    return problems


def test_the_docs_have_links_to_check():
    assert sum(len(LINK.findall(prose(read(doc)))) for doc in DOCS) > 50


def test_every_link_of_the_docs_lands_on_a_file_and_a_heading():
    problems = [problem for doc in DOCS for problem in link_problems(doc)]
    assert not problems, "links that land nowhere:\n" + "\n".join(problems)


def test_every_file_that_names_a_page_of_the_docs_names_one_that_exists():
    problems = []
    for path in tree_files():
        try:
            text = read(path)
        except UnicodeDecodeError:
            continue  # not text
        for number, line in enumerate(text.splitlines(), 1):
            for page, _, quoted in MENTION.findall(line):
                doc = f"docs/{page}"
                if not os.path.exists(os.path.join(ROOT, doc)):
                    problems.append(f"{path}:{number}: names {doc}, which does not exist")
                elif quoted and not any(heading.startswith(quoted) for heading in headings(doc)):
                    problems.append(f"{path}:{number}: {doc} has no heading that starts {quoted!r}")
    assert not problems, "\n".join(problems)
