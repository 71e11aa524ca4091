"""Every route of an app with a concrete path, for tests that hold a rule on all of them."""

from __future__ import annotations

from flask import Flask
from werkzeug.routing import Rule

from handlers.access import Role, needs_no_caller, role_of

# A value for each URL parameter the app's routes take.
PATH_VALUES = {
    "job_id": "invoice",
    "run_id": "0" * 64,
    "schedule_time": "2030-01-01T00:00:00Z",
    "slug": "run-in-progress",
    "name": "nightly-invoice",  # a Scheduler job (/api/v1/scheduler-jobs/<name>)
    "step": "charge",  # a run's step (/api/v1/runs/<run_id>/steps/<step>)
}


def every_route(app: Flask) -> list[tuple[str, list[str]]]:
    """(path, methods served besides HEAD and OPTIONS) for every route but static files and the
    views open to anyone (/_ah/warmup: it needs no caller, tests/test_warmup.py holds it to doing
    and saying nothing); a path with several rules (a confirmation's GET beside its form's POST)
    is listed once, with all."""
    found: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or needs_no_caller(app.view_functions[rule.endpoint]):
            continue
        found.setdefault(concrete_path(rule), set()).update(served_methods(rule))
    return [(path, sorted(methods)) for path, methods in found.items()]


def routes_needing(app: Flask, role: Role) -> list[tuple[str, str]]:
    """(path, method) of every route whose view needs ``role`` (``@requires``; ``deliver`` unmarked,
    but for a view open to anyone, which needs none: /_ah/warmup)."""
    return [
        (concrete_path(rule), method)
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        and not needs_no_caller(app.view_functions[rule.endpoint])
        and role_of(app.view_functions[rule.endpoint]) is role
        for method in sorted(served_methods(rule))
    ]


def concrete_path(rule: Rule) -> str:
    path = rule.rule
    for name in rule.arguments:
        path = path.replace(f"<{name}>", PATH_VALUES[name])
    return path


def served_methods(rule: Rule) -> set[str]:
    return set(rule.methods or ()) - {"HEAD", "OPTIONS"}
