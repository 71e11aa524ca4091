"""The caller's trace on every outgoing call and task: ``traceparent`` and ``X-Cloud-Trace-Context``.

A job's downstream call, a Google API call and a dispatched task each carry the span they are
made in (a run's ``dedup.job``, a request's server span), so Cloud Trace shows one trace from
Cloud Scheduler's delivery to the last service it reached.  W3C's ``traceparent`` is what
OpenTelemetry everywhere reads; ``X-Cloud-Trace-Context`` is what App Engine, Cloud Run and
Google's APIs read where they predate it (handlers/tracing.py reads both coming in).
"""

from __future__ import annotations

from opentelemetry.propagators.cloud_trace_propagator import CloudTraceFormatPropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# One propagator, as OpenTelemetry's instrumentations would use: both headers from the current span.
PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), CloudTraceFormatPropagator()])
# What this module writes: a job's configured headers may not replace them (jobs/kinds/http.py).
TRACE_HEADERS = frozenset({"traceparent", "tracestate", "x-cloud-trace-context"})


def outgoing_trace_headers() -> dict[str, str]:
    """The current span's trace as headers; empty outside any span (nothing to continue)."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier


def traced(headers: dict[str, str], trace: dict[str, str] | None = None) -> dict[str, str]:
    """``headers`` with the trace (the current span's, unless given): a configured header of the
    same name, in any case, gives way, so a call never carries two traces."""
    kept = {name: value for name, value in headers.items() if name.lower() not in TRACE_HEADERS}
    return {**kept, **(outgoing_trace_headers() if trace is None else trace)}
