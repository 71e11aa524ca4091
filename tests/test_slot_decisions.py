"""Issue 20 §§1-4 in process, on the emulator: what a slot's status may claim, and what an operator's run of it decides.

- §1 No record is "never ran" only within the ledger's horizon (the slot's time
  plus its job's retention); past it the slot is ``unknown``: listed so, out of
  the audit, and run by hand only when forced.
- §2 A reopen carries the attempt the operator saw: the same request again is
  answered from the attempt it started, never run a second time.
- §3 A slot is done only by a run of its own job; another job's run under its
  key is a ``conflict``, listed, audited and refused with the right words.
- §4 Audit passes that meet report a slot once.

The clock starts at 2030-01-01T00:00Z; ``invoice`` is kept 2 hours, so a slot
is remembered until two hours after its schedule time.
"""

from __future__ import annotations

import datetime
import logging
import textwrap
import urllib.parse

import pytest
import webtest

from dedup.keys import CLOCK_SKEW_SECONDS, format_utc
from handlers import create_app
from handlers.state import app_state
from tests import job_targets
from tests.support.callers import settle, slot_confirmation
from tests.support.deliveries import scheduler_headers

RETENTION = 7200
JOBS = f"""
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
    retention_seconds: {RETENTION}
  report:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 60
"""
SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z  # expected from the clock's start (else from the first request)
  retry: {retry_count: 2, min_backoff: 30s, max_backoff: 60s}
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
    attempt_deadline: 60s
"""
T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
CRON = {"X-Appengine-Cron": "true"}
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def site(datastore, ndb_client, tmp_path, clock):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(textwrap.dedent(JOBS))
    return webtest.TestApp(create_app(jobs_file=str(jobs), clock=clock, ndb_client=ndb_client))


def at(hour: float) -> str:
    return format_utc(T0 + datetime.timedelta(hours=hour))


def deliver(site, hour, job="invoice", status="*"):
    headers = scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour))
    return site.post(f"/jobs/{job}?project=acme-prod&location=us-central1", b"", headers=headers, status=status)


def listed(site, hour, job="invoice"):
    page = site.get(f"/api/v1/jobs/{job}/executions", params={"since": at(hour), "until": at(hour + 0.001)})
    return page.json["executions"][0]


def run_slot(site, hour, status="*", **query):
    suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
    return site.post(f"/api/v1/jobs/invoice/executions/{at(hour)}/run{suffix}", "", status=status)


def effects() -> int:
    return len(job_targets.EFFECTS)


def make_slot(site, clock, ndb_client, what: str) -> None:
    """Give the 00:00 slot a history: ``what`` it became (clock at 00:00:10)."""
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    clock.advance(10)
    job_targets.FAILURES["invoice"] = {"failed": ["permanent"], "released": ["retryable"]}.get(what, [])
    if what in ("completed", "failed", "released"):
        deliver(site, 0)
    elif what == "skipped":
        run_id = listed(site, 0)["run_id"]
        with ndb_client.context():
            Ledger(clock).claim_run(
                run_id,
                RunDescription("scheduler", "invoice"),
                RunPolicy(60, RETENTION),
                skip_reason="late",
            )


# -- §1: the ledger's horizon --------------------------------------------------------------------

HISTORIES = ["completed", "failed", "released", "skipped", "never delivered"]


@pytest.mark.parametrize("what", HISTORIES)
def test_within_the_horizon_a_slot_shows_what_happened_and_past_it_unknown(site, clock, ndb_client, what):
    make_slot(site, clock, ndb_client, what)
    clock.advance(RETENTION - 20)  # 01:59:50: every window long closed, every record still kept
    within = listed(site, 0)
    expected = {"completed": "completed", "failed": "failed", "skipped": "skipped"}.get(what, "missed")
    assert within["status"] == expected
    assert within["remembered_until"] == at(RETENTION / 3600)
    clock.advance(3600)  # 02:59:50: whatever the record said, it has expired
    past = listed(site, 0)
    assert past["status"] == "unknown" and "run" not in past
    assert listed(site, 2)["status"] == "missed"  # a slot within the horizon is still judged


def test_a_slot_delivered_early_within_the_clock_skew_is_remembered_its_whole_retention(site, clock):
    """The horizon is counted from the schedule time, so the record must be too."""
    clock.advance(3600 - CLOCK_SKEW_SECONDS)  # 00:59:50: the 01:00 slot's delivery, as early as it may be
    ran = deliver(site, 1, status=200).json
    assert ran["status"] == "completed" and ran["run_id"] == listed(site, 1)["run_id"]  # the slot's own
    clock.advance(CLOCK_SKEW_SECONDS + RETENTION - 1)  # a second before 01:00 + retention
    assert listed(site, 1)["status"] == "completed"


def test_a_slot_that_has_not_come_is_not_run_by_hand_and_its_delivery_runs_it(site, clock):
    """Taking the 01:00 slot at 00:00 would answer 01:00's own delivery as a duplicate."""
    clock.advance(3600 - CLOCK_SKEW_SECONDS - 1)  # 00:59:49: a second beyond the skew allowed
    refused = run_slot(site, 1, attempt=0, status=422).json
    assert refused["error"] == "SlotNotDue" and refused["execution_status"] == "upcoming"
    assert "manual run" in refused["message"] and effects() == 0
    assert listed(site, 1)["status"] == "upcoming" and "run" not in listed(site, 1)
    clock.advance(11)  # 01:00:00
    delivered = deliver(site, 1, status=200).json
    assert delivered["duplicate"] is False and effects() == 1


def test_an_unknown_slot_runs_by_hand_only_when_forced_and_once(site, clock, ndb_client):
    make_slot(site, clock, ndb_client, "completed")
    clock.advance(RETENTION + 60)
    refused = run_slot(site, 0, attempt=0, status=422).json
    assert refused["error"] == "ExecutionUnknown" and "force=true" in refused["message"]
    assert effects() == 1  # the completed run was not run again
    forced = run_slot(site, 0, attempt=0, force="true", status=200).json
    assert forced["status"] == "completed" and forced["duplicate"] is False and effects() == 2
    again = run_slot(site, 0, attempt=0, force="true", status=200).json
    assert again["duplicate"] is True and effects() == 2
    assert listed(site, 0)["status"] == "completed"


def test_the_audit_never_calls_an_unknown_slot_missed(site, clock, ndb_client, caplog):
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    site.get("/tasks/audit", headers=CRON)  # the mark starts at 00:00
    make_slot(site, clock, ndb_client, "completed")
    clock.advance(RETENTION + 1800)  # 02:30: the audit was down; 00:00's record has expired
    answer = site.get("/tasks/audit", headers=CRON).json
    assert [m["schedule_time"] for m in answer["missed"]] == [at(1), at(2)]  # never delivered
    assert answer["unverified"] == 1
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert {r.schedule_time for r in errors} == {at(1), at(2)}
    (warning,) = [r for r in caplog.records if getattr(r, "outcome", None) == "unverified"]
    assert "could not be checked" in warning.getMessage() and warning.slots == 1


def test_the_dashboard_asks_to_force_an_unknown_slot(site, clock, ndb_client):
    make_slot(site, clock, ndb_client, "completed")
    clock.advance(RETENTION + 60)  # 02:01: the 00:00 slot is a day-old card's unknown
    page = site.get("/admin/")
    form = slot_confirmation(site, page, at(0))
    assert form.fields["force"][0].attrs.get("required") is not None
    unticked = site.post(form.action, dict(form.submit_fields()), content_type=FORM, status=422)
    assert "may have completed" in unticked.text and effects() == 1
    form["force"] = True
    assert form.submit(status=303).headers["Location"].endswith("?queued=0")
    assert settle(site) == [200] and effects() == 2  # the task carried the operator's force


# -- §2: a reopen is one decision ---------------------------------------------------------------


def test_the_same_reopen_sent_twice_runs_once(site, clock):
    job_targets.FAILURES["invoice"] = ["permanent"] * 5
    clock.advance(10)
    deliver(site, 0, status=422)
    seen = listed(site, 0)["run"]["attempt"]
    first = run_slot(site, 0, attempt=seen, status=422).json
    assert first["attempt"] == 2 and first["duplicate"] is False and effects() == 2
    for _ in range(3):  # a double click, a lost answer, a client's timeout
        again = run_slot(site, 0, attempt=seen, status=422).json
        assert again["attempt"] == 2 and again["duplicate"] is True
    assert effects() == 2
    # A new decision, made on what the operator now sees, is a new attempt.
    assert run_slot(site, 0, attempt=2, status=422).json["attempt"] == 3 and effects() == 3


@pytest.mark.parametrize("history", ["failed", "skipped"])
def test_a_reopen_without_the_attempt_seen_is_refused_and_names_it(site, clock, ndb_client, history):
    make_slot(site, clock, ndb_client, history)
    before = effects()
    refused = run_slot(site, 0, status=428).json
    assert refused["error"] == "PreconditionRequired" and refused["attempt"] == listed(site, 0)["run"]["attempt"]
    assert effects() == before


@pytest.mark.parametrize("attempt", ["-1", "1.0", "one", "", "１", "9" * 30])
def test_a_malformed_attempt_is_a_400(site, clock, ndb_client, attempt):
    make_slot(site, clock, ndb_client, "failed")
    assert run_slot(site, 0, attempt=attempt, status=400).json["error"] == "InvalidParameterException"
    assert effects() == 1


def test_a_missed_slot_run_twice_without_an_attempt_runs_once(site, clock):
    """No record, no precondition needed: but its failure is then not reopened by a repeat."""
    job_targets.FAILURES["invoice"] = ["permanent"] * 3
    clock.advance(3600)
    assert listed(site, 0)["status"] == "missed"
    assert run_slot(site, 0, status=422).json["attempt"] == 1
    assert run_slot(site, 0, status=428).json["attempt"] == 1
    assert effects() == 1


def test_the_dashboard_form_posted_twice_reopens_once(site, clock):
    job_targets.FAILURES["invoice"] = ["permanent"] * 5
    clock.advance(10)
    deliver(site, 0, status=422)
    page = site.get("/admin/")
    form = slot_confirmation(site, page, at(0))
    assert form["attempt"].value == "1"
    first = form.submit(status=303)
    assert first.headers["Location"].endswith("?queued=1")  # queued to replace attempt 1
    settle(site)
    resent = form.submit(status=303)  # the same form again: back, then resubmit
    assert first.headers["Location"].split("?")[0] == resent.headers["Location"].split("?")[0] and effects() == 2
    assert resent.headers["Location"].endswith("?answer=already")  # the second send says it ran nothing
    page = site.get(first.headers["Location"]).html  # the page the first send went to: started, and how it ended
    assert page.find(id="answer").text.startswith("Started") and page.find(id="outcome").text == "failed"


# -- §3: a slot is done only by its own job's run --------------------------------------------


def test_another_jobs_run_under_a_slots_key_is_a_conflict_everywhere(site, clock, caplog):
    caplog.set_level(logging.ERROR, logger="dedup.audit")
    site.get("/tasks/audit", headers=CRON)
    clock.advance(10)
    assert deliver(site, 0, job="report", status=200).json["job_id"] == "report"  # misrouted
    clock.advance(3600)
    slot = listed(site, 0)
    assert slot["status"] == "conflict" and slot["recorded_job_id"] == "report"
    # The misrouted run is listed under its own job, as a run no slot of its explains.
    report = site.get("/api/v1/jobs/invoice/executions", params={"since": at(0), "until": at(1)}).json
    assert report["unscheduled"] == []
    # The slot's own job refuses it (422), and the dashboard says why instead of showing the other run.
    assert run_slot(site, 0, attempt=0, status=422).json["error"] == "JobMismatch"
    page = site.get("/admin/")
    card = page.html.select_one(".job-card[data-job='invoice']")
    assert card.select_one("a.count[data-status='conflict']")["data-count"] == "1"  # counted, and a link
    action = f"/admin/jobs/invoice/executions/{at(0)}/run"
    fields = {"scheduler_job": "invoice-hourly", "project": "acme-prod", "location": "us-central1", "attempt": "1"}
    refused = site.post(action, fields, content_type=FORM, status=422)
    assert "another job (report)" in refused.text and "Location" not in refused.headers
    assert job_targets.EFFECTS[0]["job_id"] == "report" and effects() == 1
    answer = site.get("/tasks/audit", headers=CRON).json
    assert [c["schedule_time"] for c in answer["conflicts"]] == [at(0)]
    assert at(0) not in [m["schedule_time"] for m in answer["missed"]]
    # Logged with the request lines' word for another job's run under the key (never "conflict",
    # which the logs use for a client token reused with other parameters).
    assert any(getattr(r, "outcome", None) == "job_mismatch" and r.name == "dedup.audit" for r in caplog.records)


# -- §4: audit passes that meet report a slot once ---------------------------------------------


def test_two_passes_that_computed_the_same_mark_report_once(site, clock, ndb_client, monkeypatch):
    """Pass A reads the mark and finds 00:00 missed; pass B does the same and commits first."""
    from dedup.ledger import Ledger, RunDescription, RunPolicy
    from schedules import audit as audit_module

    site.get("/tasks/audit", headers=CRON)
    clock.advance(1800)
    run_id = listed(site, 1)["run_id"]
    with ndb_client.context():  # 01:00 will hold a live lease past its window: both marks stop before it
        Ledger(clock).claim_run(run_id, RunDescription("scheduler", "invoice"), RunPolicy(3 * 3600, RETENTION))
    clock.advance(3600)  # 01:30
    real = audit_module.transact
    other: list = []

    def meets_another_pass(body, patience, store):
        if not other:  # B, in full, between A's reading of the mark and A's transaction
            other.append(None)
            other[0] = audit_module.audit(app_state().ledger, app_state().bound_schedules)
        return real(body, patience, store)

    monkeypatch.setattr(audit_module, "transact", meets_another_pass)
    first = site.get("/tasks/audit", headers=CRON).json  # A: computed before B committed
    reported = [m["schedule_time"] for m in first["missed"]] + [
        format_utc(m.slot.schedule_time) for m in other[0].missed
    ]
    assert reported == [at(0)]


def test_a_pass_whose_answer_was_lost_and_whose_mark_moved_on_still_reports(site, clock, monkeypatch):
    """A's commit lands, its answer is lost, B moves the mark on, then A's retry runs: A reports."""
    from schedules import audit as audit_module

    site.get("/tasks/audit", headers=CRON)
    clock.advance(1800 + 3600)  # 01:30: 00:00 was missed
    real = audit_module.transact
    later: list = []

    def lost_answer_then_another_pass(body, patience, store):
        if later:
            return real(body, patience, store)
        later.append(None)
        real(body, patience, store)  # A's commit lands; its answer is lost
        clock.advance(60)
        later[0] = audit_module.audit(app_state().ledger, app_state().bound_schedules)  # B moves on from it
        return real(body, patience, store)  # A's retry of the same transaction

    monkeypatch.setattr(audit_module, "transact", lost_answer_then_another_pass)
    first = site.get("/tasks/audit", headers=CRON).json
    assert [m["schedule_time"] for m in first["missed"]] == [at(0), at(1)]
    assert later[0].reported == []
