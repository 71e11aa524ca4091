"""What tests need to play Cloud Scheduler against the app: a jobs file, headers, a delivery."""

from __future__ import annotations

import datetime

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 60
  values:
    kind: python
    target: tests.job_targets:echo_value
  flaky:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
  slow:
    kind: python
    target: tests.job_targets:gated
    lease_seconds: 60
"""
T0 = "2025-10-17T23:50:00Z"


def scheduler_headers(scheduler_job_name="nightly-invoice", schedule_time=T0, **extra):
    headers = {"X-CloudScheduler": "true", "X-CloudScheduler-JobName": scheduler_job_name}
    if schedule_time is not None:
        headers["X-CloudScheduler-ScheduleTime"] = schedule_time
    headers.update(extra)
    return headers


def deliver(client, job="invoice", status="*", body=b"", **headers):
    return client.post(f"/jobs/{job}", body, headers=scheduler_headers(**headers), status=status)


def a_day_ago() -> str:
    """A ``start_at`` for live tests' Scheduler jobs: their slots expected for the day before the test,
    as of a deployment that has run that long (else the app expects them from its first request)."""
    instant = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ")
