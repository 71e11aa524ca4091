"""docs/architecture.md's map ("Where things are") names every package and module of the tree, and
nothing that is not there: a module added without its line fails here, with the line to add.

What counts: every package (a directory with ``__init__.py``, below the top level or in it) and
every module in one, and the top-level scripts (``main.py``).  Every module is named by a line
that starts with its path; a package by its line ``pkg/`` or by any of its modules' lines, which
name its ``__init__.py`` and ``__main__.py`` too.  ``tests/`` is left out: its modules are tests, and what
they share is the one line ``tests/support/``.
"""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAP_DOC = os.path.join("docs", "architecture.md")
NOT_MAPPED = {"tests"}
PACKAGE_FILES = {"__init__.py", "__main__.py"}  # named by the package's own line


def map_lines() -> list[str]:
    with open(os.path.join(ROOT, MAP_DOC), encoding="utf-8") as handle:
        text = handle.read()
    section = text.partition("\n## Where things are\n")[2].partition("\n## ")[0]
    found = re.search(r"^```\n(.*?)^```", section, re.S | re.M)
    assert found, f"{MAP_DOC} has no '## Where things are' section with its map in a ``` block"
    return [line for line in found.group(1).splitlines() if line.strip()]


def named_paths() -> set[str]:
    return {line.split()[0] for line in map_lines()}


def packages() -> list[str]:
    """Every package directory, relative to ROOT with a trailing slash, parents first."""
    found = []
    for top in sorted(os.listdir(ROOT)):
        if top in NOT_MAPPED or top.startswith("."):
            continue
        for directory, subdirectories, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" not in files:
                subdirectories[:] = []  # not a package: nor is anything below it
                continue
            subdirectories[:] = sorted(d for d in subdirectories if not d.startswith((".", "__")))
            found.append(os.path.relpath(directory, ROOT).replace(os.sep, "/") + "/")
    return found


def modules() -> list[str]:
    """Every module of every package (its __init__ and __main__ aside) and every top-level script."""
    found = sorted(name for name in os.listdir(ROOT) if name.endswith(".py"))
    for package in packages():
        names = sorted(os.listdir(os.path.join(ROOT, package)))
        found += [package + name for name in names if name.endswith(".py") and name not in PACKAGE_FILES]
    return found


def summary(path: str) -> str:
    """The first line of a module's docstring: a start for its line in the map."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        docstring = ast.get_docstring(ast.parse(handle.read(), path)) or "<what it holds>"
    return docstring.splitlines()[0].rstrip(".")


def missing() -> list[str]:
    named = named_paths()
    lost = [p for p in packages() if not any(path.startswith(p) for path in named)]
    return lost + [m for m in modules() if m not in named]


def test_the_map_names_every_package_and_module():
    lost = missing()
    lines = "\n".join(f"  {path:<24} {summary(path + '__init__.py' if path.endswith('/') else path)}" for path in lost)
    assert not lost, (
        f"{MAP_DOC}'s map (## Where things are) does not name {len(lost)} package(s) or module(s). "
        f"Add these lines beside their package's, saying in a few words what each holds:\n{lines}"
    )


def test_everything_the_map_names_exists():
    stale = sorted(path for path in named_paths() if not os.path.exists(os.path.join(ROOT, path)))
    assert not stale, f"{MAP_DOC}'s map names what the tree does not have; remove or correct: {stale}"


def test_the_walk_sees_the_tree():
    """The test itself: it finds the packages and modules a reader would, and none of tests/ or .venv."""
    assert {"handlers/", "jobs/kinds/", "schedules/", "dedupctl/"} <= set(packages())
    assert {"main.py", "jobs/kinds/http.py", "dedup/ledger.py"} <= set(modules())
    assert not [path for path in packages() + modules() if path.startswith(("tests/", ".venv/"))]
    assert "deploy/__main__.py" not in modules() and "handlers/__init__.py" not in modules()
