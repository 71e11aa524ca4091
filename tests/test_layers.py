"""The layers, as the code imports them: dedup/ knows nothing of HTTP, handlers/ nothing of deploy/."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# package -> top-level packages it must never import
FORBIDDEN = {
    "dedup": {"flask", "werkzeug", "handlers", "jobs", "deploy"},
    "handlers": {"deploy"},
    "jobs": {"flask", "werkzeug", "handlers", "deploy"},
    "models": {"flask", "werkzeug", "handlers", "dedup", "jobs", "deploy"},
    # The schedules: read by the app and the ops CLI alike, so neither's layers.
    "schedules": {"flask", "werkzeug", "handlers", "deploy"},
    # A client for scripts anywhere: requests and click (google-auth for --audience), nothing of the app.
    "dedupctl": {"flask", "werkzeug", "handlers", "dedup", "jobs", "models", "deploy", "google.cloud", "yaml"},
}


def imported_packages(path: str) -> set[str]:
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {part for alias in node.names for part in _prefixes(alias.name)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= set(_prefixes(node.module))
    return names


def _prefixes(module: str) -> list[str]:
    """``google.cloud.ndb`` -> google, google.cloud, google.cloud.ndb."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(package):
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                bad = imported_packages(path) & FORBIDDEN[package]
                if bad:
                    found[os.path.relpath(path, ROOT)] = sorted(bad)
    assert found == {}
