"""Issue 41 §4: exclusion windows, planned downtime in scheduler.yaml.

A slot inside one of its Scheduler job's windows is ``excluded``: not expected, never reported
by the audit, never late; its delivery is skipped (200, the reason saying so) and the job not
run, unless the job says ``run_excluded: true``; a Force run and an operator's run go ahead.

The clock starts at 2030-01-01T00:00Z; ``invoice-hourly`` runs at every full hour, with a
window each night from 01:00 for two hours (Europe/Paris: 00:00 to 02:00 UTC in winter).
"""

from __future__ import annotations

import json
import logging

import pytest
import webtest
from click.testing import CliRunner

from dedup.keys import format_utc
from deploy.cli import cli as ops_cli
from devtools.cloud_tasks_fake import to_webtest
from schedules.config import ScheduleFileError, parse_scheduler_document
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.schedule_sites import CRON, at, schedule_site

SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
    time_zone: Europe/Paris
    attempt_deadline: 60s
    finish_within: 10m
    exclude:
      - {cron: "0 1 * * *", duration: 2h, note: nightly maintenance}
      - {from: 2030-01-01T05:00:00Z, until: 2030-01-01T06:00:00Z}
%s"""


@pytest.fixture
def make_site(ndb_client, tmp_path, clock):
    def build(extra: str = "") -> webtest.TestApp:
        return schedule_site(tmp_path, JOBS, SCHEDULES % extra, clock, ndb_client)

    return build


def deliver(site, hour: float, status="*", **headers):
    return site.post(
        "/jobs/invoice?project=acme-prod&location=us-central1",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour), **headers),
        status=status,
    )


def statuses(site, since: float, until: float) -> dict[str, str]:
    page = site.get("/api/v1/jobs/invoice/executions", params={"since": at(since), "until": at(until)}).json
    return {e["schedule_time"]: e["status"] for e in page["executions"]}


def test_the_windows_slots_are_excluded_and_the_audit_reports_none_of_them(make_site, clock, caplog):
    site = make_site()
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    clock.advance(7 * 3600 + 180)  # 07:03: nothing was delivered all night
    assert statuses(site, 0, 7) == {
        at(0): "excluded",  # 01:00 Paris: the recurring window
        at(1): "excluded",
        at(2): "missed",
        at(3): "missed",
        at(4): "missed",
        at(5): "excluded",  # the dated window
        at(6): "missed",
    }
    answer = site.get("/tasks/audit", headers=CRON).json
    assert sorted(slot["schedule_time"] for slot in answer["missed"]) == [at(h) for h in (2, 3, 4, 6)]
    lines = [r for r in caplog.records if r.name == "dedup.audit"]
    assert not [r for r in lines if getattr(r, "schedule_time", None) in (at(0), at(1), at(5))]  # no alert
    # In the history too, and its legend says what it means.
    history = site.get("/admin/jobs/invoice/history", params={"day": "2030-01-01"}).text
    assert "excluded" in history and "exclusion windows (planned downtime)" in history


def test_a_delivery_in_a_window_is_skipped_saying_so_and_the_job_not_run(make_site, clock):
    site = make_site()
    clock.advance(60)
    answer = deliver(site, 0, status=200).json
    assert answer["status"] == "skipped" and answer["reason"].startswith("excluded: the slot lies in an exclusion")
    assert "nightly maintenance" in answer["reason"] and job_targets.EFFECTS == []
    assert deliver(site, 0, status=200).json["duplicate"] is True  # Scheduler's retry: the same answer
    assert statuses(site, 0, 0.5) == {at(0): "excluded"}
    # An operator runs it by hand all the same: excluded slots are runnable, unforced.
    site.post(f"/api/v1/jobs/invoice/executions/{at(0)}/run?attempt=0", status=200)  # the skipped record's
    assert len(job_targets.EFFECTS) == 1 and statuses(site, 0, 0.5) == {at(0): "completed"}


def test_run_excluded_runs_the_delivery_and_the_slot_is_still_not_expected(make_site, clock):
    site = make_site("    run_excluded: true\n")
    clock.advance(60)
    assert deliver(site, 0, status=200).json["status"] == "completed" and len(job_targets.EFFECTS) == 1
    clock.advance(2 * 3600)
    assert statuses(site, 0, 2) == {at(0): "completed", at(1): "excluded"}


def test_a_run_that_went_ahead_in_a_window_and_failed_shows_how_it_ended(ndb_client, tmp_path, clock):
    """Only a slot with no run, or a skipped one, is ``excluded``: an attempt that started there
    (run_excluded, an operator's) and was released or failed shows so, never hidden as planned."""
    text = (SCHEDULES % "    run_excluded: true\n").replace("target: invoice", "target: flaky")
    site = schedule_site(tmp_path, JOBS, text, clock, ndb_client)
    job_targets.FAILURES["flaky"] = ["retryable", "permanent"]
    clock.advance(60)
    headers = scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(0))
    site.post("/jobs/flaky?project=acme-prod&location=us-central1", b"", headers=headers, status=500)

    def status_of(hour: float) -> str:
        page = site.get("/api/v1/jobs/flaky/executions", params={"since": at(hour), "until": at(hour + 0.5)}).json
        return page["executions"][0]["status"]

    assert status_of(0) == "released"
    clock.advance(3600)
    assert status_of(0) == "missed"  # released and no retry came: what it is outside a window too
    site.post(
        "/jobs/flaky?project=acme-prod&location=us-central1",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(1)),
        status=422,
    )
    assert status_of(1) == "failed"


@pytest.mark.parametrize(
    "instant, covered",
    [
        # Spring forward (2026-03-08, America/New_York): from 00:30 EST (05:30Z) for two hours is
        # until 07:30Z, 03:30 EDT by the wall clock, not 02:30.
        ("2026-03-08T05:29:59Z", False),
        ("2026-03-08T05:30:00Z", True),
        ("2026-03-08T07:15:00Z", True),
        ("2026-03-08T07:30:00Z", False),
        # Fall back (2026-11-01): from 00:30 EDT (04:30Z) for two hours is until 06:30Z, 01:30 EST.
        ("2026-11-01T04:30:00Z", True),
        ("2026-11-01T06:29:59Z", True),
        ("2026-11-01T06:30:00Z", False),
        ("2026-11-01T07:15:00Z", False),
        # An ordinary night, for the contrast: 05:30Z to 07:30Z in winter time.
        ("2026-01-10T05:30:00Z", True),
        ("2026-01-10T07:29:59Z", True),
        ("2026-01-10T07:30:00Z", False),
    ],
)
def test_a_recurring_window_lasts_its_duration_across_a_change_of_clocks(instant, covered):
    import datetime
    import zoneinfo

    from schedules.config import ExclusionWindow

    window = ExclusionWindow.model_validate({"cron": "30 0 * * *", "duration": "2h"})
    moment = datetime.datetime.fromisoformat(instant)
    assert window.covers(moment, zoneinfo.ZoneInfo("America/New_York")) is covered


def test_a_force_run_in_a_window_runs(make_site, clock):
    """A Force run (Cloud Scheduler's jobs.run: a schedule time that is no slot's) is asked for by
    someone, now: it runs, window or not."""
    site = make_site()
    clock.advance(18 * 60)
    force = deliver(site, 0.3, status=200)  # 00:18 UTC, inside the night's window
    assert force.json["status"] == "completed" and len(job_targets.EFFECTS) == 1


def after_window_site(ndb_client, tmp_path, clock, mode: str) -> webtest.TestApp:
    return schedule_site(tmp_path, JOBS, SCHEDULES % f"    catch_up_after_exclusion: {mode}\n", clock, ndb_client)


@pytest.mark.parametrize("delivered", [True, False], ids=["delivered", "not-delivered"])
def test_after_a_window_its_newest_slot_runs_once_when_the_window_ends(
    cloud_tasks, ndb_client, tmp_path, clock, caplog, delivered
):
    """catch_up_after_exclusion: latest.  The night's window (00:00 to 02:00 UTC) held 00:00 and
    01:00; the pass that judges 01:00 dispatches it to run at 02:00, once, whatever passes follow."""
    import datetime

    from tests.support.schedule_sites import T0

    site = after_window_site(ndb_client, tmp_path, clock, "latest")
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    site.get("/tasks/audit", headers=CRON)  # the first pass sets the marks
    for hour in (0, 1):
        clock.advance((T0 + datetime.timedelta(hours=hour, seconds=30) - clock.now()).total_seconds())
        if delivered:
            assert deliver(site, hour, status=200).json["reason"].startswith("excluded")
    for minutes in range(75, 180, 15):  # 01:15 to 02:45, as cron calls the audit
        clock.advance((T0 + datetime.timedelta(minutes=minutes) - clock.now()).total_seconds())
        site.get("/tasks/audit", headers=CRON)
    (task,) = cloud_tasks.tasks
    assert (
        json.loads(task.body)["schedule_time"] == at(1) and json.loads(task.body)["requested_by"] == "exclusion-window"
    )
    # Dispatched by the 01:15 pass (01:00's retry window closed at 01:03), to wait until 02:00 and the
    # job's share of the spread: the queue's own clock counts it.
    wait = datetime.datetime.fromisoformat(task.schedule_time) - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(minutes=44) < wait <= datetime.timedelta(minutes=45 + 1)
    (line,) = [r for r in caplog.records if "exclusion window" in r.getMessage()]
    assert "its newest slot, " + at(1) + ", runs then" in line.getMessage()
    cloud_tasks.deliver(to_webtest(site), times=2)
    assert [format_utc(e["schedule_time"]) for e in job_targets.EFFECTS] == [at(1)]
    assert statuses(site, 0, 1.5) == {at(0): "excluded", at(1): "completed"}


def test_after_a_window_one_run_stands_for_its_slots(cloud_tasks, ndb_client, tmp_path, clock, measured):
    """catch_up_after_exclusion: compact: 01:00's run covers 00:00, excluded and skipped when delivered."""
    site = after_window_site(ndb_client, tmp_path, clock, "compact")
    site.get("/tasks/audit", headers=CRON)
    clock.advance(30)
    deliver(site, 0, status=200)  # skipped: excluded
    clock.advance(3 * 3600)
    site.get("/tasks/audit", headers=CRON)
    (task,) = cloud_tasks.tasks
    body = json.loads(task.body)
    assert body["schedule_time"] == at(1) and "covers" not in body  # the ledger says what it stands for
    cloud_tasks.deliver(to_webtest(site), times=2)
    (ran,) = job_targets.EFFECTS
    assert format_utc(ran["schedule_time"]) == at(1) and len(ran["covers"]) == 1
    assert statuses(site, 0, 1.5) == {at(0): "covered", at(1): "completed"}
    assert deliver(site, 0, status=200).json["duplicate"] is True and len(job_targets.EFFECTS) == 1
    # Each window slot was decided once, excluded; the run decides its own slot again: never covered too.
    counted = measured.counts("dedup.slot.outcomes", by="outcome", scheduler_job="invoice-hourly")
    assert counted["excluded"] == 2 and counted["ran_once"] == 1 and "covered" not in counted


@pytest.mark.parametrize(
    "window, words",
    [
        ({"cron": "0 1 * * *"}, "field 'exclude.0.duration': a recurring window needs cron and duration"),
        ({"duration": "1h"}, "field 'exclude.0.cron': a recurring window needs cron and duration"),
        ({"from": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"}, "an until after it"),
        ({"from": "2030-01-02T00:00:00Z"}, "field 'exclude.0.until': a dated window needs from"),
        ({"cron": "0 1 * * *", "duration": "1h", "until": "2030-01-01T00:00:00Z"}, "recurring (cron and duration)"),
        ({}, "a window is recurring (cron and duration) or dated (from and until)"),
        ({"cron": "0 25 * * *", "duration": "1h"}, "is not a unix-cron schedule"),
        ({"cron": "0 1 * * *", "duration": "0s"}, "field 'exclude.0.duration'"),
        ({"from": "yesterday", "until": "2030-01-01T00:00:00Z"}, "field 'exclude.0.from'"),
        ({"starts": "2030-01-01T00:00:00Z"}, "unknown key; allowed: cron, duration, from, note, until"),
    ],
)
def test_a_bad_window_is_refused_naming_its_field(window, words):
    with pytest.raises(ScheduleFileError) as caught:
        parse_scheduler_document(
            {
                "defaults": {"project": "acme-prod", "location": "us-central1"},
                "jobs": {"a": {"target": "invoice", "schedule": "0 * * * *", "exclude": [window]}},
            }
        )
    assert words in str(caught.value)


def test_plan_shows_the_windows(jobs_file, tmp_path):
    (tmp_path / "scheduler.yaml").write_text(SCHEDULES % "")
    arguments = ["--jobs", jobs_file(JOBS), "scheduler", "plan", "--assume-new", str(tmp_path / "scheduler.yaml")]
    planned = CliRunner().invoke(ops_cli, arguments)
    assert planned.exit_code == 0, planned.output
    assert "    excluded (Europe/Paris): from each '0 1 * * *' for 7200s (nightly maintenance)\n" in planned.output
    assert "    excluded (Europe/Paris): from 2030-01-01T05:00:00.000000Z until 2030-01-01T06:00:00.000000Z\n" in (
        planned.output
    )


def test_plan_says_what_follows_each_window(jobs_file, tmp_path):
    (tmp_path / "scheduler.yaml").write_text(SCHEDULES % "    catch_up_after_exclusion: compact\n")
    arguments = ["--jobs", jobs_file(JOBS), "scheduler", "plan", "--assume-new", str(tmp_path / "scheduler.yaml")]
    planned = CliRunner().invoke(ops_cli, arguments)
    assert planned.exit_code == 0, planned.output
    assert "    after each window: one run of its newest slot stands for its others\n" in planned.output


def test_the_timeline_draws_each_window_over_the_job_s_strip(make_site, clock):
    """Issue 41 §4: the operator's page shows the windows on the timeline, as spans of the strip
    with their times and note, in the strip's text alternative too."""
    site = make_site()
    clock.advance(7 * 3600 + 180)  # 07:03: the last 24 hours hold the night's window and the dated one
    page = site.get("/admin/", params={"job": "invoice"}).html
    strip = page.select_one("#timeline .strip[data-job='invoice']")
    spans = strip.select("rect.excluded-span")
    assert [(s["data-since"], s["data-until"]) for s in spans] == [(at(0), at(2)), (at(5), at(6))]
    buckets = strip.select("rect.bucket")
    first = buckets[0].title.text  # "2029-12-31 07:00 to 08:00 UTC: ..."
    assert first.startswith("2029-12-31 07:00")
    # Each span begins where its hour's bucket does: 10 units a bucket of an hour from 07:00.
    assert [float(s["x"]) for s in spans] == [17 * 10.0, 22 * 10.0]
    assert [float(s["width"]) for s in spans] == [20.0, 10.0]
    assert "nightly maintenance" in spans[0].title.text
    label = strip.select_one("svg.strip-marks")["aria-label"]
    assert "invoice-hourly: excluded from 2030-01-01 00:00 to 2030-01-01 02:00 UTC (nightly maintenance)" in label
    assert "exclusion window (planned downtime)" in page.select_one("#timeline p.muted").text


def test_a_window_longer_than_a_pass_catches_up_its_really_newest_slot(cloud_tasks, ndb_client, tmp_path, clock):
    """1,200 slots of a per-minute job in a 20-hour window, more than a pass judges or a page holds:
    `latest` runs 19:59, the window's last, not the thousandth."""
    text = (
        SCHEDULES.replace('"0 * * * *"', '"* * * * *"')
        .replace("    finish_within: 10m\n", "")
        .replace(
            '      - {cron: "0 1 * * *", duration: 2h, note: nightly maintenance}\n'
            "      - {from: 2030-01-01T05:00:00Z, until: 2030-01-01T06:00:00Z}\n",
            "      - {from: 2030-01-01T00:00:00Z, until: 2030-01-01T20:00:00Z}\n",
        )
    )
    site = schedule_site(tmp_path, JOBS, text % "    catch_up_after_exclusion: latest\n", clock, ndb_client)
    site.get("/tasks/audit", headers=CRON)
    clock.advance(20 * 3600 + 600)
    for _ in range(3):
        site.get("/tasks/audit", headers=CRON)
    (task,) = cloud_tasks.tasks
    assert json.loads(task.body)["schedule_time"] == at(20 - 1 / 60)
