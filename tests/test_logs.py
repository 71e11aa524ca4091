"""Structured logs: one JSON line per request with the run, the outcome and the trace."""

from __future__ import annotations

import io
import json
import logging
from typing import Callable, Iterator

import pytest

from handlers.logs import configure_logging
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers

TRACE = "105445aa7843bc8bf206b12000100000/1;o=1"


class CapturedLogs(logging.Handler):
    """What configure_logging wrote (``text``; calling it parses the lines) and the
    records behind it, so a test can count the lines each record took."""

    def __init__(self, parse: Callable[[str], list]) -> None:
        super().__init__()
        self.stream = io.StringIO()
        self.records: list[logging.LogRecord] = []
        self._parse = parse

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def __call__(self) -> list:
        return self._parse(self.text)


def capture_logs(environ: dict[str, str], parse: Callable[[str], list]) -> Iterator[CapturedLogs]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    captured = CapturedLogs(parse)
    configure_logging(environ, captured.stream)
    root.addHandler(captured)
    try:
        yield captured
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


@pytest.fixture
def json_logs():
    # splitlines, not split("\n"): a raw U+2028 or NEL inside a line would break json.loads here.
    yield from capture_logs(
        {"DEDUP_LOG_FORMAT": "json", "GOOGLE_CLOUD_PROJECT": "acme-prod"},
        lambda text: [json.loads(line) for line in text.splitlines()],
    )


@pytest.fixture
def text_logs():
    """The default format wherever GAE_ENV is unset (Cloud Run, local runs)."""
    yield from capture_logs({"GOOGLE_CLOUD_PROJECT": "acme-prod"}, str.splitlines)


def request_lines(lines):
    return [line for line in lines if line["logger"] == "dedup.requests"]


def test_each_request_logs_its_run_outcome_and_trace(make_client, json_logs):
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
    assert fresh["logging.googleapis.com/spanId"] == "0000000000000001"  # hex, as Cloud Logging wants
    # The job's own warning for the release carries the same trace, so the lines group together.
    warnings = [l for l in json_logs() if l["severity"] == "WARNING" and "releasing" in l["message"]]
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
        configure_logging({}, stream)
        logging.getLogger("dedup.test").warning("hello", extra={"run_id": "r1", "attempt": 2})
    finally:
        logging.getLogger().handlers[:] = saved
    line = stream.getvalue().strip()
    assert "WARNING dedup.test: hello [run_id=r1 attempt=2]" in line and not line.startswith("{")


def test_failed_requests_log_at_error_or_warning_with_their_job(make_client, json_logs):
    client = make_client(JOBS)
    job_targets.FAILURES["flaky"] = ["retryable"]
    client.post("/jobs/flaky", headers=scheduler_headers(job_name="f"), status=500)
    client.post("/jobs/invoice", headers=scheduler_headers(schedule_time="nope"), status=400)
    released, bad = request_lines(json_logs())
    assert released["severity"] == "ERROR" and released["job_id"] == "flaky" and released["source"] == "scheduler"
    assert bad["severity"] == "WARNING"
