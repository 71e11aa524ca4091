"""The app's error handlers: every HTTP error and every unexpected one leaves as a problem.

``handlers.problems`` builds them (RFC 9457); none is a 503, since for App Engine
targets Cloud Scheduler retries 503 without counting it against retryCount.
"""

from __future__ import annotations

import logging

from flask import Flask, Response
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from handlers.problems import problem

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

    @app.errorhandler(Exception)
    def unexpected_error(exc: Exception) -> Response:
        # Datastore unreachable, a bug: 500, never 503.  No job ran without
        # a committed claim, because claiming is the first write.
        log.exception("unhandled error: %r", exc)
        return problem(500, "InternalError", f"{type(exc).__name__}: the request failed; retry later")
