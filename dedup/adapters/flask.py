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
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

try:
    from flask import Response, current_app, request
except ImportError as missing:  # the core installs without it
    raise ImportError(
        "dedup.adapters.flask needs Flask: pip install 'cloud-scheduler-dedup[flask]'", name=missing.name
    ) from missing

from dedup.answers import Answer
from dedup.app_engine_markers import AppEngineCallers
from dedup.callers import Callers
from dedup.deliveries import Deliveries, DeliverySettings, ScheduledRun
from dedup.errors import PermanentJobError, RetryableJobError

# What a Flask app adopting the library needs, from one import.
__all__ = [
    "AppEngineCallers",
    "Callers",
    "Deliveries",
    "DeliverySettings",
    "PermanentJobError",
    "RetryableJobError",
    "ScheduledRun",
    "exactly_once",
]

SCOPE = ("project", "location")


def exactly_once(deliveries: Deliveries) -> Callable[[Callable[..., Any]], Callable[..., Response]]:
    """The decorator of a view Cloud Scheduler calls: its deliveries are ``deliveries``'.  An
    ``async`` view is run as Flask runs one; a generator view is refused here, since a stream
    cannot be kept to answer the retries with."""

    def decorate(view: Callable[..., Any]) -> Callable[..., Response]:
        if inspect.isgeneratorfunction(view) or inspect.isasyncgenfunction(view):
            raise TypeError(f"{view.__name__} is a generator: an exactly-once view returns a JSON-serialisable result")
        if inspect.iscoroutinefunction(view) and importlib.util.find_spec("asgiref") is None:
            raise TypeError(
                f"{view.__name__} is async: Flask runs it only with its async extra (pip install 'flask[async]')"
            )

        @functools.wraps(view)
        def deliver(*args: Any, **kwargs: Any) -> Response:
            run_view = current_app.ensure_sync(view)

            def work(run: ScheduledRun) -> Any:
                return result_of(run_view(run, *args, **kwargs))

            # Each value the query gives: a scope named twice is refused by answer, after the caller's check.
            scope = {name: request.args.getlist(name) for name in SCOPE if name in request.args}
            return response(deliveries.answer(dict(request.headers.items()), work, scope, at=request.path))

        return deliver

    return decorate


def result_of(returned: Any) -> Any:
    """What a view returned, as the run's result: a 2xx JSON response's JSON.  A JSON response of
    a 5xx status is a retryable failure (the run is released), of a 4xx a permanent one (its JSON
    kept as the error's details).  Any other response, or a status tuple, is refused as a
    permanent failure, since the work has run and its answer must be kept for the retries."""
    if isinstance(returned, Response):
        if returned.is_json and returned.status_code >= 500:
            raise RetryableJobError(f"the view answered {returned.status_code}", returned.get_json(silent=True))
        if returned.is_json and returned.status_code >= 300:
            raise PermanentJobError(f"the view answered {returned.status_code}", returned.get_json(silent=True))
        if returned.is_json:
            return returned.get_json()
        raise PermanentJobError(
            f"the view returned a {returned.mimetype} response: an exactly-once view returns a "
            "JSON-serialisable result (a dict, a list, ...), which answers every retry"
        )
    if isinstance(returned, tuple):
        raise PermanentJobError(
            "the view returned a tuple (a body and a status?): an exactly-once view returns a "
            "JSON-serialisable result; the status is the protocol's"
        )
    return returned


def response(said: Answer) -> Response:
    """An answer as Flask sends it."""
    return Response(said.body(), status=said.status, headers=said.headers, mimetype=said.media_type)
