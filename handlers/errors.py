"""Every error leaves as JSON ``{"error", "message"}``, and none as 503.

For App Engine targets Cloud Scheduler treats 503 as a system error and
retries it without counting against retryCount, so an outage would be
retried without bound; infrastructure errors are 500 instead.
"""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


def json_error(http_status: int, error: str, message: str, /, **extra):
    response = jsonify({"error": error, "message": message, **extra})
    response.status_code = http_status
    return response


def register(app: Flask) -> None:
    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        status = 500 if exc.code in (None, 503) else exc.code
        response = json_error(status, exc.name.replace(" ", ""), exc.description or exc.name)
        if exc.code == 405 and exc.valid_methods:
            # HEAD and OPTIONS are never served (a HEAD must not run a job).
            allowed = [m for m in exc.valid_methods if m not in ("HEAD", "OPTIONS")]
            response.headers["Allow"] = ", ".join(sorted(allowed))
        return response

    @app.errorhandler(Exception)
    def unexpected_error(exc: Exception):
        # Datastore unreachable, a bug: 500, never 503.  No job ran without
        # a committed claim, because claiming is the first write.
        log.exception("unhandled error: %r", exc)
        return json_error(500, "InternalError", f"{type(exc).__name__}: the request failed; retry later")
