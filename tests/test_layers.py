"""The layers, as the code imports them: dedup/ knows nothing of HTTP, handlers/ nothing of deploy/."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# package -> top-level packages it must never import
FORBIDDEN = {
    # The library (library/): nothing of the app, so its wheel holds dedup/ alone.
    "dedup": {"flask", "werkzeug", "handlers", "jobs", "deploy", "models", "service", "schedules", "devtools"},
    "handlers": {"deploy"},
    # The use cases: values and refusals of their own, never HTTP (the adapters in handlers/ render them).
    "service": {"flask", "werkzeug", "handlers", "deploy"},
    "jobs": {"flask", "werkzeug", "handlers", "deploy"},
    "models": {"flask", "werkzeug", "handlers", "jobs", "deploy"},
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


# The library's adapters (an install extra each) import their framework, and nothing of the app.
ADAPTERS = os.path.join("dedup", "adapters")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(package):
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        if os.path.relpath(folder, ROOT).split(os.sep)[:2] == ADAPTERS.split(os.sep):
            continue  # held to their own rule below
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                bad = imported_packages(path) & FORBIDDEN[package]
                if bad:
                    found[os.path.relpath(path, ROOT)] = sorted(bad)
    assert found == {}


def test_the_librarys_adapters_import_their_framework_and_nothing_of_the_app():
    app = FORBIDDEN["dedup"] - {"flask", "werkzeug"}
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, ADAPTERS)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                bad = imported_packages(path) & app
                if bad:
                    found[os.path.relpath(path, ROOT)] = sorted(bad)
    assert found == {}


# Inside a package: no import cycle, and handlers/' blueprints import helpers and use cases only.
PACKAGES = ("dedup", "handlers", "service", "jobs", "models", "schedules", "deploy", "dedupctl", "devtools")


def module_of(path: str) -> str:
    relative = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
    return relative[: -len(".__init__")] if relative.endswith(".__init__") else relative


def project_modules(package: str) -> dict[str, str]:
    """module name -> path, for every module of ``package``."""
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found[module_of(path)] = path
    return found


def imported_modules(path: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports anywhere in it (a function's import counts)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # from handlers import admin
    return found & known


def import_graph(package: str) -> dict[str, set[str]]:
    modules = project_modules(package)
    return {module: imported_modules(path, set(modules)) - {module} for module, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other in a circle (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_modules_of_a_package_import_each_other_in_a_circle(package):
    assert cycles(import_graph(package)) == []


def test_a_cycle_is_found_where_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def blueprint_modules() -> set[str]:
    """The handlers modules that define a Blueprint: the views."""
    found = set()
    for module, path in project_modules("handlers").items():
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        if any(isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Blueprint" for node in ast.walk(tree)):
            found.add(module)
    return found


def test_views_import_helpers_and_the_service_never_the_app_factory_or_each_other():
    views = blueprint_modules()
    assert {"handlers.scheduler", "handlers.runs_api", "handlers.admin", "handlers.problem_pages"} <= views
    graph = import_graph("handlers")
    wrong = {
        module: sorted(imported & (views | {"handlers"}))
        for module, imported in graph.items()
        if module != "handlers" and imported & (views | {"handlers"})
    }
    assert wrong == {}  # only create_app (handlers/__init__.py) imports the views


def test_the_settings_module_imports_no_layer_above_the_ones_it_serves():
    """settings.py is read by the app, the ops CLI and the tests alike: never Flask, never
    handlers/ or deploy/ (which both import it)."""
    found = imported_packages(os.path.join(ROOT, "settings.py")) & {"flask", "werkzeug", "handlers", "deploy"}
    assert found == set()
