"""Issue 41's evidence: the alert policies `deploy alerts` writes, evaluated over a night's metrics.

The app is driven through a night minute by minute (Cloud Scheduler's deliveries at each slot,
the audit every 15 minutes as cron.yaml calls it), and the slot outcomes it counts are read
after each step with the SDK's in-memory reader.  The policies are then evaluated over those
points as Cloud Monitoring would: a threshold condition opens an incident when its filter's
outcome is counted for a job; a metric absence when its filter's outcomes stop for longer than
its duration.  The filters are read from the policies themselves, so a policy that watched the
wrong outcome or waited too little fails here.

An exclusion window over the night raises nothing, whether Scheduler delivers its slots (answered
``excluded``) or not (the audit counts them); the same night with no window and no deliveries
raises both the missed-slot and the forward-progress alerts, so the evaluation can fail.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

import pytest

from dedup.keys import format_utc
from deploy.monitoring import progress_policies, slot_policy
from schedules.config import parse_scheduler_document
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.schedule_sites import CRON, T0, at, schedule_site

SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z
  attempt_deadline: 60s
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
    finish_within: 10m
%s"""
WINDOW = '    exclude:\n      - {cron: "0 1 * * *", duration: 3h, note: nightly maintenance}\n'
OUTCOMES = "dedup.slot.outcomes"
NIGHT_MINUTES = 7 * 60  # 00:00 to 07:00: the window is 01:00 to 04:00


def _outcomes(filter_: str) -> set[str]:
    single = re.findall(r'metric\.label\.outcome="([a-z_]+)"', filter_)
    several = re.findall(r"metric\.label\.outcome=one_of\(([^)]*)\)", filter_)
    return set(single) | {value.strip(' "') for group in several for value in group.split(",")}


def _jobs(filter_: str) -> set[str] | None:
    several = re.findall(r"metric\.label\.scheduler_job=one_of\(([^)]*)\)", filter_)
    return {value.strip(' "') for group in several for value in group.split(",")} if several else None


def incidents(policies: list[dict[str, Any]], points: list[tuple[int, str, str]], minutes: int) -> list[str]:
    """The incidents ``policies`` open over ``points`` ((minute, scheduler job, outcome) each
    counted slot), evaluated each minute up to ``minutes``, as Cloud Monitoring would."""
    opened = []
    for policy in policies:
        for condition in policy["conditions"]:
            if "conditionThreshold" in condition:
                watched = _outcomes(condition["conditionThreshold"]["filter"])
                for minute, job, outcome in points:
                    if outcome in watched:
                        opened.append(f"{condition['displayName']}: {job} at minute {minute}")
            else:
                absent = condition["conditionAbsent"]
                watched, jobs = _outcomes(absent["filter"]), _jobs(absent["filter"])
                wait = int(absent["duration"].rstrip("s")) // 60
                for job in jobs or ():
                    seen = sorted(minute for minute, named, outcome in points if named == job and outcome in watched)
                    # An absence is judged from the first point (a series that never was is not absent).
                    for before, after in zip(seen, [*seen[1:], minutes], strict=True):
                        if after - before > wait:
                            opened.append(f"{condition['displayName']}: {job} from minute {before}")
    return opened


def night(site, clock, measured, deliver_between: tuple[int, int] | None) -> list[tuple[int, str, str]]:
    """Drive the app through the night; the slot outcomes counted, with the minute each was.
    ``deliver_between``: the hours whose slots Scheduler does not deliver (an outage), or None."""
    points: list[tuple[int, str, str]] = []
    before: dict[str, int] = {}
    for minute in range(NIGHT_MINUTES + 1):
        clock.advance((T0 + datetime.timedelta(minutes=minute) - clock.now()).total_seconds())
        hour, past = divmod(minute, 60)
        silent = deliver_between is not None and deliver_between[0] <= hour < deliver_between[1]
        if past == 0 and not silent:
            headers = scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour))
            site.post("/jobs/invoice?project=acme-prod&location=us-central1", b"", headers=headers, status=200)
        if minute % 15 == 0:
            site.get("/tasks/audit", headers=CRON)
        now = measured.counts(OUTCOMES, by="outcome", scheduler_job="invoice-hourly")
        for outcome, total in now.items():
            points.extend((minute, "invoice-hourly", outcome) for _ in range(total - before.get(outcome, 0)))
        before = now
    return points


def policies_for(schedules: str) -> list[dict[str, Any]]:
    import yaml

    jobs = parse_scheduler_document(yaml.safe_load(schedules))
    progress = progress_policies("acme-prod", [], jobs)
    return [slot_policy("acme-prod", []), *progress]


@pytest.mark.parametrize("delivered", [True, False], ids=["delivered", "not-delivered"])
def test_an_exclusion_window_over_a_night_raises_no_alert(ndb_client, tmp_path, clock, measured, delivered):
    schedules = SCHEDULES % WINDOW
    site = schedule_site(tmp_path, JOBS, schedules, clock, ndb_client)
    points = night(site, clock, measured, None if delivered else (1, 4))
    counted = [outcome for _, _, outcome in points]
    assert counted.count("excluded") == 3 and counted.count("ran_once") == 5  # 01:00-03:00; 00:00, 04:00-07:00
    assert incidents(policies_for(schedules), points, NIGHT_MINUTES) == []


def test_the_same_night_unplanned_raises_the_missed_and_progress_alerts(ndb_client, tmp_path, clock, measured):
    schedules = SCHEDULES % ""
    site = schedule_site(tmp_path, JOBS, schedules, clock, ndb_client)
    points = night(site, clock, measured, (1, 4))  # Scheduler delivers nothing from 01:00 to 04:00
    opened = incidents(policies_for(schedules), points, NIGHT_MINUTES)
    assert [line.split(":")[0] for line in opened].count("A slot was missed") == 3
    assert [line for line in opened if line.startswith("No slot ran for 70 minutes")] == [
        "No slot ran for 70 minutes (1 Scheduler jobs): invoice-hourly from minute 0"
    ]


DAILY = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z
  attempt_deadline: 60s
jobs:
  invoice-daily:
    target: invoice
    schedule: "0 3 * * *"
"""
DAYS = 4


def days(site, clock, measured, delivered: set[int], audit_off: range = range(0)) -> list[tuple[int, str, float]]:
    """Drive the app through DAYS days, a pass every 15 minutes (but in the minutes ``audit_off``):
    the progress ages each pass wrote, with its minute.  ``delivered``: the days whose 03:00 slot
    Scheduler delivers."""
    ages: list[tuple[int, str, float]] = []
    for minute in range(0, DAYS * 24 * 60 + 1, 15):
        clock.advance((T0 + datetime.timedelta(minutes=minute) - clock.now()).total_seconds())
        day, of_day = divmod(minute, 24 * 60)
        if of_day == 3 * 60 and day in delivered:
            instant = format_utc(T0 + datetime.timedelta(days=day, hours=3))
            headers = scheduler_headers(scheduler_job_name="invoice-daily", schedule_time=instant)
            site.post("/jobs/invoice?project=acme-prod&location=us-central1", b"", headers=headers, status=200)
        if minute in audit_off:
            continue
        site.get("/tasks/audit", headers=CRON)
        now = measured.gauges("dedup.slot.progress_age", by="scheduler_job", scheduler_job="invoice-daily")
        ages += [(minute, job, age) for job, age in now.items()]  # a gauge keeps other tests' jobs: not theirs
    return ages


def age_incidents(policies: list[dict[str, Any]], ages: list[tuple[int, str, float]], minutes: int) -> list[str]:
    """The incidents the progress-age conditions open, as Cloud Monitoring would evaluate them: a
    threshold on each job's least age over the alignment period (an hour), and the absence of
    any age for the silence's duration."""
    opened = []
    for policy in policies:
        for condition in policy["conditions"]:
            threshold = condition.get("conditionThreshold")
            absent = condition.get("conditionAbsent")
            if threshold is not None and "progress_age" in threshold["filter"]:
                period = int(threshold["aggregations"][0]["alignmentPeriod"].rstrip("s")) // 60
                for job in _jobs(threshold["filter"]) or ():
                    for now in range(0, minutes + 1, 15):
                        recent = [age for at_, named, age in ages if named == job and now - period < at_ <= now]
                        if recent and min(recent) > threshold["thresholdValue"]:
                            opened.append(f"{condition['displayName']}: {job} at minute {now}")
                            break
            elif absent is not None and "progress_age" in absent["filter"]:
                wait = int(absent["duration"].rstrip("s")) // 60
                seen = sorted({at_ for at_, _, _ in ages})
                for before, after in zip(seen, [*seen[1:], minutes], strict=True):
                    if after - before > wait:
                        opened.append(f"{condition['displayName']}: from minute {before}")
    return opened


@pytest.mark.parametrize(
    "delivered, audit_off, opened",
    [
        ({0, 1, 2, 3}, range(0), []),  # every day ran
        # Ran on the first day only: two days and the audit's lag later, one incident.
        ({0}, range(0), ["No slot ran for 48.3 hours (1 Scheduler jobs)"]),
        # The audit stopped for two hours on the second day: its silence is one incident.
        ({0, 1, 2, 3}, range(30 * 60, 32 * 60), ["The audit has not judged any slot for 60 minutes"]),
    ],
    ids=["ran", "stopped", "audit-silent"],
)
def test_a_daily_jobs_progress_is_watched_on_the_audits_progress_age(
    ndb_client, tmp_path, clock, measured, delivered, audit_off, opened
):
    site = schedule_site(tmp_path, JOBS, DAILY, clock, ndb_client)
    ages = days(site, clock, measured, delivered, audit_off)
    found = age_incidents(policies_for(DAILY), ages, DAYS * 24 * 60)
    assert [line.split(":")[0] for line in found] == opened
