"""Issue 37 §1: the day summaries a home row counts from are exact where they speak.

The week of devtools/week.py is delivered with the audit passing every hour, and every two
hours the home row of ``invoice-5min`` is held to a recount from the run records (the
executions listing, which reads a record per slot).  A share of the runs' notes is lost on
purpose (as a worker that dies after its answer loses one): the row must still agree, by
looking the slot up until the audit's pass repairs the summary.  The row must also read a few
entities, not a record per slot.
"""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

import pytest
import webtest

from dedup.keys import format_utc
from devtools import week
from handlers import job_rows
from handlers.job_rows import COUNTED
from models import RunRecord, RunStatus
from models.audit import AuditMark
from models.slot_day import SUMMARY_DAYS, SlotDay
from schedules import summaries
from schedules.summaries import JobSummaries, RunDigest, count_duplicate, days_between, repairs_for
from tests.support.schedule_sites import CRON

T = datetime.datetime(2030, 1, 8, 12, tzinfo=datetime.UTC)


def digest(status: RunStatus = RunStatus.COMPLETED, attempt: int = 1) -> RunDigest:
    return RunDigest("invoice", status, attempt, T + datetime.timedelta(seconds=3), T + datetime.timedelta(minutes=1))


def noted_bucket() -> SlotDay:
    """T's day's summary, holding the note of a run that completed at T at its first attempt."""
    bucket = SlotDay.fresh(SlotDay.key_for("p/l/j", T.date()), T.date())
    bucket.runs = {format_utc(T): digest().stored()}
    return bucket


def test_a_digest_is_kept_as_written_and_anything_else_reads_as_nothing():
    for status in RunStatus:
        kept = digest(status, 3)
        assert RunDigest.from_stored(kept.stored()) == kept
    unfinished = RunDigest("invoice", RunStatus.IN_PROGRESS, 1, None, T)
    assert RunDigest.from_stored(unfinished.stored()) == unfinished
    assert unfinished.lease_is_live(T - datetime.timedelta(seconds=1)) and not unfinished.lease_is_live(T)
    hostile: list[Any] = [
        None, 7, "completed", [], {"status": "completed"}, ["invoice", "done", 1, None, format_utc(T)],
        ["invoice", "completed", "one", None, format_utc(T)], ["invoice", "completed", 1, "yesterday", format_utc(T)],
        ["invoice", "completed", 1, None, None], ["invoice", "completed", 1, None, format_utc(T), "extra"],
    ]  # fmt: skip
    assert [RunDigest.from_stored(value) for value in hostile] == [None] * len(hostile)


def test_a_slot_is_spoken_for_by_its_note_or_by_an_audit_pass_that_kept_summaries_else_looked_up(ndb_context):
    day, bucket = T.date(), noted_bucket()  # keys and entities need a context (ndb_context), no call
    closes = datetime.timedelta(minutes=12)
    mark = AuditMark(
        checked_until=T + datetime.timedelta(hours=1),
        summarized_from=T - datetime.timedelta(hours=1),
        repairs={format_utc(T + datetime.timedelta(minutes=5)): digest(RunStatus.FAILED).stored()},
    )
    of_job = JobSummaries.of([bucket], [day], mark)
    assert of_job.facts(T, T + closes) == (True, digest())  # its note
    later = T + datetime.timedelta(minutes=5)
    assert of_job.facts(later, later + closes) == (True, digest(RunStatus.FAILED))  # the audit's repair
    missed = T + datetime.timedelta(minutes=10)
    assert of_job.facts(missed, missed + closes) == (True, None)  # judged, no run: it had none
    for unjudged in (T + datetime.timedelta(minutes=50), T - datetime.timedelta(hours=2)):
        assert of_job.facts(unjudged, unjudged + closes) == (
            False,
            None,
        )  # past the mark, or before the passes kept any
    assert JobSummaries.of([bucket], [day], AuditMark(checked_until=mark.checked_until)).facts(
        missed, missed + closes
    ) == (
        False,
        None,
    )  # a mark written before summaries says nothing of its slots
    # A bucket that holds another day of its ring is no summary of this one.
    stale = SlotDay.fresh(bucket.key, day - datetime.timedelta(days=SUMMARY_DAYS))
    stale.runs = bucket.runs
    assert JobSummaries.of([stale], [day], None).facts(T, T + closes) == (False, None)


def test_duplicates_are_counted_by_slot_and_read_back_over_the_slots_asked(ndb_context):  # keys need a context
    day = T.date()
    bucket = SlotDay.fresh(SlotDay.key_for("p/l/j", day), day)
    five, later = T + datetime.timedelta(minutes=5), T + datetime.timedelta(minutes=70)
    for when in (T, five, five, later):
        count_duplicate(bucket, when)
    assert bucket.duplicates == {format_utc(T): 1, format_utc(five): 2, format_utc(later): 1}
    of_job = JobSummaries.of([bucket], [day], None)
    assert of_job.duplicates([T, five]) == 3 and of_job.duplicates([T, five, later]) == 4
    assert of_job.duplicates([T - datetime.timedelta(days=1)]) == 0  # a day not read
    bucket.duplicates = {format_utc(T): "many", format_utc(five): -3, format_utc(later): True}
    assert of_job.duplicates([T, five, later]) == 0  # what this code did not write counts nothing
    assert days_between(T - datetime.timedelta(days=10), T) == [
        T.date() - datetime.timedelta(days=n) for n in (2, 1, 0)
    ]


def test_the_audit_repairs_what_the_notes_lack_or_say_otherwise_and_forgets_what_no_row_counts(ndb_context):
    of_job = JobSummaries.of([noted_bucket()], [T.date()], None)  # entities need a context, no call

    def record(status: RunStatus, attempt: int = 1) -> RunRecord:
        d = digest(status, attempt)
        return RunRecord(
            job_id=d.job_id, status=d.status, attempt=d.attempt, finished=d.finished, lease_expires=d.lease_expires
        )

    later, old = T + datetime.timedelta(minutes=5), T - datetime.timedelta(days=2)
    kept = {
        format_utc(old): digest().stored(),
        format_utc(T - datetime.timedelta(hours=3)): digest().stored(),
        "junk": 1,
    }
    judged = [
        (T, record(RunStatus.COMPLETED)),
        (later, record(RunStatus.COMPLETED, 2)),
        (T + datetime.timedelta(minutes=10), None),
    ]
    repairs = repairs_for(judged, of_job, kept, T + datetime.timedelta(hours=1))
    # The noted slot agrees with its record; the later one's note was lost; the missed one had no run.
    assert repairs == {
        format_utc(later): digest(RunStatus.COMPLETED, 2).stored(),
        format_utc(T - datetime.timedelta(hours=3)): digest().stored(),
    }
    # A note that says otherwise than the record (a slot run again by hand since) is repaired too.
    assert format_utc(T) in repairs_for([(T, record(RunStatus.COMPLETED, 3))], of_job, None, T)


def _row(site: webtest.TestApp) -> dict[str, Any]:
    row = site.get("/admin/").html.select_one("tr.job-row[data-scheduler-job='invoice-5min']")
    day = row.select_one(".day")
    more = day.select_one(".ran-more")
    return {
        "since": day.select_one("time")["datetime"] if day.select_one("time") else None,
        "expected": int(day.text.split("expected")[0].split(":")[-1]),
        "ran_once": int(day.select_one(".ran-once").text.split()[0]),
        "ran_more": int(more["data-count"]) if more else 0,
        "duplicates": int(day.select_one(".duplicates")["data-count"]),
        "counts": {c["data-status"]: int(c.text.split()[-1]) for c in row.select(".count")},
    }


def _recount(site: webtest.TestApp, now: datetime.datetime) -> dict[str, Any]:
    """The row's figures from the records: the executions listing reads the record of each slot."""
    since = now - datetime.timedelta(hours=24) + datetime.timedelta(seconds=1)
    listing = site.get(
        "/api/v1/jobs/invoice/executions",
        params={"since": format_utc(since), "until": format_utc(now)},
    ).json["executions"]
    statuses = Counter(e["status"] for e in listing)
    done = [e for e in listing if e["status"] in ("completed", "late")]
    once = sum(1 for e in done if e["run"]["attempt"] == 1)
    slots = [s for s in week.plan() if since <= s.schedule_time < now]
    return {
        "since": None,
        "expected": sum(n for status, n in statuses.items() if status not in ("untracked", "upcoming")),
        "ran_once": once,
        "ran_more": len(done) - once,
        "duplicates": sum(s.duplicates for s in slots),
        "counts": {status: statuses[status] for status in map(str, COUNTED) if statuses[status]},
    }


@pytest.mark.slow  # a week of deliveries, audited hourly and recounted every two hours: make test runs it
def test_every_row_of_a_week_agrees_with_a_recount_from_the_records_though_notes_are_lost(
    google, ndb_client, tmp_path, monkeypatch
):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    noted, lost = summaries.note_run, Counter[str]()

    def note_or_lose(scheduler_job: str, schedule_time: datetime.datetime, record: Any, store: Any = None) -> None:
        if schedule_time.minute % 25 == 10:  # one note in five is lost, as after a worker died
            lost["notes"] += 1
            raise ConnectionError("the worker died after its answer")
        noted(scheduler_job, schedule_time, record, store)

    monkeypatch.setattr(summaries, "note_run", note_or_lose)
    checks: list[datetime.datetime] = []
    looked_up: list[int] = []
    row_slots = job_rows._row_slots

    def spied(slots: Any, of_job: Any, now: Any) -> Any:
        found = row_slots(slots, of_job, now)
        looked_up.append(len(found.looked_up))
        return found

    monkeypatch.setattr(job_rows, "_row_slots", spied)

    def each_hour(site: webtest.TestApp, clock: Any) -> None:
        site.get("/tasks/audit", headers=CRON)
        now = clock.now()
        if now.hour % 2 == 0 and now > week.WEEK_START:
            row, recount = _row(site), _recount(site, now)
            assert row == recount, (now, row, recount)
            checks.append(now)

    app, clock = week.build_week(tmp_path / "week", ndb_client, each_hour=each_hour)
    site = webtest.TestApp(app)
    site.get("/tasks/audit", headers=CRON)
    looked_up.clear()
    assert _row(site) == _recount(site, clock.now())
    assert len(checks) == 7 * 12 - 1 and lost["notes"] > 100
    # Each run kept its note or the audit repaired it: after the last pass, the day's 288 slots are
    # spoken for but those whose retry window is still open (the row reads their records).
    assert len(looked_up) == 1 and looked_up[0] <= 3
