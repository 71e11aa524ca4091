"""Issue 24 §2: pause and resume, on the emulator, with the Cloud Scheduler stand-in.

Slots inside a pause interval are ``paused``, never ``missed``, and the audit raises
nothing for them; a delivery of one runs as usual and says so; slots before the pause
are unaffected.  Pausing and resuming are recorded by the app and done in Cloud
Scheduler too, and each is idempotent.

The clock starts at 2030-01-01T00:00Z; ``invoice-hourly`` runs at every full hour.
"""

from __future__ import annotations

import textwrap

import pytest
import webtest

from handlers import create_app
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.schedule_sites import CRON, at, schedule_site

SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z
  retry: {retry_count: 2, min_backoff: 30s, max_backoff: 60s}
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
    attempt_deadline: 60s
"""
JOB_PATH = "projects/acme-prod/locations/us-central1/jobs/invoice-hourly"


@pytest.fixture
def site(google, ndb_client, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    return schedule_site(tmp_path, JOBS, SCHEDULES, clock, ndb_client)


def listing(site, since: float, until: float) -> dict[str, dict]:
    page = site.get("/api/v1/jobs/invoice/executions", params={"since": at(since), "until": at(until)}).json
    return {e["schedule_time"]: e for e in page["executions"]}


def statuses(site, since: float, until: float) -> dict[str, str]:
    return {time: e["status"] for time, e in listing(site, since, until).items()}


def pause(site, body=None, status=200, name="invoice-hourly"):
    """A JSON body, ``{}`` by default: a JSON API takes nothing a cross-site form could send."""
    return site.post_json(f"/api/v1/scheduler-jobs/{name}/pause", {} if body is None else body, status=status)


def resume(site, status=200):
    return site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {}, status=status)


def deliver(site, hour: float):
    headers = scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour))
    return site.post("/jobs/invoice?project=acme-prod&location=us-central1", b"", headers=headers, status=200)


def test_a_paused_jobs_slots_are_paused_not_missed_and_the_audit_raises_nothing(site, clock, google):
    clock.advance(3600 + 1800)  # 01:30: 00:00 and 01:00 were never delivered
    paused = pause(site, {"note": "incident 4711: the CRM is down"}).json
    assert paused["paused"] is True and paused["changed"] is True
    assert paused["pause"] == {
        "since": at(1.5),
        "paused_by": "local",
        "note": "incident 4711: the CRM is down",
        "until": None,
        "resumed_by": None,
    }
    assert google.scheduler_states[JOB_PATH] == "PAUSED"
    clock.advance(5 * 3600)  # 06:30
    assert statuses(site, 0, 6.5) == {
        at(0): "missed",  # before the pause: unaffected
        at(1): "missed",
        **{at(hour): "paused" for hour in range(2, 7)},
    }
    assert listing(site, 2, 3)[at(2)]["pause"]["note"] == "incident 4711: the CRM is down"
    audited = site.get("/tasks/audit", headers=CRON).json
    assert [m["schedule_time"] for m in audited["missed"]] == [at(0), at(1)]
    listed = site.get("/api/v1/scheduler-jobs").json["scheduler_jobs"]
    assert [(j["scheduler_job"], j["paused"], j["pause"]["paused_by"]) for j in listed] == [
        ("invoice-hourly", True, "local")
    ]

    resumed = resume(site).json
    assert resumed["paused"] is False and resumed["changed"] is True
    assert google.scheduler_states[JOB_PATH] == "ENABLED"
    clock.advance(2 * 3600)  # 08:30: 07:00 and 08:00 are expected again, and were not delivered
    assert statuses(site, 6, 8.5) == {at(6): "paused", at(7): "missed", at(8): "missed"}
    again = site.get("/tasks/audit", headers=CRON).json
    assert [m["schedule_time"] for m in again["missed"]] == [at(7), at(8)]
    assert site.get("/api/v1/scheduler-jobs").json["scheduler_jobs"][0]["paused"] is False


def test_pausing_twice_is_one_pause_and_resuming_a_running_job_changes_nothing(site, clock, google):
    clock.advance(1)  # 00:00:01: the pause begins after the 00:00 slot
    first = pause(site).json
    clock.advance(60)
    second = pause(site, {"note": "again"}).json
    assert second["changed"] is False and second["pause"] == first["pause"]  # the first pause, its note kept
    assert [c.method for c in google.calls if "invoice-hourly" in c.path] == ["GET", "POST", "GET"]
    resume(site)
    again = resume(site).json
    assert again["changed"] is False and again["paused"] is False
    clock.advance(3600)
    assert statuses(site, 0, 1.1) == {at(0): "missed", at(1): "due"}  # the minute's pause covered no slot


def test_a_delivery_during_a_pause_runs_and_says_so(site, clock, caplog):
    clock.advance(1800)
    pause(site, {"note": "maintenance"})
    clock.advance(1800)  # 01:00: a tick that raced the pause
    caplog.set_level("INFO", logger="service.runs")
    answer = deliver(site, 1)
    assert answer.json["status"] == "completed" and answer.headers["X-Dedup-Schedule-Paused"] == at(0.5)
    assert len(job_targets.EFFECTS) == 1
    assert any("while invoice-hourly is paused" in r.getMessage() for r in caplog.records)
    slot = listing(site, 1, 1.1)[at(1)]
    assert slot["status"] == "completed" and slot["pause"]["note"] == "maintenance"
    before = deliver(site, 0)  # a late retry of a slot before the pause: unaffected, silent
    assert "X-Dedup-Schedule-Paused" not in before.headers


def test_a_paused_slot_can_be_run_by_hand(site, clock):
    pause(site)
    clock.advance(3600 + 600)
    assert statuses(site, 1, 1.1) == {at(1): "paused"}
    ran = site.post(f"/api/v1/jobs/invoice/executions/{at(1)}/run?attempt=0", status=200).json
    assert ran["duplicate"] is False and statuses(site, 1, 1.1) == {at(1): "completed"}


def test_when_cloud_scheduler_fails_the_pause_is_kept_and_the_same_request_finishes_it(site, clock, google):
    google.fail(":pause", status=503, api_status="UNAVAILABLE", message="try again", method="POST")
    refused = pause(site, status=502).json
    assert refused["error"] == "CloudSchedulerError" and refused["retryable"] is True
    assert "gcloud scheduler jobs pause invoice-hourly --location=us-central1 --project=acme-prod" in refused["detail"]
    assert refused["paused"] is True  # the app's record holds: its slots are not called missed
    assert google.scheduler_states.get(JOB_PATH, "ENABLED") == "ENABLED"
    again = pause(site).json
    assert again["changed"] is False and google.scheduler_states[JOB_PATH] == "PAUSED"


@pytest.mark.parametrize(
    "body, words",
    [
        ({"note": 5}, "note must be a string"),
        ({"note": "x" * 501}, "longer than 500"),
        ({"note": "line one\nforged line"}, "control characters"),
        ({"note": "ok", "until": "later"}, "at most a"),
        (["note"], "at most a"),
        ("note", "at most a"),
    ],
)
def test_a_bad_pause_request_is_400_and_pauses_nothing(site, google, body, words):
    refused = pause(site, body, status=400).json
    assert refused["error"] == "InvalidParameterException" and words in refused["detail"]
    assert site.get("/api/v1/scheduler-jobs").json["scheduler_jobs"][0]["paused"] is False
    assert not [c for c in google.calls if "invoice-hourly" in c.path]


def test_bodies_that_are_not_json_or_go_to_resume_are_refused(site):
    bad = site.post(
        "/api/v1/scheduler-jobs/invoice-hourly/pause", b"{nope", content_type="application/json", status=400
    ).json
    assert bad["error"] == "InvalidParameterException"
    refused = site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {"x": 1}, status=400).json
    assert 'at most "catch_up"' in refused["detail"]


def test_an_unknown_scheduler_job_is_404(site):
    assert "no Scheduler job 'nightly'" in pause(site, name="nightly", status=404).json["detail"]


def versioned_site(ndb_client, tmp_path, clock, extra: str) -> webtest.TestApp:
    """A version of the app whose scheduler.yaml adds ``extra`` to the job (a deploy)."""
    folder = tmp_path / f"v{len(list(tmp_path.glob('v*')))}"
    folder.mkdir()
    (folder / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES) + extra)
    (folder / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    site = webtest.TestApp(create_app(jobs_file=str(folder / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    site.get("/api/v1/scheduler-jobs")  # its first request records what the file says
    return site


def test_scheduler_yaml_pauses_when_a_version_that_says_so_first_runs(google, ndb_client, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    clock.advance(1800)
    paused = versioned_site(ndb_client, tmp_path, clock, '    paused: true\n    note: "migrating the CRM"\n')
    [job] = paused.get("/api/v1/scheduler-jobs").json["scheduler_jobs"]
    assert job["pause"]["paused_by"] == "scheduler.yaml" and job["pause"]["note"] == "migrating the CRM"
    assert google.scheduler_states[JOB_PATH] == "PAUSED"  # the app made Cloud Scheduler match the file
    clock.advance(3600)
    assert statuses(paused, 1, 1.1) == {at(1): "paused"}
    unsaid = versioned_site(ndb_client, tmp_path, clock, "")  # a later deploy that says nothing
    assert unsaid.get("/api/v1/scheduler-jobs").json["scheduler_jobs"][0]["paused"] is True
    clock.advance(3600)
    resumed = versioned_site(ndb_client, tmp_path, clock, "    paused: false\n")
    [job] = resumed.get("/api/v1/scheduler-jobs").json["scheduler_jobs"]
    assert job["paused"] is False and google.scheduler_states[JOB_PATH] == "ENABLED"
    # An operator pauses in an incident; another process of the same version starts: not undone.
    resumed.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {"note": "incident"})
    again = versioned_site(ndb_client, tmp_path, clock, "    paused: false\n")
    assert again.get("/api/v1/scheduler-jobs").json["scheduler_jobs"][0]["pause"]["note"] == "incident"
