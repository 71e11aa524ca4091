"""Issue 20 §1: "no record" means "never ran" only while the ledger would still hold the record.

A slot's record is kept at least its job's retention past the schedule time.
Within that horizon an absent record is a missed slot; past it the slot is
``unknown``: listed as such, kept out of the audit and out of backfill's
defaults, and run by hand only when the operator forces it.  Validation
refuses retentions too short for the retry window, the grace and the audit.
"""

from __future__ import annotations

import math
import textwrap

import pytest

from jobs.config import load_jobs
from schedules.config import (
    AUDIT_INTERVAL_SECONDS,
    DELIVERY_GRACE_SECONDS,
    ScheduleSettingError,
    load_app_schedules,
    load_scheduler_file,
    minimum_retention_seconds,
    retry_window_seconds,
)
from schedules.history import retention_of

# Schedules of every shape the window depends on: deadline, retries by count, by duration.
WINDOW_SHAPES = [
    ("*/5 * * * *", "60s", "{retry_count: 0}"),
    ("0 * * * *", "2m", "{retry_count: 3, min_backoff: 10s, max_backoff: 1m}"),
    ("0 * * * *", "30s", "{retry_count: 5, min_backoff: 30s, max_backoff: 10m, max_doublings: 3}"),
    ("0 0 * * *", "10m", "{retry_count: 1, max_retry_duration: 2h}"),
]


def _files(tmp_path, schedule, deadline, retry, retention, lease=600):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        textwrap.dedent(
            f"""
            jobs:
              report:
                kind: python
                target: tests.job_targets:record
                lease_seconds: {lease}
                retention_seconds: {retention}
            """
        )
    )
    scheduler = tmp_path / "scheduler.yaml"
    scheduler.write_text(
        textwrap.dedent(
            f"""
            jobs:
              report-job:
                target: report
                schedule: "{schedule}"
                attempt_deadline: {deadline}
                retry: {retry}
                project: acme-prod
                location: us-central1
            """
        )
    )
    return str(jobs), str(scheduler)


@pytest.mark.parametrize("schedule, deadline, retry", WINDOW_SHAPES)
def test_a_retention_shorter_than_window_grace_and_audit_is_refused_naming_job_and_minimum(
    tmp_path, schedule, deadline, retry
):
    jobs, scheduler = _files(tmp_path, schedule, deadline, retry, 10**7)
    job = load_scheduler_file(scheduler)[0]
    minimum = minimum_retention_seconds(job)
    assert minimum == retry_window_seconds(job) + DELIVERY_GRACE_SECONDS + AUDIT_INTERVAL_SECONDS
    too_short = max(math.ceil(minimum) - 1, 601)  # above the lease, so only this rule can refuse it
    jobs, scheduler = _files(tmp_path, schedule, deadline, retry, too_short)
    with pytest.raises(ScheduleSettingError) as refused:
        load_app_schedules(scheduler, load_jobs(jobs))
    message = str(refused.value)
    assert "job 'report-job'" in message and f"at least {math.ceil(minimum)}" in message
    enough = max(math.ceil(minimum), 24 * 3600)  # and at least the longest period
    jobs, scheduler = _files(tmp_path, schedule, deadline, retry, enough)
    (declared,) = load_app_schedules(scheduler, load_jobs(jobs))
    assert retention_of(declared, load_jobs(jobs)) == enough


def test_the_reviewers_examples_are_refused(tmp_path):
    """A */5 job kept 300 s, and an hourly one with 5-minute attempts and 5 retries kept 3600 s."""
    shipped_retry = "{retry_count: 5, min_backoff: 30s, max_backoff: 10m, max_doublings: 3}"
    for schedule, deadline, retry, retention in (
        ("*/5 * * * *", "60s", "{retry_count: 2}", 300),
        ("0 * * * *", "5m", shipped_retry, 3600),
    ):
        jobs, scheduler = _files(tmp_path, schedule, deadline, retry, retention, lease=60 if retention == 300 else 300)
        with pytest.raises(ScheduleSettingError, match="shorter than the minimum"):
            load_app_schedules(scheduler, load_jobs(jobs))


def test_the_audit_interval_is_cron_yamls():
    """Validation's minimum counts one audit interval: the one cron.yaml runs /tasks/audit at."""
    import os

    import yaml

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "cron.yaml"), encoding="utf-8") as handle:
        entries = yaml.safe_load(handle)["cron"]
    (audit,) = [entry for entry in entries if entry["url"] == "/tasks/audit"]
    count, unit = audit["schedule"].removeprefix("every ").split()
    assert int(count) * {"minutes": 60, "hours": 3600}[unit] == AUDIT_INTERVAL_SECONDS
