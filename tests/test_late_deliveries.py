"""Late deliveries: a job's max_delay_seconds skips a delivery whose schedule time is older
(the misfire rule of Quartz, startingDeadlineSeconds of Kubernetes): 200, recorded as
skipped, the job not run.  Never a 5xx for a late delivery."""

from __future__ import annotations

import datetime

import pytest

from dedup.keys import format_utc, scheduled_run_key
from dedup.ledger import Ledger, RunDescription, RunPolicy
from jobs.config import parse_jobs
from jobs.errors import JobsConfigError
from models import RunRecord
from tests import job_targets
from tests.support.deliveries import scheduler_headers

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
    max_delay_seconds: 300
  anytime:
    kind: python
    target: tests.job_targets:record
"""


def at(client, job, when, status="*"):
    """A delivery of ``job``'s execution scheduled for ``when`` (RFC 3339)."""
    return client.post(
        f"/jobs/{job}", b"", headers=scheduler_headers(scheduler_job_name=job, schedule_time=when), status=status
    )


def deliver(client, job, seconds_ago, clock, status="*"):
    return at(client, job, format_utc(clock.now() - datetime.timedelta(seconds=seconds_ago)), status)


def test_a_delivery_later_than_max_delay_is_skipped_and_the_job_does_not_run(make_client, clock, ndb_client):
    client = make_client(JOBS)
    skipped = deliver(client, "invoice", 301, clock, status=200).json
    assert skipped["status"] == "skipped" and skipped["duplicate"] is False
    assert "301s after its schedule time" in skipped["reason"] and "max_delay_seconds (300s)" in skipped["reason"]
    assert job_targets.EFFECTS == []
    again = client.post(
        "/jobs/invoice",
        b"",
        headers=scheduler_headers(
            scheduler_job_name="invoice", schedule_time=format_utc(clock.now() - datetime.timedelta(seconds=301))
        ),
        status=200,
    )
    assert again.json["status"] == "skipped" and again.json["duplicate"] is True  # Scheduler's retry: answered, not run
    with ndb_client.context():
        assert [r.status for r in RunRecord.query().fetch()] == ["skipped"]
    shown = client.get(f"/api/v1/runs/{skipped['run_id']}").json
    assert shown["status"] == "skipped" and shown["reason"] == skipped["reason"]


def test_on_time_and_unbounded_deliveries_run(make_client, clock):
    client = make_client(JOBS)
    assert deliver(client, "invoice", 300, clock, status=200).json["status"] == "completed"
    assert deliver(client, "anytime", 86400 * 3, clock, status=200).json["status"] == "completed"
    assert len(job_targets.EFFECTS) == 2


def test_a_late_retry_of_a_released_run_is_skipped_but_a_finished_one_is_a_duplicate(make_client, clock):
    client = make_client(JOBS)
    job_targets.FAILURES["invoice"] = ["retryable"]
    first = client.post(
        "/jobs/invoice",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice", schedule_time=format_utc(clock.now())),
        status=500,
    )
    assert first.json["run_status"] == "released"
    clock.advance(301)
    late = client.post(
        "/jobs/invoice",
        b"",
        headers=scheduler_headers(
            scheduler_job_name="invoice", schedule_time=format_utc(clock.now() - datetime.timedelta(seconds=301))
        ),
        status=200,
    )
    assert late.json["status"] == "skipped" and late.json["attempt"] == 1  # the released attempt's number, kept
    done = deliver(client, "invoice", 10, clock, status=200).json
    clock.advance(400)
    replay = client.post(
        "/jobs/invoice",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice", schedule_time=done["schedule_time"]),
        status=200,
    ).json
    assert replay["status"] == "completed" and replay["duplicate"] is True
    assert len(job_targets.EFFECTS) == 2


def test_a_late_delivery_never_skips_a_run_that_started(make_client, clock, ndb_client):
    client = make_client(JOBS)
    when = format_utc(clock.now())
    key = scheduled_run_key("invoice", when)
    description = RunDescription("scheduler", "invoice", "invoice", key.schedule_time)
    with ndb_client.context():
        Ledger(clock).claim_run(key.run_id, description, RunPolicy(60, 86400))
    clock.advance(30)
    headers = scheduler_headers(scheduler_job_name="invoice", schedule_time=when)
    assert client.post("/jobs/invoice", b"", headers=headers, status=409).json["error"] == "RunInProgress"
    clock.advance(400)  # the lease ran out: a takeover finishes what the attempt began, however late
    taken = client.post("/jobs/invoice", b"", headers=headers, status=200).json
    assert taken["status"] == "completed" and taken["attempt"] == 2


@pytest.mark.parametrize("value", [0, -5, "soon", True, [300]])
def test_max_delay_must_be_a_positive_number(value):
    with pytest.raises(JobsConfigError, match="max_delay_seconds"):
        parse_jobs(
            f"jobs:\n  j:\n    kind: python\n    target: tests.job_targets:record\n    max_delay_seconds: {value!r}\n"
        )
