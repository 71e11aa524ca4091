"""Knowing the schedule: every expected execution of a job from scheduler.yaml, with its status.

The clock starts at 2030-01-01T00:00Z.  The hourly job's retry window is what
schedules.config.retry_window_seconds says for its retry settings, plus the
delivery grace; the tests derive it the same way rather than hard-coding it.
"""

from __future__ import annotations

import datetime
import textwrap
import urllib.parse

import pytest
import webtest

from dedup.keys import format_utc, scheduled_run_key
from handlers import create_app
from schedules.bound import BoundJob
from schedules.config import ScheduleSettingError, load_scheduler_file
from schedules.slots import DELIVERY_GRACE_SECONDS, MAX_SLOTS, Slot, slots_between
from tests import job_targets
from tests.support.callers import settle, slot_confirmation
from tests.support.deliveries import scheduler_headers

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
    retention_seconds: 604800
  report:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 60
    retention_seconds: 604800
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
    body: '{"mode": "full"}'
  report-paris:
    target: report
    schedule: "30 1 * * *"
    time_zone: Europe/Paris
    attempt_deadline: 60s
    pass_scope: false
"""
T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture
def site(datastore, ndb_client, tmp_path, clock):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(textwrap.dedent(JOBS))
    app = create_app(jobs_file=str(jobs), clock=clock, ndb_client=ndb_client)
    return webtest.TestApp(app)


def window(tmp_path) -> float:
    """Seconds from a slot to the close of its retry window, as the app derives it."""
    (tmp_path / "w.yaml").write_text(textwrap.dedent(SCHEDULES))
    job = load_scheduler_file(str(tmp_path / "w.yaml"))[0]
    return (Slot(job, T0).window_closes - T0).total_seconds()


def deliver_slot(site, hour: int, status="*", job="invoice", name="invoice-hourly", **query):
    path = f"/jobs/{job}?project=acme-prod&location=us-central1"
    when = format_utc(T0 + datetime.timedelta(hours=hour))
    return site.post(path, b"", headers=scheduler_headers(scheduler_job_name=name, schedule_time=when), status=status)


def executions(site, **params):
    return site.get("/api/v1/jobs/invoice/executions", params=params).json


def test_each_expected_slot_has_the_run_id_a_delivery_gets(site, clock):
    clock.advance(3 * 3600 + 10)  # 03:00:10
    deliver_slot(site, 1, status=200)
    listing = executions(site, since="2030-01-01T00:00:00Z", until="2030-01-01T04:00:00Z")
    assert listing["scheduler_jobs"] == ["invoice-hourly"]
    times = [e["schedule_time"] for e in listing["executions"]]
    assert times == [f"2030-01-01T0{h}:00:00.000000Z" for h in range(4)]
    delivered = scheduled_run_key(
        "invoice-hourly", "2030-01-01T01:00:00Z", query_project="acme-prod", query_location="us-central1"
    ).run_id
    assert listing["executions"][1]["run_id"] == delivered
    assert listing["executions"][1]["status"] == "completed"
    assert listing["executions"][1]["run"]["attempt"] == 1


def test_every_status_of_a_slot(site, clock, tmp_path):
    closes = window(tmp_path)
    job_targets.FAILURES["invoice"] = [None, "permanent", "retryable", "retryable"]
    clock.advance(3600 * 5 + 30)  # 05:00:30
    deliver_slot(site, 0, status=200)  # completed
    deliver_slot(site, 1, status=422)  # failed
    deliver_slot(site, 2, status=500)  # released, its window long closed by now
    deliver_slot(site, 5, status=500)  # released, retries still to come
    listing = executions(site, since="2030-01-01T00:00:00Z", until="2030-01-01T08:00:00Z")
    statuses = {e["schedule_time"][11:13]: e["status"] for e in listing["executions"]}
    assert closes < 3600  # the slots of 00:00 to 03:00 have closed windows at 05:00:30
    assert statuses == {
        "00": "completed",
        "01": "failed",
        "02": "missed",  # released, and no retry can come any more
        "03": "missed",  # nothing arrived
        "04": "missed",
        "05": "released",
        "06": "upcoming",
        "07": "upcoming",
    }
    released = next(e for e in listing["executions"] if e["schedule_time"].startswith("2030-01-01T05"))
    assert released["run"]["status"] == "released" and "the bank is busy" in released["run"]["outcome"]


def test_a_slot_is_due_until_its_window_closes(site, clock, tmp_path):
    closes = window(tmp_path)
    clock.advance(closes - 1)
    first = executions(site, since="2030-01-01T00:00:00Z", until="2030-01-01T00:00:01Z")["executions"]
    assert [e["status"] for e in first] == ["due"]
    assert first[0]["retry_window_closes"] == format_utc(T0 + datetime.timedelta(seconds=closes))
    clock.advance(1)
    assert [e["status"] for e in executions(site, since="2030-01-01T00:00:00Z", until="2030-01-01T00:00:01Z")[
        "executions"
    ]] == ["missed"]  # fmt: skip


def test_the_window_covers_every_retry_and_the_grace(tmp_path):
    # retry_count 2, backoff 30 s then 60 s, each of the 3 attempts up to its 60 s deadline.
    assert window(tmp_path) == 30 + 60 + 3 * 60 + DELIVERY_GRACE_SECONDS


def test_a_stuck_run_stays_stuck_once_nothing_can_take_it_over(site, clock, tmp_path, ndb_client):
    """Its attempt started and may have taken effect: never ``missed``, which says nothing ran."""
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    key = scheduled_run_key(
        "invoice-hourly", "2030-01-01T00:00:00Z", query_project="acme-prod", query_location="us-central1"
    )
    with ndb_client.context():
        Ledger(clock).claim_run(key.run_id, RunDescription("scheduler", "invoice"), RunPolicy(60, 604800))
    first_slot = {"since": "2030-01-01T00:00:00Z", "until": "2030-01-01T00:00:01Z"}
    clock.advance(120)  # the lease is over, but a retry can still take it over
    assert executions(site, **first_slot)["executions"][0]["status"] == "stuck"
    clock.advance(window(tmp_path))
    assert executions(site, **first_slot)["executions"][0]["status"] == "stuck"
    # The audit reports it once, as stuck; the API refuses to run it again unacknowledged, naming the key.
    reported = site.get("/tasks/audit", headers={"X-Appengine-Cron": "true"}).json
    assert [(m["run_id"], m["status"]) for m in reported["stuck"]] == [(key.run_id, "stuck")]
    assert key.run_id not in {m["run_id"] for m in reported["missed"]}
    assert site.get("/tasks/audit", headers={"X-Appengine-Cron": "true"}).json["stuck"] == []  # once
    url = "/api/v1/jobs/invoice/executions/2030-01-01T00:00:00Z/run?scheduler_job=invoice-hourly"
    refused = site.post(url, status=422).json
    assert refused["execution_status"] == "stuck" and key.run_id in refused["detail"]
    assert refused["downstream_key"] == key.run_id
    assert site.post(url + "&force=true", status="*").status_int in (200, 202)


def test_runs_that_match_no_slot_are_listed_apart(site, clock):
    clock.advance(100)
    site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}, status=201)
    deliver_slot(site, 0, status=200, name="an-old-name")  # a Scheduler job no longer declared
    listing = executions(site, since="2030-01-01T00:00:00Z", until="2030-01-01T01:00:00Z")
    assert [e["status"] for e in listing["executions"]] == ["due"]
    assert sorted(r["source"] for r in listing["unscheduled"]) == ["api", "scheduler"]


def test_time_zones_and_scope_come_from_the_scheduler_job(site, clock):
    clock.advance(3 * 86400)
    listing = site.get(
        "/api/v1/jobs/report/executions", params={"since": "2030-01-01T00:00:00Z", "until": "2030-01-03T00:00:00Z"}
    ).json
    # 01:30 in Paris is 00:30 UTC in winter.
    assert [e["schedule_time"] for e in listing["executions"]] == [
        "2030-01-01T00:30:00.000000Z",
        "2030-01-02T00:30:00.000000Z",
    ]
    unscoped = scheduled_run_key("report-paris", "2030-01-01T00:30:00Z").run_id  # pass_scope: false
    assert listing["executions"][0]["run_id"] == unscoped


def test_the_default_range_is_the_last_day_and_the_cap_pages(site, clock):
    clock.advance(86400 * 60)
    listing = executions(site)
    assert len(listing["executions"]) == 24 and listing["next_since"] is None
    assert listing["until"] == format_utc(clock.now())
    wide = executions(site, since="2030-01-01T00:00:00Z", until="2030-03-01T00:00:00Z")
    assert len(wide["executions"]) == MAX_SLOTS
    assert wide["next_since"] == format_utc(T0 + datetime.timedelta(hours=MAX_SLOTS))
    rest = executions(site, since=wide["next_since"], until="2030-03-01T00:00:00Z")
    assert rest["executions"][0]["schedule_time"] == wide["next_since"]


@pytest.mark.parametrize(
    "params, words",
    [
        ({"since": "yesterday"}, "since must be an RFC 3339"),
        ({"until": "2030-01-01"}, "until must be an RFC 3339"),
        ({"since": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"}, "since must be before until"),
    ],
)
def test_bad_ranges_are_400(site, params, words):
    response = site.get("/api/v1/jobs/invoice/executions", params=params, status=400)
    assert words in response.json["message"]


def test_unknown_jobs_and_apps_without_a_schedule_are_404(site, tmp_path, ndb_client, clock):
    site.get("/api/v1/jobs/nope/executions", status=404)
    (tmp_path / "alone").mkdir()
    jobs = tmp_path / "alone" / "jobs.yaml"  # no scheduler.yaml beside it
    jobs.write_text(textwrap.dedent(JOBS))
    plain = webtest.TestApp(create_app(jobs_file=str(jobs), clock=clock, ndb_client=ndb_client))
    assert "no schedule is loaded" in plain.get("/api/v1/jobs/invoice/executions", status=404).json["message"]


def test_a_scheduler_file_that_does_not_validate_stops_the_app(tmp_path, ndb_client, clock):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES).replace("target: report", "target: nope"))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(textwrap.dedent(JOBS))
    with pytest.raises(ScheduleSettingError, match="'nope' is not a job in jobs.yaml"):
        create_app(jobs_file=str(jobs), clock=clock, ndb_client=ndb_client)
    with pytest.raises(ScheduleSettingError, match="cannot read"):
        create_app(jobs_file=str(jobs), clock=clock, ndb_client=ndb_client, scheduler_file=str(tmp_path / "none.yaml"))


def test_slots_between_keeps_to_the_range_and_the_limit(tmp_path):
    (tmp_path / "s.yaml").write_text(textwrap.dedent(SCHEDULES))
    hourly = load_scheduler_file(str(tmp_path / "s.yaml"))[0]
    slots = slots_between([BoundJob(hourly)], T0, T0 + datetime.timedelta(hours=3))
    assert [s.schedule_time for s in slots] == [T0 + datetime.timedelta(hours=h) for h in range(3)]
    assert len(slots_between([BoundJob(hourly)], T0, T0 + datetime.timedelta(days=10), limit=5)) == 5


def run_slot(site, when, status="*", job="invoice", **params):
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    return site.post(f"/api/v1/jobs/{job}/executions/{when}/run{query}", "", status=status)


def slot_of(site, hour):
    since = f"2030-01-01T{hour:02d}:00:00Z"
    return executions(site, since=since, until=f"2030-01-01T{hour:02d}:00:01Z")["executions"][0]


def test_a_missed_slot_run_by_hand_and_a_late_retry_of_it_are_one_run(site, clock, tmp_path):
    clock.advance(3 * 3600)
    assert slot_of(site, 1)["status"] == "missed"
    ran = run_slot(site, "2030-01-01T01:00:00Z", status=200).json
    assert ran["status"] == "completed" and ran["duplicate"] is False
    assert ran["run_id"] == slot_of(site, 1)["run_id"]  # exactly the delivery's key
    assert job_targets.EFFECTS[0]["body"] == b'{"mode": "full"}'  # what Scheduler sends for this job
    late = deliver_slot(site, 1, status=200).json  # Scheduler's own retry, however late
    assert late["duplicate"] is True and len(job_targets.EFFECTS) == 1
    listed = slot_of(site, 1)
    assert listed["status"] == "completed" and listed["run"]["requested_by"] == "local"


def test_a_failed_slot_is_reopened_with_its_history_and_a_completed_one_is_not(site, clock):
    job_targets.FAILURES["invoice"] = ["permanent"]
    clock.advance(10)
    deliver_slot(site, 0, status=422)
    ran = run_slot(site, "2030-01-01T00:00:00Z", status=200, attempt=1).json
    assert ran["status"] == "completed" and ran["attempt"] == 2
    shown = site.get(f"/api/v1/runs/{ran['run_id']}").json
    assert [(a["attempt"], a["outcome"]) for a in shown["attempts"]] == [(1, "failed"), (2, "completed")]
    again = run_slot(site, "2030-01-01T00:00:00Z", status=200, attempt=2).json
    assert again["duplicate"] is True and len(job_targets.EFFECTS) == 2


def test_a_skipped_or_released_slot_is_reopened_and_a_running_one_is_409(site, clock, ndb_client):
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    clock.advance(2 * 3600 + 10)
    skipped_id = slot_of(site, 0)["run_id"]
    with ndb_client.context():
        Ledger(clock).claim_run(
            skipped_id, RunDescription("scheduler", "invoice"), RunPolicy(60, 604800), skip_reason="late"
        )
    assert slot_of(site, 0)["status"] == "skipped" and slot_of(site, 0)["reason"] == "late"
    seen = slot_of(site, 0)["run"]["attempt"]
    assert run_slot(site, "2030-01-01T00:00:00Z", status=200, attempt=seen).json["status"] == "completed"
    job_targets.FAILURES["invoice"] = ["retryable"]
    deliver_slot(site, 2, status=500)
    assert run_slot(site, "2030-01-01T02:00:00Z", status=200).json["attempt"] == 2
    running = slot_of(site, 1)["run_id"]
    with ndb_client.context():
        Ledger(clock).claim_run(running, RunDescription("scheduler", "invoice"), RunPolicy(60, 604800))
    assert run_slot(site, "2030-01-01T01:00:00Z", status=409).json["error"] == "RunInProgress"


@pytest.mark.parametrize(
    "when, params, status, words",
    [
        ("2030-01-01T00:30:00Z", {}, 404, "nearest: invoice-hourly: 2030-01-01T00:00:00.000000Z or 2030-01-01T01:00"),
        ("yesterday", {}, 400, "RFC 3339"),
        (
            "2030-01-01T00:00:00Z",
            {"scheduler_job": "other"},
            404,
            "no Scheduler job with scheduler_job='other' targets",
        ),
    ],
)
def test_a_time_that_is_not_a_slot_is_refused(site, when, params, status, words):
    response = run_slot(site, when, status=status, **params)
    assert words in response.json["message"]
    assert job_targets.EFFECTS == []


def test_the_audit_reports_each_missed_slot_once_and_never_blocks_a_late_delivery(site, clock, caplog):
    import logging

    caplog.set_level(logging.ERROR, logger="dedup.audit")
    cron = {"X-Appengine-Cron": "true"}
    assert site.get("/tasks/audit", headers=cron).json["missed"] == []  # a first pass starts from now
    clock.advance(3 * 3600 + 1800)  # 03:30
    deliver_slot(site, 1, status=200)
    every = site.get("/tasks/audit", headers=cron).json["missed"]
    first = [m["schedule_time"][11:16] for m in every if m["scheduler_job"] == "invoice-hourly"]
    assert first == ["00:00", "02:00", "03:00"]  # 01:00 ran; 03:00's window closed at 03:06:30
    assert [m["schedule_time"] for m in every if m["scheduler_job"] == "report-paris"] == [
        "2030-01-01T00:30:00.000000Z"  # the other job's slot of that night
    ]
    lines = [r for r in caplog.records if getattr(r, "outcome", None) == "missed"]
    assert len(lines) == 4 and all(r.levelname == "ERROR" for r in lines)
    assert {(r.job_id, r.scheduler_job) for r in lines} == {("invoice", "invoice-hourly"), ("report", "report-paris")}
    assert site.get("/tasks/audit", headers=cron).json["missed"] == []  # once per slot
    clock.advance(3600)  # 04:30: the 04:00 slot's window has closed
    assert [m["schedule_time"][11:16] for m in site.get("/tasks/audit", headers=cron).json["missed"]] == ["04:00"]
    # What the audit remembers is not a run: Scheduler's late retry of a reported slot still runs.
    assert deliver_slot(site, 2, status=200).json["status"] == "completed"
    assert site.get("/tasks/audit", headers=cron).json["missed"] == []


def hourly_missed(answer) -> list[str]:
    return [m["schedule_time"][11:16] for m in answer["missed"] if m["scheduler_job"] == "invoice-hourly"]


def test_the_audit_waits_for_a_run_whose_lease_outlives_its_window(site, clock, ndb_client):
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    cron = {"X-Appengine-Cron": "true"}
    site.get("/tasks/audit", headers=cron)  # the mark starts at 00:00
    clock.advance(3600)
    run_id = slot_of(site, 1)["run_id"]
    with ndb_client.context():  # 01:00's attempt crashes holding a 3-hour lease
        Ledger(clock).claim_run(run_id, RunDescription("scheduler", "invoice"), RunPolicy(3 * 3600, 604800))
    clock.advance(5400)  # 02:30
    reported = hourly_missed(site.get("/tasks/audit", headers=cron).json)
    assert reported == ["00:00"]  # 01:00 may still finish; what comes after it waits with it
    clock.advance(2 * 3600)  # 04:30: its lease ran out at 04:00, long after its window
    answer = site.get("/tasks/audit", headers=cron).json
    assert hourly_missed(answer) == ["02:00", "03:00", "04:00"]
    assert [m["schedule_time"][11:16] for m in answer["stuck"]] == ["01:00"]  # it started: stuck, not missed
    assert hourly_missed(site.get("/tasks/audit", headers=cron).json) == []


def test_a_capped_audit_pass_reports_no_slot_twice(datastore, ndb_client, clock):
    from dedup.ledger import Ledger
    from schedules.audit import audit
    from schedules.bound import BoundJob
    from schedules.config import SchedulerJob

    every_minute = BoundJob(
        SchedulerJob(
            name="minutely",
            target="invoice",
            schedule="* * * * *",
            project="acme-prod",
            location="us-central1",
        )
    )
    with ndb_client.context():
        ledger = Ledger(clock)
        assert audit(ledger, (every_minute,)).reported == []
        clock.advance(86400)
        passes = [audit(ledger, (every_minute,)).reported for _ in range(3)]
    assert [len(p) for p in passes][0] == MAX_SLOTS  # the cap
    times = [m.slot.schedule_time for p in passes for m in p]
    assert len(times) == len(set(times)) == 1440  # a day of closed windows, each slot once


def test_the_dashboard_shows_expected_slots_and_runs_a_missed_one(site, clock):
    clock.advance(3 * 3600 + 1800)  # 03:30
    deliver_slot(site, 3, status=200)
    page = site.get("/admin/")
    card = page.html.select_one(".job-card[data-job='invoice']")
    counts = {a["data-status"]: int(a["data-count"]) for a in card.select("a.count")}
    # Expected from 00:00 (start_at): 00:00 to 03:00; 03:00 ran. The day before is untracked, and
    # counted so: the counts add up to every slot of the window.
    assert counts["missed"] == 3 and counts["completed"] == 1 and counts["untracked"] > 0
    assert sum(counts.values()) == int(card.select_one("a.expected")["data-count"])
    # The timeline draws the window hour by hour: these three hours' buckets missed, 03:00's completed.
    strip = [r["data-drawn"] for r in page.html.select(".strip[data-job='invoice'] rect.bucket")]
    assert strip[-4:] == ["missed", "missed", "missed", "completed"]
    # Each count opens those slots of the window.
    missed = site.get(card.select_one("a.count[data-status='missed']")["href"]).html
    assert [tr["data-schedule-time"][11:16] for tr in missed.select("tr.slot-row")] == ["00:00", "01:00", "02:00"]
    assert missed.find(id="listing-total").find("b").text == "3"
    links = page.html.select("a.run-slot")
    assert "2030-01-01T02:00:00.000000Z" in links[0]["href"]  # the newest slot to run first
    form = slot_confirmation(site, page, "2030-01-01T02:00:00.000000Z")
    assert form.action == "/admin/jobs/invoice/executions/2030-01-01T02:00:00.000000Z/run"
    ran = form.submit(headers={"Sec-Fetch-Site": "same-origin"}, status=303)
    again = form.submit(headers={"Sec-Fetch-Site": "same-origin"}, status=303)  # a double click
    assert ran.headers["Location"].split("?")[0] == again.headers["Location"].split("?")[0]
    assert ran.headers["Location"].endswith("?queued=0")  # queued: the run's page at once
    assert settle(site) == [200]  # one task, however often the form was sent before it ran
    after = form.submit(headers={"Sec-Fetch-Site": "same-origin"}, status=303)  # a resend after the run
    assert after.headers["Location"].endswith("?answer=already")
    assert slot_of(site, 2)["status"] == "completed" and len(job_targets.EFFECTS) == 2
    bad = site.post(
        "/admin/jobs/invoice/executions/2030-01-01T02:30:00Z/run", {"scheduler_job": "invoice-hourly"}, status=404
    )
    assert "not a slot" in bad.text and bad.content_type == "text/html"


@pytest.mark.parametrize(
    "when", ["0001-01-01T00:00:00Z", "9999-12-31T23:00:00Z", "1999-12-31T23:00:00Z", "2100-01-01T00:00:00Z"]
)
def test_times_outside_the_schedule_range_are_400_never_500(site, when):
    for params in ({"since": when}, {"until": when}, {"since": "2000-01-01T00:00:00Z", "until": when}):
        response = site.get("/api/v1/jobs/invoice/executions", params=params, expect_errors=True)
        assert response.status_int == 400, (params, response.status)
    assert run_slot(site, when, status=400).json["error"] == "InvalidParameterException"
    page = site.post(f"/admin/jobs/invoice/executions/{when}/run", {"scheduler_job": "invoice-hourly"}, status=400)
    assert page.content_type == "text/html"


SHARED = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s}
jobs:
  a: {target: invoice, schedule: "* * * * *"}
  b: {target: invoice, schedule: "* * * * *"}
  c: {target: invoice, schedule: "* * * * *"}
"""


@pytest.mark.slow
def test_paging_never_splits_a_time_shared_by_several_scheduler_jobs(tmp_path, ndb_client, datastore, clock):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SHARED))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(textwrap.dedent(JOBS))
    site = webtest.TestApp(create_app(jobs_file=str(jobs), clock=clock, ndb_client=ndb_client))
    seen, since = [], "2029-12-31T00:00:00Z"
    while since:
        page = site.get(
            "/api/v1/jobs/invoice/executions", params={"since": since, "until": "2030-01-01T00:00:00Z"}
        ).json
        seen += [(e["scheduler_job"], e["schedule_time"]) for e in page["executions"]]
        since = page["next_since"]
    assert len(seen) == len(set(seen)) == 3 * 1440


def test_unscheduled_is_what_matches_no_slot_wherever_the_page_ends(site, clock):
    clock.advance(3 * 3600)
    deliver_slot(site, 0, status=200)  # created 03:00, for the 00:00 slot
    listing = executions(site, since="2030-01-01T01:00:00Z", until="2030-01-01T04:00:00Z")
    assert listing["unscheduled"] == []  # a delivered slot before since is still a slot's run


def test_a_late_delivery_of_a_released_run_that_started_something_adopts_it(make_client, clock, ndb_client):
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    late_jobs = "jobs:\n  invoice:\n    kind: python\n    target: tests.job_targets:scripted_failures\n"
    client = make_client(late_jobs + "    max_delay_seconds: 60\n")
    key = scheduled_run_key("invoice", "2030-01-01T00:00:00Z")
    with ndb_client.context():
        ledger = Ledger(clock)
        claimed = ledger.claim_run(
            key.run_id, RunDescription("scheduler", "invoice", "invoice", key.schedule_time), RunPolicy(60, 86400)
        )
        ledger.record_downstream(claimed.attempt, "executions/started")
        ledger.release_run(claimed.attempt, {"message": "busy"})
    clock.advance(600)
    headers = scheduler_headers(scheduler_job_name="invoice", schedule_time="2030-01-01T00:00:00Z")
    answer = client.post("/jobs/invoice", b"", headers=headers, status=200).json
    assert answer["status"] == "completed" and answer["downstream"] == "executions/started"  # finished, not skipped


def test_the_card_of_a_minutely_job_counts_its_whole_window(tmp_path, ndb_client, datastore, clock):
    """Issue 39 §1: a per-minute job's card and row count every slot of the window, not its newest few."""
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SHARED))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(textwrap.dedent(JOBS))
    site = webtest.TestApp(create_app(jobs_file=str(jobs), clock=clock, ndb_client=ndb_client))
    clock.advance(3600 + 30)  # 01:00:30
    page = site.get("/admin/").html
    card = page.select_one(".job-card[data-job='invoice']")
    counts = {a["data-status"]: int(a["data-count"]) for a in card.select("a.count")}
    assert sum(counts.values()) == int(card.select_one("a.expected")["data-count"])
    rows = page.select("tr.job-row")
    for row in rows:  # each row adds up, and its last expected slot is its newest
        counted = {a["data-status"]: int(a["data-count"]) for a in row.select("a.count")}
        assert sum(counted.values()) == int(row.select_one("a.expected")["data-count"]) > 0
    minutely = [row for row in rows if "* * * * *" in row.select_one(".schedule-words").text]
    assert minutely and all(row.select_one(".last time")["datetime"] == "2030-01-01T01:00:00Z" for row in minutely)
    assert all(int(row.select_one("a.expected")["data-count"]) == 24 * 60 for row in minutely)
