"""Logs: JSON lines that Cloud Logging parses on App Engine, plain text locally.

Every request ends with one line carrying its outcome (``completed``,
``duplicate``, ``in_progress``, ``stale``, ...), the run, the attempt and the
latency, so log-based metrics count duplicates, 409s, takeovers and stale
attempts without touching Datastore.  Lines of one request share
``logging.googleapis.com/trace`` (from ``X-Cloud-Trace-Context``).

Log lines cannot be forged: a request's path, headers and body reach log
messages (the closing line, a job's own logging, exception messages), so both
formatters write every control character as an escape, and a record is always
one line (in text, a traceback's further lines sit behind ``CONTINUATION``).
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import sys
import time
from types import TracebackType
from typing import Any, TextIO

from flask import Flask, Response, g, request
from opentelemetry import trace

from settings import Settings

TRACE_FIELD = "logging.googleapis.com/trace"
SPAN_FIELD = "logging.googleapis.com/spanId"
SAMPLED_FIELD = "logging.googleapis.com/trace_sampled"
SOURCE_FIELD = "logging.googleapis.com/sourceLocation"
FIELDS = (
    "run_id",
    "job_id",
    "scheduler_job",
    "schedule_time",
    "attempt",
    "outcome",
    "source",
    "principal",
    "method",
    "path",
    "status",
    "latency_ms",
)
SEVERITIES = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "ERROR": "ERROR", "CRITICAL": "CRITICAL"}
# What begins every further line of a text record (its traceback): nothing a
# request sends can start a line at column 0.
CONTINUATION = "    | "
# Characters that end or rewrite a line somewhere a log is read (terminals,
# `str.splitlines`, log viewers): C0 controls, DEL, C1 controls (NEL, CSI)
# the Unicode line and paragraph separators, and the bidirectional controls
# that make a terminal show text in another order than it was written.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# The documented X-Cloud-Trace-Context: TRACE_ID/SPAN_ID;o=OPTIONS, a 32-digit
# hex trace id and a decimal span id; ASCII only (Python's \d takes any digit).
_TRACE_CONTEXT = re.compile(r"([0-9a-f]{32})/([0-9]{1,20})(?:;o=[0-9]+)?", re.IGNORECASE | re.ASCII)
log = logging.getLogger("dedup.requests")

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def escape_controls(text: str) -> str:
    """``text`` with each line-breaking or terminal-controlling character as a visible escape.

    Paths, headers and bodies are the sender's choice: unescaped, a ``%0a`` in
    a URL would end the line and write a forged one after it.
    """
    return _UNSAFE.sub(_visible_escape, text)


def _visible_escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED_ESCAPES.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def parse_trace_context(header: str) -> tuple[str, str] | None:
    """(trace id, span id in 16 hex digits) from ``X-Cloud-Trace-Context``, or None.

    Only the documented form is taken: anything else a caller sends would
    otherwise become the trace of every line of its request (and group them
    with a trace it does not own).
    """
    match = _TRACE_CONTEXT.fullmatch(header)
    if match is None or int(match[1], 16) == 0 or int(match[2]) >= 2**64:
        return None
    # Cloud Trace spells trace ids in lower case; the header carries the span id in
    # decimal, and Cloud Logging wants it as 16 hex digits.
    return match[1].lower(), f"{int(match[2]):016x}"


def further_lines(formatter: logging.Formatter, record: logging.LogRecord) -> list[str]:
    """A record's traceback and stack lines, each escaped (``splitlines`` breaks wherever
    a reader might), the exception's own message (often quoting a request value) on one."""
    texts = []
    if record.exc_info:
        texts.append(_exception_text(formatter, record.exc_info))
    elif record.exc_text:  # a record that arrived formatted (a queue, a socket)
        texts.append(record.exc_text)
    if record.stack_info:
        texts.append(formatter.formatStack(record.stack_info))
    return [escape_controls(line) for text in texts for line in text.splitlines()]


def _exception_text(formatter: logging.Formatter, exc_info: ExcInfo | tuple[None, None, None]) -> str:
    text = formatter.formatException(exc_info)
    try:
        message = str(exc_info[1])
    except Exception:  # the traceback shows what it can
        return text
    if message and text.endswith(message):
        text = text[: -len(message)] + escape_controls(message)
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line, as Cloud Logging parses it.

    ``ensure_ascii`` keeps the line one line; the values are escaped as in text
    too, so that what Cloud Logging decodes (``jsonPayload``) holds no control
    character a request sent, only the real line breaks of a traceback.
    """

    def format(self, record: logging.LogRecord) -> str:
        message = escape_controls(record.getMessage())
        further = further_lines(self, record)
        if further:
            message += "\n" + "\n".join(further)  # Error Reporting reads the traceback here
        entry: dict[str, Any] = {
            "severity": SEVERITIES.get(record.levelname, "DEFAULT"),
            "message": message,
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "logger": record.name,
        }
        for field in FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = escape_controls(value) if isinstance(value, str) else value
        for field in (TRACE_FIELD, SPAN_FIELD, SAMPLED_FIELD):
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = value
        entry[SOURCE_FIELD] = {"file": record.pathname, "line": str(record.lineno), "function": record.funcName}
        latency = getattr(record, "latency_ms", None)
        if latency is not None:  # the request's closing line: Cloud Logging's own request fields
            entry["httpRequest"] = {
                "requestMethod": escape_controls(str(getattr(record, "method", ""))),
                "requestUrl": escape_controls(str(getattr(record, "path", ""))),
                "status": getattr(record, "status", None),
                "latency": f"{latency / 1000:.6f}s",
            }
        return _one_json_line(entry)


def _one_json_line(entry: dict[str, Any]) -> str:
    """``entry`` as JSON; a field json cannot take (non-string keys, a cycle, a raising
    ``__str__``) is written as text.

    Without the fallback such a record would be lost and logging would print
    its own traceback instead, over many lines.
    """
    try:
        return json.dumps(entry, default=str, ensure_ascii=True)
    except Exception:  # TypeError, ValueError, RecursionError, a raising __str__
        return json.dumps({name: _json_safe(value) for name, value in entry.items()}, ensure_ascii=True)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        return str(value)
    except Exception:  # a raising __str__ must not lose the record
        return f"<unprintable {type(value).__name__}>"


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [extras]``, one physical line per record.

    The message and the extras are escaped here, not where they are logged, so
    every log call (dedup/, jobs/, a job's own code) is covered.  A traceback
    keeps its lines, each behind ``CONTINUATION``.
    """

    EXTRAS = ("run_id", "attempt", "outcome")

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # A copy without the traceback: the base class would append it raw.
        head = logging.makeLogRecord(
            {
                **record.__dict__,
                "msg": record.getMessage(),
                "args": None,
                "exc_info": None,
                "exc_text": None,
                "stack_info": None,
            }
        )
        line = escape_controls(super().format(head) + self._extras(record))
        return "\n".join([line, *(CONTINUATION + further for further in further_lines(self, record))])

    def _extras(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{f}={getattr(record, f)}" for f in self.EXTRAS if getattr(record, f, None) is not None)
        return f" [{extras}]" if extras else ""


class TraceFilter(logging.Filter):
    """Attach the current span's trace ids to every line logged inside it.

    Inside a request that is the request's span (handlers/tracing.py), which
    continues the trace the request arrived in (``traceparent`` or
    ``X-Cloud-Trace-Context``), so Cloud Logging nests the lines under it.
    """

    def __init__(self, project: str | None) -> None:
        super().__init__()
        self.project = project

    def filter(self, record: logging.LogRecord) -> bool:
        span = trace.get_current_span().get_span_context()
        if self.project and span.is_valid:
            setattr(record, TRACE_FIELD, f"projects/{self.project}/traces/{span.trace_id:032x}")
            setattr(record, SPAN_FIELD, f"{span.span_id:016x}")
            setattr(record, SAMPLED_FIELD, span.trace_flags.sampled)
        return True


def configure_logging(settings: Settings, stream: TextIO | None = None) -> None:
    """JSON on App Engine (or with DEDUP_LOG_FORMAT=json), readable text otherwise: ``settings.log_format``,
    read with every other setting before the app is built (main.py)."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter() if settings.log_format == "json" else TextFormatter())
    handler.addFilter(TraceFilter(settings.project))
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
            level,
            "%s %s %d%s",
            request.method,
            request.path,
            status,
            f" {outcome}" if outcome else "",
            extra={
                **fields,
                "method": request.method,
                "path": request.path,
                "status": response.status_code,
                "latency_ms": round(latency, 1),
            },
        )
        return response
