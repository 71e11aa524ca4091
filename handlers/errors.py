"""The app's error handlers: every HTTP error and every unexpected one leaves as a problem.

``handlers.problems`` builds them (RFC 9457); none is a 503, since for App Engine
targets Cloud Scheduler retries 503 without counting it against retryCount.

A browser asking for a page (``Accept`` prefers ``text/html`` to JSON) gets the same
problem as an HTML page; every other client, Cloud Scheduler and scripts included, keeps
the JSON.  Both carry ``Vary: Accept``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flask import Flask, Response, render_template, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from handlers.answers import refusal_problem
from handlers.problems import MEDIA_TYPE, TYPE_PREFIX, problem
from service.errors import Declined, Invalid, NotFound

log = logging.getLogger(__name__)


def register(app: Flask) -> None:
    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        if exc.code in (None, 503):
            return problem(500, "InternalError", exc.description or "the request failed; retry later")
        response = problem(exc.code, exc.name.replace(" ", ""), exc.description or exc.name)
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            # HEAD and OPTIONS are never served (a HEAD must not run a job).
            allowed = [m for m in exc.valid_methods if m not in ("HEAD", "OPTIONS")]
            response.headers["Allow"] = ", ".join(sorted(allowed))
        return response

    @app.errorhandler(NotFound)
    @app.errorhandler(Invalid)
    @app.errorhandler(Declined)
    def refused(exc: NotFound | Invalid | Declined) -> Response:
        return refusal_problem(exc)  # the service's own refusals (not found, invalid), as every surface answers them

    @app.after_request
    def problem_page_for_browsers(response: Response) -> Response:
        if response.mimetype != MEDIA_TYPE:
            return response
        response.vary.add("Accept")
        if not prefers_html():
            return response
        document = own_problem(response)
        if document is None:
            return response
        page = Response(
            render_template("problem_page.html", problem=document, type_page=document["type"].startswith(TYPE_PREFIX)),
            status=response.status_code,
            mimetype="text/html",
        )
        # Every header but the body's own: a challenge, Allow, Retry-After, and what a guarded
        # endpoint or a run says of itself (Idempotency-Key, Idempotent-Replayed, X-Dedup-Run-Id).
        for name, value in response.headers.items():
            if name.lower() not in ("content-type", "content-length"):
                page.headers.add(name, value)
        return page

    @app.errorhandler(Exception)
    def unexpected_error(exc: Exception) -> Response:
        # Datastore unreachable, a bug: 500, never 503.  No job ran without
        # a committed claim, because claiming is the first write.
        log.exception("unhandled error: %r", exc)
        return problem(500, "InternalError", f"{type(exc).__name__}: the request failed; retry later")


def own_problem(response: Response) -> dict[str, Any] | None:
    """The problem document a response carries, if it is one a page can say: a JSON object
    with a string ``type``.  Anything else labelled problem+json (a guarded endpoint's stored
    answer, a stream) goes out as it is."""
    if response.is_streamed:
        return None
    try:
        document = json.loads(response.get_data())
    except ValueError:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("type"), str):
        return None
    return document


# What a client may be sent for an error, in the order a tie is broken: ``*/*`` gets JSON.
OFFERED = (MEDIA_TYPE, "application/json", "text/html")


def prefers_html() -> bool:
    """Whether the request's Accept ranks an HTML page above the problem's JSON (a browser's does)."""
    accepted = request.accept_mimetypes
    if accepted.best_match(OFFERED) != "text/html":
        return False
    return accepted["text/html"] > max(accepted[MEDIA_TYPE], accepted["application/json"])
