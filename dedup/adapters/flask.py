"""Exactly-once for a Flask view (App Engine, Cloud Run): one decorator.

    deliveries = Deliveries(job_id="report")

    @app.post("/report")
    @exactly_once(deliveries)
    def report(run: ScheduledRun):
        send_report(idempotency_key=run.run_id)
        return {"sent": True}

The view runs once per Cloud Scheduler execution, however often it is delivered; a duplicate
never enters it and is answered from the run's record (dedup.deliveries).  The view receives the
run first, then the route's own arguments, and returns a JSON-serialisable result, raises
``dedup.errors.PermanentJobError`` when a retry cannot help, or raises anything else to be retried.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

try:
    from flask import Response, request
except ImportError as missing:  # the core installs without it
    raise ImportError(
        "dedup.adapters.flask needs Flask: pip install 'cloud-scheduler-dedup[flask]'", name=missing.name
    ) from missing

from dedup.answers import Answer
from dedup.deliveries import Deliveries, ScheduledRun
from dedup.problems import MEDIA_TYPE, problem_document

SCOPE = ("project", "location")


def exactly_once(deliveries: Deliveries) -> Callable[[Callable[..., Any]], Callable[..., Response]]:
    """The decorator of a view Cloud Scheduler calls: its deliveries are ``deliveries``'."""

    def decorate(view: Callable[..., Any]) -> Callable[..., Response]:
        @functools.wraps(view)
        def deliver(*args: Any, **kwargs: Any) -> Response:
            twice = [name for name in SCOPE if len(request.args.getlist(name)) > 1]
            if twice:  # which one names the scope is anyone's guess: nothing is recorded
                detail = f"query parameter {twice[0]} given more than once"
                document = problem_document(400, "InvalidRequest", detail, at=request.path, field=twice[0])
                return response(Answer(400, {}, document, MEDIA_TYPE))

            def work(run: ScheduledRun) -> Any:
                return view(run, *args, **kwargs)

            scope = {name: request.args[name] for name in SCOPE if name in request.args}
            return response(deliveries.answer(dict(request.headers.items()), work, scope))

        return deliver

    return decorate


def response(said: Answer) -> Response:
    """An answer as Flask sends it."""
    return Response(said.body(), status=said.status, headers=said.headers, mimetype=said.media_type)
