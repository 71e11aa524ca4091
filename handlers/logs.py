"""Logs: JSON lines that Cloud Logging parses on App Engine, plain text locally.

Every request ends with one line carrying its outcome (``completed``,
``duplicate``, ``in_progress``, ``stale``, ...), the run, the attempt and the
latency, so log-based metrics count duplicates, 409s, takeovers and stale
attempts without touching Datastore.  Lines of one request share
``logging.googleapis.com/trace`` (from ``X-Cloud-Trace-Context``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time
from typing import Any, Mapping, TextIO

from flask import Flask, Response, g, has_request_context, request

TRACE_FIELD = "logging.googleapis.com/trace"
SPAN_FIELD = "logging.googleapis.com/spanId"
FIELDS = ("run_id", "job_id", "attempt", "outcome", "source", "method", "path", "status", "latency_ms")
SEVERITIES = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "ERROR": "ERROR", "CRITICAL": "CRITICAL"}
log = logging.getLogger("dedup.requests")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)  # Error Reporting reads it here
        entry: dict[str, Any] = {
            "severity": SEVERITIES.get(record.levelname, "DEFAULT"),
            "message": message,
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(),
            "logger": record.name,
        }
        for field in FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = value
        for field in (TRACE_FIELD, SPAN_FIELD):
            value = getattr(record, field, None)
            if value:
                entry[field] = value
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{f}={getattr(record, f)}" for f in ("run_id", "attempt", "outcome") if getattr(record, f, None) is not None)
        return super().format(record) + (f" [{extras}]" if extras else "")


class TraceFilter(logging.Filter):
    """Attach the request's Cloud Trace ids to every line logged while serving it."""

    def __init__(self, project: str | None) -> None:
        super().__init__()
        self.project = project

    def filter(self, record: logging.LogRecord) -> bool:
        if has_request_context():
            header = request.headers.get("X-Cloud-Trace-Context", "")
            trace, _, rest = header.partition("/")
            if trace and self.project:
                setattr(record, TRACE_FIELD, f"projects/{self.project}/traces/{trace}")
                span = rest.split(";")[0]
                if span.isdigit() and int(span) < 2 ** 64:
                    # The header carries the span id in decimal; Cloud Logging wants 16 hex digits.
                    setattr(record, SPAN_FIELD, f"{int(span):016x}")
        return True


def configure_logging(environ: Mapping[str, str] = os.environ, stream: TextIO | None = None) -> None:
    """JSON on App Engine (or with DEDUP_LOG_FORMAT=json), readable text otherwise."""
    fmt = (environ.get("DEDUP_LOG_FORMAT") or ("json" if environ.get("GAE_ENV") else "text")).lower()
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(TraceFilter(environ.get("GOOGLE_CLOUD_PROJECT")))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def note_run(**fields: Any) -> None:
    """What the request did to which run, for its closing log line."""
    g.run_log = {**g.get("run_log", {}), **fields}


def install_request_logging(app: Flask) -> None:
    @app.before_request
    def start_clock() -> None:
        g.request_started = time.monotonic()

    @app.after_request
    def log_request(response: Response) -> Response:
        latency = (time.monotonic() - g.get("request_started", time.monotonic())) * 1000
        fields = g.get("run_log", {})
        outcome = fields.get("outcome")
        status = response.status_code
        level = logging.ERROR if status >= 500 else logging.WARNING if status >= 400 else logging.INFO
        log.log(
            level, "%s %s %d%s", request.method, request.path, status, f" {outcome}" if outcome else "",
            extra={**fields, "method": request.method, "path": request.path, "status": response.status_code,
                   "latency_ms": round(latency, 1)},
        )
        return response
