"""Traces: a span per request, continuing the caller's trace, around the protocol's own spans.

The protocol (dedup/runner.py) opens ``dedup.claim``, ``dedup.job`` and
``dedup.finish`` with the OpenTelemetry API alone; this module gives the
process its provider once, and each request a server span whose parent is the
trace the request arrived in: W3C ``traceparent``, else App Engine's
``X-Cloud-Trace-Context``.  The request's log lines carry that span's ids
(handlers/logs.py), so Cloud Logging groups them under the trace.

Where spans go is ``DEDUP_TRACE_EXPORT``: ``cloud-trace`` (the default on App
Engine: Cloud Trace through Google's exporter, batched off the request path)
or ``none`` (the default elsewhere: spans are made, for the logs' ids, but
sent nowhere).  Tests add an in-memory exporter to the same provider.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import google.auth.exceptions
from flask import Flask, Response, g, request
from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from werkzeug.datastructures import Headers

from handlers.logs import parse_trace_context
from settings import SettingError, Settings

_W3C = TraceContextTextMapPropagator()
_configured = threading.Lock()
tracer = trace.get_tracer("dedup.requests")
log = logging.getLogger(__name__)


# The app's one setting error: DEDUP_TRACE_EXPORT naming no exporter stops the app (settings.py's rule).
TracingConfigError = SettingError


def cloud_trace_processor(settings: Settings, client: Any = None) -> SpanProcessor:
    """Spans to Cloud Trace, in batches from a background thread (never on the request's time)."""
    from opentelemetry.exporter.cloud_trace import CloudTraceSpanExporter

    return BatchSpanProcessor(CloudTraceSpanExporter(project_id=settings.project, client=client))


def configure_tracing(
    settings: Settings,
    processor_for: Callable[[Settings], SpanProcessor] = cloud_trace_processor,
) -> TracerProvider:
    """The process's tracer provider, made once (OpenTelemetry allows one per process), as
    ``settings.trace_export`` says (checked by ``Settings.from_environ``: a bad one stops the app)."""
    with _configured:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            return current
        provider = new_provider(settings, processor_for)
        trace.set_tracer_provider(provider)
        return provider


def new_provider(settings: Settings, processor_for: Callable[[Settings], SpanProcessor]) -> TracerProvider:
    """A provider exporting as ``settings.trace_export`` says; one whose exporter cannot be built exports nothing."""
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service or "dedup"}))
    if settings.trace_export == "cloud-trace":
        try:
            provider.add_span_processor(processor_for(settings))
        except google.auth.exceptions.DefaultCredentialsError as exc:
            # Traces are for looking: a missing credential must not stop the app serving runs.
            log.error("spans will not be exported to Cloud Trace: %s", exc)
    return provider


def incoming_context(headers: Mapping[str, str] | Headers) -> context.Context | None:
    """The trace the request arrived in: ``traceparent``, else ``X-Cloud-Trace-Context``, else None."""
    carrier = {"traceparent": headers.get("traceparent", "")}
    if headers.get("tracestate"):
        carrier["tracestate"] = headers["tracestate"]
    extracted = _W3C.extract(carrier)
    if trace.get_current_span(extracted).get_span_context().is_valid:
        return extracted
    raw = headers.get("X-Cloud-Trace-Context", "")
    ids = parse_trace_context(raw)
    if ids is None:
        return None
    sampled = raw.lower().endswith(";o=1")
    parent = trace.SpanContext(
        trace_id=int(ids[0], 16),
        span_id=int(ids[1], 16) or 1,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def install_tracing(app: Flask) -> None:
    """A server span around every request, ended with the request's outcome."""

    @app.before_request
    def start_span() -> None:
        route = request.url_rule.rule if request.url_rule else request.path
        span = tracer.start_span(
            f"{request.method} {route}",
            context=incoming_context(request.headers),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": request.method, "http.route": route},
        )
        g.trace_span = span
        g.trace_token = context.attach(trace.set_span_in_context(span))

    @app.after_request
    def describe(response: Response) -> Response:
        span = g.get("trace_span")
        if span is not None:
            span.set_attribute("http.response.status_code", response.status_code)
            fields = g.get("run_log", {})
            for name in ("run_id", "attempt", "outcome"):
                if fields.get(name) is not None:
                    span.set_attribute(name, fields[name])
            span.set_attribute("replayed", response.headers.get("Idempotent-Replayed") == "true")
            if response.status_code >= 500:
                span.set_status(trace.StatusCode.ERROR)
        return response

    @app.teardown_request
    def end_span(_: BaseException | None) -> None:
        token = g.pop("trace_token", None)
        span = g.pop("trace_span", None)
        if span is not None:
            span.end()
        if token is not None:
            context.detach(token)
