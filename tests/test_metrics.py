"""Issue 41 §1: metrics that name the job, read with the SDK's in-memory reader.

Slot outcomes are counted once per slot, when it is decided: by the finish of its run (one
request's, never a replay's or a release's), by the audit pass whose mark landed, or by the
resume that ends its pause.  The protocol's counters (takeovers, stale attempts, claim round
trips) and the 409s carry the job too.  tests/test_schedule_day.py holds a day of every
schedule state's counts to its listing.
"""

from __future__ import annotations

import logging

import pytest
import webtest
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from dedup.ledger import Ledger, RunDescription, RunPolicy
from handlers.metrics import ChangedOnly, new_provider
from settings import Settings, metrics_export
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.schedule_sites import CRON, at, schedule_site

SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z
  attempt_deadline: 60s
  retry: {retry_count: 1, min_backoff: 1m}
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
  flaky-hourly:
    target: flaky
    schedule: "0 * * * *"
"""
OUTCOMES = "dedup.slot.outcomes"


@pytest.fixture
def site(google, ndb_client, tmp_path, clock, monkeypatch) -> webtest.TestApp:
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    return schedule_site(tmp_path, JOBS, SCHEDULES, clock, ndb_client)


def deliver(site, hour: float, job: str = "flaky", name: str = "flaky-hourly", status="*"):
    headers = scheduler_headers(scheduler_job_name=name, schedule_time=at(hour))
    return site.post(f"/jobs/{job}?project=acme-prod&location=us-central1", b"", headers=headers, status=status)


def test_a_retry_that_succeeds_counts_no_failure(site, clock, measured):
    """The attempt alert's false page (exposure-notifications PR #1907): a failed attempt that a
    retry cured is one slot that ran after more attempts, and no failure point at all."""
    job_targets.FAILURES["flaky"] = ["retryable"]
    clock.advance(10)
    deliver(site, 0, status=500)
    clock.advance(60)
    deliver(site, 0, status=200)
    deliver(site, 0, status=200)  # a duplicate: absorbed, counted as one
    assert measured.counts(OUTCOMES, by="outcome", scheduler_job="flaky-hourly") == {
        "ran_after_retries": 1,
        "duplicate": 1,
    }
    assert measured.histogram("dedup.slot.attempts", scheduler_job="flaky-hourly") == (1, 2.0)
    count, delay = measured.histogram("dedup.slot.schedule_delay", job="flaky")
    assert count == 1 and delay == pytest.approx(10)  # the run's first claim, 10 s after its slot


def test_a_permanent_failure_is_counted_once_whatever_repeats_it(site, clock, measured):
    job_targets.FAILURES["flaky"] = ["permanent"]
    clock.advance(10)
    deliver(site, 0, status=422)
    deliver(site, 0, status=422)  # Scheduler's retry of it: replayed
    assert measured.counts(OUTCOMES, by="outcome", job="flaky") == {"failed": 1, "duplicate": 1}
    clock.advance(3600)
    deliver(site, 1, job="invoice", name="invoice-hourly", status=200)  # another job: its own series
    assert measured.counts(OUTCOMES, by="scheduler_job", outcome="ran_once") == {"invoice-hourly": 1}


def test_the_audit_counts_a_missed_slot_once_however_many_passes(site, clock, measured):
    site.get("/tasks/audit", headers=CRON)  # the first pass sets the marks
    clock.advance(3 * 3600)  # 00:00 ran, 01:00 and 02:00 never delivered
    for _ in range(2):
        site.get("/tasks/audit", headers=CRON)
    counted = measured.counts(OUTCOMES, by="outcome", scheduler_job="invoice-hourly", source="audit")
    assert counted == {"missed": 3}  # 00:00, 01:00, 02:00: every window closed, none delivered


def test_each_audit_pass_writes_each_jobs_age_since_its_last_progress(site, clock, measured):
    """``dedup.slot.progress_age``: what a slow job's forward progress is watched on (a metric
    absence waits 23.5 hours at most), and whose absence says the audit has stopped."""
    site.get("/tasks/audit", headers=CRON)
    clock.advance(3600 + 10)
    deliver(site, 1, job="invoice", name="invoice-hourly", status=200)
    clock.advance(2 * 3600 + 590)  # 03:10: invoice-hourly last ran at 01:00; flaky-hourly never
    site.get("/tasks/audit", headers=CRON)
    ages = measured.gauges("dedup.slot.progress_age", by="scheduler_job")  # a gauge keeps other tests' jobs too
    assert {name: ages[name] for name in ("invoice-hourly", "flaky-hourly")} == {
        "invoice-hourly": 2 * 3600 + 600,
        "flaky-hourly": 3 * 3600 + 600,  # since its slots are expected (start_at)
    }
    clock.advance(900)
    site.get("/tasks/audit", headers=CRON)  # nothing new ran: each age grows by the interval
    assert measured.gauges("dedup.slot.progress_age", by="scheduler_job")["invoice-hourly"] == 2 * 3600 + 1500


def test_a_pause_left_uncaught_is_counted_paused_once_by_its_resume(site, clock, measured):
    site.get("/tasks/audit", headers=CRON)
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {"note": "maintenance"})
    clock.advance(3 * 3600 + 60)  # 00:00 to 03:00 paused, never delivered; 03:00's retry window still open
    site.get("/tasks/audit", headers=CRON)  # judges 00:00 to 02:00 while the pause lasts: leaves them to the resume
    assert measured.counts(OUTCOMES, by="outcome", scheduler_job="invoice-hourly") == {}
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {"catch_up": "none"})
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {"catch_up": "none"})  # again: no change
    clock.advance(3600)
    site.get("/tasks/audit", headers=CRON)  # 03:00's window closed after the resume: this pass decides it
    assert measured.counts(OUTCOMES, by="source", scheduler_job="invoice-hourly", outcome="paused") == {
        "resume": 3,
        "audit": 1,
    }


def test_a_resumes_catch_up_counts_its_runs_not_the_pause(cloud_tasks, site, clock, measured):
    site.get("/tasks/audit", headers=CRON)
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {})
    clock.advance(2 * 3600 + 600)
    site.get("/tasks/audit", headers=CRON)
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {"catch_up": "all"})
    from devtools.cloud_tasks_fake import to_webtest

    cloud_tasks.deliver(to_webtest(site), times=1)
    counted = measured.counts(OUTCOMES, by="outcome", scheduler_job="invoice-hourly")
    assert counted == {"ran_once": 3}  # 00:00, 01:00, 02:00, each run by the catch-up: none paused
    assert measured.counts(OUTCOMES, by="source", scheduler_job="invoice-hourly") == {"slot_run": 3}


def test_409s_are_counted_by_job(make_client, measured, ndb_client, clock):
    client = make_client(JOBS)
    with ndb_client.context():
        description = RunDescription("scheduler", "invoice", scheduler_job_name="nightly-invoice")
        from dedup.keys import scheduled_run_key

        key = scheduled_run_key("nightly-invoice", "2025-10-17T23:50:00Z")
        Ledger(clock).claim_run(key.run_id, description, RunPolicy(600, 7200))
    client.post("/jobs/invoice", b"", headers=scheduler_headers(), status=409)
    assert measured.counts("dedup.answers.conflicts", by="job") == {"invoice": 1}


def test_the_claims_round_trips_takeovers_and_stale_attempts_are_counted(ndb_context, clock, measured):
    ledger = Ledger(clock)
    description = RunDescription("scheduler", "invoice", scheduler_job_name="nightly-invoice")
    policy = RunPolicy(60, 7200)
    first = ledger.replay_or_claim("run-1", description, policy)
    assert measured.counts("dedup.claim.round_trips", by="job") == {"invoice": 1}  # the insert beside the lookup
    clock.advance(60)
    second = ledger.replay_or_claim("run-1", description, policy)  # the lease ran out: taken over
    assert second.attempt.number == 2
    assert measured.counts("dedup.run.takeovers", by="scheduler_job") == {"nightly-invoice": 1}
    ledger.complete_run(first.attempt, {}, policy)  # the first attempt's finish: refused
    assert measured.counts("dedup.run.stale_attempts", by="job") == {"invoice": 1}
    ledger.complete_run(second.attempt, {}, policy)
    before = measured.counts("dedup.claim.round_trips", by="job")["invoice"]
    ledger.replay_or_claim("run-1", description, policy)  # completed, and this process saw it: no call
    assert measured.counts("dedup.claim.round_trips", by="job")["invoice"] == before
    Ledger(clock).replay_or_claim("run-1", description, policy)  # another process's: one lookup and insert
    assert measured.counts("dedup.claim.round_trips", by="job")["invoice"] == before + 1


def test_metrics_go_to_cloud_monitoring_on_app_engine_and_nowhere_by_default_elsewhere():
    assert metrics_export({"GAE_ENV": "standard"}) == "cloud-monitoring"
    assert metrics_export({}) == "none" and metrics_export({"GAE_ENV": "localdev"}) == "none"
    assert metrics_export({"DEDUP_METRICS_EXPORT": "none", "GAE_ENV": "standard"}) == "none"
    exported: list[Settings] = []
    to_monitoring = Settings(metrics_export="cloud-monitoring", project="acme-prod")
    provider = new_provider(
        to_monitoring, lambda s: exported.append(s) or _Recording(), resource_for=lambda s: Resource.create({})
    )
    try:
        readers = provider._metric_readers
        assert exported == [to_monitoring] and len(readers) == 1
        assert isinstance(readers[0], PeriodicExportingMetricReader)
        assert isinstance(readers[0]._exporter, ChangedOnly)
    finally:
        provider.shutdown()
    assert new_provider(Settings(), exported.append)._metric_readers == []


def test_googles_exporter_writes_a_series_per_process_under_the_workload_prefix():
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.monitoring_v3 import MetricServiceClient

    from handlers import metrics

    client = MetricServiceClient(credentials=AnonymousCredentials())
    exporter = metrics.cloud_monitoring_exporter(Settings(project="acme-prod"), client=client)
    assert exporter.project_id == "acme-prod" and exporter._prefix == "workload.googleapis.com"
    assert exporter.unique_identifier  # two gunicorn workers of one instance: two series


def test_without_credentials_metrics_are_not_exported_and_the_app_still_serves(caplog):
    import google.auth.exceptions

    def no_credentials(settings):
        raise google.auth.exceptions.DefaultCredentialsError("no ADC here")

    caplog.set_level(logging.ERROR, logger="handlers.metrics")
    provider = new_provider(Settings(metrics_export="cloud-monitoring"), no_credentials)
    assert provider._metric_readers == []
    assert "metrics will not be exported to Cloud Monitoring: no ADC here" in caplog.text


class _Recording(MetricExporter):
    """An exporter that keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.exported: list = []
        self.result = MetricExportResult.SUCCESS

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.exported.append(metrics_data)
        return self.result

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def _points(data) -> list[tuple[str, dict, object]]:
    return [
        (metric.name, dict(point.attributes), getattr(point, "value", getattr(point, "count", None)))
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]


def test_only_changed_series_are_written():
    """Cumulative, as Cloud Monitoring takes custom metrics, but a series is written only when it
    moved: an idle job writes nothing (so a forward-progress alert sees it stop), and a
    process's idle series cost nothing."""
    from opentelemetry.sdk.metrics import MeterProvider

    reader = InMemoryMetricReader()  # cumulative, as the periodic reader's export to Google's
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("test").create_counter("outcomes")
    histogram = provider.get_meter("test").create_histogram("delay")
    inner = _Recording()
    changed = ChangedOnly(inner)
    counter.add(1, {"job": "a"})
    counter.add(1, {"job": "b"})
    histogram.record(3.0, {"job": "a"})
    changed.export(reader.get_metrics_data())
    assert sorted(_points(inner.exported[-1]), key=repr) == [
        ("delay", {"job": "a"}, 1),
        ("outcomes", {"job": "a"}, 1),
        ("outcomes", {"job": "b"}, 1),
    ]
    counter.add(1, {"job": "a"})
    changed.export(reader.get_metrics_data())
    assert _points(inner.exported[-1]) == [("outcomes", {"job": "a"}, 2)]  # b and the delay did not move
    calls = len(inner.exported)
    assert changed.export(reader.get_metrics_data()) == MetricExportResult.SUCCESS
    assert len(inner.exported) == calls  # nothing moved: nothing written
    provider.shutdown()


def test_a_failed_exports_points_are_written_again():
    """Cloud Monitoring knows only what was written: points an export failed to write stay
    changed, so an increase is never lost to one failed call."""
    from opentelemetry.sdk.metrics import MeterProvider

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("test").create_counter("outcomes")
    inner = _Recording()
    changed = ChangedOnly(inner)
    counter.add(1, {"job": "a"})
    inner.result = MetricExportResult.FAILURE
    assert changed.export(reader.get_metrics_data()) == MetricExportResult.FAILURE
    inner.result = MetricExportResult.SUCCESS
    changed.export(reader.get_metrics_data())  # nothing moved since: the failed point is written now
    assert _points(inner.exported[-1]) == [("outcomes", {"job": "a"}, 1)]
    calls = len(inner.exported)
    changed.export(reader.get_metrics_data())
    assert len(inner.exported) == calls  # written once it succeeded: not again
    provider.shutdown()


def test_the_labels_are_bounded(site, clock, measured):
    """Scheduler job, job, outcome and source: never a run id, whatever is delivered."""
    for hour in range(3):
        clock.advance(10 if hour == 0 else 3600)
        deliver(site, hour, job="invoice", name="invoice-hourly", status=200)
    measured.read()
    names = {name for name, _ in measured.sums} | {name for name, _ in measured.samples}
    assert {"dedup.slot.outcomes", "dedup.slot.attempts", "dedup.claim.round_trips"} <= names
    keys = {key for _, attributes in [*measured.sums, *measured.samples] for key, _ in attributes}
    assert keys <= {"scheduler_job", "job", "outcome", "source"}
    assert measured.counts(OUTCOMES, by="outcome", job="invoice") == {"ran_once": 3}
    assert len(measured.samples) == 3  # delay, duration, attempts: one series each for the job


def test_a_pause_whose_catch_up_failed_is_counted_once_by_the_resume_sent_again(cloud_tasks, site, clock, measured):
    """The resume's queue failed (502): its left slots are counted by the resume sent again, the
    one whose catch-up went out, once, however often it is sent after."""
    site.get("/tasks/audit", headers=CRON)
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {})
    clock.advance(3 * 3600 + 60)
    site.get("/tasks/audit", headers=CRON)
    cloud_tasks.fail_next = [503]
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {"catch_up": "latest"}, status=502)
    assert measured.counts(OUTCOMES, by="outcome", scheduler_job="invoice-hourly") == {}
    for _ in range(2):
        site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {"catch_up": "latest"})
    # 00:00 to 02:00 left (03:00, the latest, is dispatched: its run will decide it).
    assert measured.counts(OUTCOMES, by="source", scheduler_job="invoice-hourly", outcome="paused") == {"resume": 3}


def test_a_pause_scheduler_yaml_ended_is_counted_once_by_the_audit(
    google, ndb_client, tmp_path, clock, monkeypatch, measured
):
    """No resume request comes for a pause scheduler.yaml ended: an hour after it ended, the audit
    counts the slots it left, once."""
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    paused = SCHEDULES.replace('schedule: "0 * * * *"\n  flaky', 'schedule: "0 * * * *"\n    paused: true\n  flaky')
    first = schedule_site(tmp_path / "v1", JOBS, paused, clock, ndb_client)
    first.get("/tasks/audit", headers=CRON)  # the version that says paused: true applies it
    clock.advance(3 * 3600 + 60)
    first.get("/tasks/audit", headers=CRON)  # judges 00:00 to 02:00 while the pause lasts
    resumed = schedule_site(tmp_path / "v2", JOBS, paused.replace("paused: true", "paused: false"), clock, ndb_client)
    resumed.get("/tasks/audit", headers=CRON)  # the next version resumes it at 03:01
    assert measured.counts(OUTCOMES, by="outcome", scheduler_job="invoice-hourly") == {}
    clock.advance(3600)
    for _ in range(2):
        resumed.get("/tasks/audit", headers=CRON)
    assert measured.counts(OUTCOMES, by="source", scheduler_job="invoice-hourly", outcome="paused") == {
        "audit": 4  # 00:00 to 02:00 left by the pause, and 03:00, judged after it ended
    }


def test_a_mark_kept_from_before_progress_was_noted_counts_from_now(site, clock, measured, ndb_client):
    """A deploy of this code finds marks with no progress_at: their age counts from then, so no
    slow job pages for progress it made before the deploy."""
    from models.audit import AuditMark

    site.get("/tasks/audit", headers=CRON)
    with ndb_client.context():
        for mark in AuditMark.query():  # as the version before wrote them
            mark.progress_at = None
            mark.put()
    clock.advance(5 * 86400)
    site.get("/tasks/audit", headers=CRON)  # nothing ran for five days: judged now, counted from now
    assert measured.gauges("dedup.slot.progress_age", by="scheduler_job", scheduler_job="invoice-hourly") == {
        "invoice-hourly": 0.0
    }
    clock.advance(900)
    site.get("/tasks/audit", headers=CRON)
    assert measured.gauges("dedup.slot.progress_age", by="scheduler_job")["invoice-hourly"] == 900.0


def test_a_pause_kept_from_before_counting_was_noted_is_not_counted_again():
    """An ended pause stored by the version before was counted by its resume then; a lasting one
    was not, and is counted when it ends."""
    from schedules.intervals import Pause

    ended = {"since": "2030-01-01T00:00:00.000000Z", "paused_by": "a", "until": "2030-01-01T01:00:00.000000Z"}
    lasting = {"since": "2030-01-01T00:00:00.000000Z", "paused_by": "a", "until": None}
    assert Pause.from_document(ended).counted is True and Pause.from_document(lasting).counted is False
    fresh = Pause.from_document({**ended, "counted": False})
    assert fresh.counted is False and Pause.from_document(fresh.stored()) == fresh
