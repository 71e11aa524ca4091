"""Structured logs: one JSON line per request with the run, the outcome and the trace."""

from __future__ import annotations

import io
import logging

from handlers.logs import configure_logging
from settings import Settings
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.logs import TRACE, json_logs, request_lines, text_logs  # noqa: F401 - fixtures


def test_each_request_logs_its_run_outcome_and_trace(make_client, json_logs, spans):
    client = make_client(JOBS)
    headers = scheduler_headers(**{"X-Cloud-Trace-Context": TRACE})
    first = client.post("/jobs/invoice", headers=headers, status=200)
    client.post("/jobs/invoice", headers=headers, status=200)
    job_targets.FAILURES["flaky"] = ["retryable"]
    client.post("/jobs/flaky", headers={**headers, "X-CloudScheduler-JobName": "flaky-job"}, status=500)
    fresh, duplicate, released = request_lines(json_logs())
    assert fresh["outcome"] == "completed" and duplicate["outcome"] == "duplicate" and released["outcome"] == "released"
    assert fresh["run_id"] == first.json["run_id"] and fresh["job_id"] == "invoice" and fresh["attempt"] == 1
    assert fresh["severity"] == "INFO" and fresh["status"] == 200 and fresh["latency_ms"] >= 0
    assert fresh["logging.googleapis.com/trace"] == "projects/acme-prod/traces/105445aa7843bc8bf206b12000100000"
    # The request's own span, a child of the header's span 1, as 16 hex digits as Cloud Logging wants.
    server = [span for span in spans.get_finished_spans() if span.kind.name == "SERVER"][0]  # the first request's
    assert server.parent.span_id == 1 and server.attributes["run_id"] == fresh["run_id"]
    assert fresh["logging.googleapis.com/spanId"] == f"{server.context.span_id:016x}"
    assert fresh["logging.googleapis.com/trace_sampled"] is True  # ;o=1
    assert fresh["httpRequest"]["status"] == 200 and fresh["httpRequest"]["latency"].endswith("s")
    assert fresh["logging.googleapis.com/sourceLocation"]["file"].endswith("logs.py")
    # The job's own warning for the release carries the same trace, so the lines group together.
    warnings = [line for line in json_logs() if line["severity"] == "WARNING" and "releasing" in line["message"]]
    assert warnings and warnings[0]["logging.googleapis.com/trace"] == fresh["logging.googleapis.com/trace"]


def test_manual_runs_and_conflicts_are_logged_too(make_client, json_logs):
    client = make_client(JOBS)
    client.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "t", "parameters": {"a": 1}}, status=201)
    client.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "t", "parameters": {"a": 2}}, status=422)
    created, conflict = request_lines(json_logs())
    assert created["outcome"] == "completed" and created["source"] == "api"
    assert conflict["outcome"] == "conflict" and conflict["status"] == 422


def test_plain_text_by_default_outside_app_engine():
    stream = io.StringIO()
    saved = logging.getLogger().handlers[:]
    try:
        configure_logging(Settings(), stream)
        logging.getLogger("dedup.test").warning("hello", extra={"run_id": "r1", "attempt": 2})
    finally:
        logging.getLogger().handlers[:] = saved
    line = stream.getvalue().strip()
    assert "WARNING dedup.test: hello [run_id=r1 attempt=2]" in line and not line.startswith("{")


def test_failed_requests_log_at_error_or_warning_with_their_job(make_client, json_logs):
    client = make_client(JOBS)
    job_targets.FAILURES["flaky"] = ["retryable"]
    client.post("/jobs/flaky", headers=scheduler_headers(scheduler_job_name="f"), status=500)
    client.post("/jobs/invoice", headers=scheduler_headers(schedule_time="nope"), status=400)
    released, bad = request_lines(json_logs())
    assert released["severity"] == "ERROR" and released["job_id"] == "flaky" and released["source"] == "scheduler"
    assert bad["severity"] == "WARNING"
