"""Issue 24 §4: slots expected only from when the app knew the schedule, so no false misses.

A slot before the app first knew a Scheduler job's schedule (first seen in
scheduler.yaml, or its ``start_at``) is ``untracked``, never ``missed``, and the
audit's first pass starts there.  A changed schedule takes effect from
when the change was first seen; slots of the old one before then keep their meaning.

The clock starts at 2030-01-01T00:00Z; ``invoice-hourly`` runs at every full hour.
"""

from __future__ import annotations

import datetime
import textwrap

import pytest
import webtest
import yaml

from dedup.keys import format_utc
from handlers import create_app
from schedules.config import ScheduleFileError, SchedulerJob, parse_scheduler_document
from schedules.history import ScheduleVersion, bind, seen
from schedules.slots import slots_between
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.schedule_sites import CRON, T0, at

SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  retry: {retry_count: 2, min_backoff: 30s, max_backoff: 60s}
jobs:
  invoice-hourly:
    target: invoice
    schedule: "%s"
    attempt_deadline: 60s
%s"""


@pytest.fixture
def deploy(datastore, ndb_client, tmp_path, clock):
    """Deploy a version of the app with this schedule (and extra job settings), on one Datastore."""

    def build(schedule: str | None = "0 * * * *", extra: str = "") -> webtest.TestApp:
        """``schedule=None``: a version without scheduler.yaml."""
        version = tmp_path / f"v{len(list(tmp_path.iterdir()))}"
        version.mkdir()
        if schedule is not None:
            (version / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES % (schedule, extra)))
        (version / "jobs.yaml").write_text(textwrap.dedent(JOBS))
        return webtest.TestApp(create_app(jobs_file=str(version / "jobs.yaml"), clock=clock, ndb_client=ndb_client))

    return build


def listing(site, since: float, until: float) -> list[tuple[str, str]]:
    page = site.get("/api/v1/jobs/invoice/executions", params={"since": at(since), "until": at(until)}).json
    return [(e["schedule_time"], e["status"]) for e in page["executions"]]


def deliver(site, hour: float, status: int = 200):
    headers = scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour))
    return site.post("/jobs/invoice?project=acme-prod&location=us-central1", b"", headers=headers, status=status)


def test_a_fresh_deploy_lists_the_day_before_it_as_untracked_and_audits_nothing_of_it(deploy, clock):
    clock.advance(1800)  # 00:30: the first version that knows the schedule serves its first request
    site = deploy()
    card = site.get("/admin/").html.select_one(".job-card[data-job='invoice']")
    counts = {a["data-status"]: int(a["data-count"]) for a in card.select("a.count")}
    assert "missed" not in counts and counts["untracked"] == 24  # not "24 missed of the last 24"
    clock.advance(2 * 86400)  # two days on, nothing was ever delivered
    before = listing(site, -24, 0.5)
    assert len(before) == 25 and {status for _, status in before} == {"untracked"}
    assert listing(site, 0.5, 3) == [(at(1), "missed"), (at(2), "missed")]
    # The first pass starts where slots are expected: the 48 slots since the deploy, never the day before it.
    missed = [m["schedule_time"] for m in site.get("/tasks/audit", headers=CRON).json["missed"]]
    assert missed[0] == at(1) and len(missed) == 48 and at(0) not in missed


def test_the_first_request_records_when_slots_are_expected_and_later_versions_keep_it(deploy, clock):
    clock.advance(1800)
    deploy().get("/api/v1/jobs/invoice/executions")  # 00:30: first seen
    clock.advance(3 * 3600)  # 03:30: a new version, the schedule unchanged
    later = deploy()
    assert listing(later, -1, 3) == [(at(-1), "untracked"), (at(0), "untracked"), (at(1), "missed"), (at(2), "missed")]


def test_a_slot_before_it_was_expected_that_ran_shows_its_run(deploy, clock):
    """Runs before that time (delivered to an earlier version without scheduler.yaml) still show."""
    old = deploy(schedule=None)
    clock.advance(10)
    deliver(old, 0)
    clock.advance(1800)  # 00:30:10: the version that knows the schedule
    assert dict(listing(deploy(), -1, 0.5)) == {at(-1): "untracked", at(0): "completed"}


@pytest.mark.parametrize(
    "start_at, first_missed",
    [
        ("2029-12-31T22:00:00Z", -2),  # earlier than first seen: those slots were expected too
        ("2030-01-01T02:00:00Z", 2),  # later: nothing is expected before it
    ],
)
def test_start_at_sets_when_slots_are_expected(deploy, clock, start_at, first_missed):
    clock.advance(1800)
    site = deploy(extra=f"    start_at: {start_at}\n")
    clock.advance(4 * 3600)  # 04:30
    statuses = dict(listing(site, -3, 4))
    assert [t for t, status in statuses.items() if status == "missed"][0] == at(first_missed)
    assert all(status == "untracked" for t, status in statuses.items() if t < at(first_missed))


def test_a_changed_schedule_takes_effect_when_first_seen_and_the_old_slots_keep_their_meaning(deploy, clock):
    site = deploy()  # hourly, first seen at 00:00
    site.get("/api/v1/jobs/invoice/executions")
    clock.advance(10)
    deliver(site, 0)
    clock.advance(3 * 3600)  # 03:00:10: a version with the job at half past
    changed = deploy("30 * * * *")
    changed.get("/api/v1/jobs/invoice/executions")
    clock.advance(3 * 3600)  # 06:00:10
    assert listing(changed, 0, 6) == [
        (at(0), "completed"),  # ran under the old schedule
        (at(1), "missed"),
        (at(2), "missed"),
        (at(3), "missed"),  # the old schedule's last slot: the change was first seen at 03:00:10
        (at(3.5), "missed"),  # the new one's
        (at(4.5), "missed"),
        (at(5.5), "missed"),
    ]
    assert (
        changed.get("/api/v1/jobs/invoice/executions", params={"since": at(0), "until": at(1)}).json["unscheduled"]
        == []
    )  # the 00:00 run is the old schedule's slot, not an unscheduled run
    # The old schedule's slot can still be run by hand under its key; a slot it no longer has cannot.
    assert changed.post(f"/api/v1/jobs/invoice/executions/{at(1)}/run?attempt=0", status=200).json["duplicate"] is False
    changed.post(f"/api/v1/jobs/invoice/executions/{at(4)}/run?attempt=0", status=404)
    assert len(job_targets.EFFECTS) == 2


def test_an_untracked_slot_runs_by_hand_only_when_forced(deploy, clock):
    clock.advance(1800)
    site = deploy()
    site.get("/api/v1/jobs/invoice/executions")
    refused = site.post(f"/api/v1/jobs/invoice/executions/{at(0)}/run?attempt=0", status=422).json
    assert refused["error"] == "ExecutionUnknown" and refused["execution_status"] == "untracked"
    assert "expected from" in refused["detail"] and "force=true" in refused["detail"] and job_targets.EFFECTS == []
    forced = site.post(f"/api/v1/jobs/invoice/executions/{at(0)}/run?attempt=0&force=true", status=200).json
    assert forced["duplicate"] is False and dict(listing(site, 0, 0.5)) == {at(0): "completed"}


# The history itself, without Datastore.

JOB = parse_scheduler_document(yaml.safe_load(textwrap.dedent(SCHEDULES % ("0 * * * *", ""))))[0]


def version(schedule: str, hour: float) -> ScheduleVersion:
    return ScheduleVersion(schedule, "Etc/UTC", T0 + datetime.timedelta(hours=hour))


def test_seeing_the_same_schedule_changes_nothing_and_a_new_one_is_appended():
    now = T0 + datetime.timedelta(hours=5)
    assert seen([], JOB, now) == [ScheduleVersion(JOB.schedule, JOB.time_zone, now)]
    assert seen([version("0 * * * *", 1)], JOB, now) == [version("0 * * * *", 1)]
    assert seen([version("5 * * * *", 1)], JOB, now) == [version("5 * * * *", 1), version("0 * * * *", 5)]


def test_two_processes_recording_one_change_keep_its_first_sighting_and_a_change_back_counts():
    racing = [version("0 * * * *", 0), version("5 * * * *", 2), version("5 * * * *", 2.001)]
    assert seen(racing, dataclasses_replace(JOB, "5 * * * *"), T0) == racing[:2]
    back = seen(racing[:2], JOB, T0 + datetime.timedelta(hours=4))
    assert [v.schedule for v in back] == ["0 * * * *", "5 * * * *", "0 * * * *"]
    job = bind(JOB, back)
    slots = [format_utc(s.schedule_time) for s in slots_between([job], T0, T0 + datetime.timedelta(hours=6))]
    assert slots == [at(0), at(1), at(2 + 5 / 60), at(3 + 5 / 60), at(4), at(5)]


def dataclasses_replace(job: SchedulerJob, schedule: str) -> SchedulerJob:
    return job.model_copy(update={"schedule": schedule})


@pytest.mark.parametrize(
    "value, words",
    [
        ("2030-01-01T00:00:00", "needs a UTC offset"),
        ("yesterday", "not an RFC 3339 timestamp"),
        (5, "must be an RFC 3339 timestamp"),
        ("1999-12-31T23:00:00Z", "outside the accepted range"),
        ("2100-01-01T00:00:00Z", "outside the accepted range"),
        ("'2030-01-01T00:00:00\\n'", "not an RFC 3339"),
    ],
)
def test_a_bad_start_at_is_refused_by_name(value, words):
    text = textwrap.dedent(SCHEDULES % ("0 * * * *", f"    start_at: {value}\n"))
    with pytest.raises(ScheduleFileError) as refused:
        parse_scheduler_document(yaml.safe_load(text))
    [problem] = refused.value.problems
    assert problem.field == "start_at" and words in str(problem)


def test_an_upgrade_keeps_expecting_the_slots_the_audit_had_not_judged_yet(deploy, clock, datastore, ndb_client):
    """An app from before schedule histories had audited up to its mark: a slot missed just before
    the upgrade is missed, not untracked."""
    from models.audit import AuditMark

    with ndb_client.context():
        AuditMark(
            id="acme-prod/us-central1/invoice-hourly", checked_until=T0 + datetime.timedelta(minutes=10), pass_id="old"
        ).put()
    clock.advance(3600 + 1200)  # 01:20: 01:00 was never delivered; the upgrade lands now
    site = deploy()
    site.get("/api/v1/scheduler-jobs")
    clock.advance(3600)
    assert listing(site, 1, 1.1) == [(at(1), "missed")]
    missed = [m["schedule_time"] for m in site.get("/tasks/audit", headers=CRON).json["missed"]]
    assert at(1) in missed


def test_a_fleet_seen_for_the_first_time_is_recorded_in_commits_of_at_most_a_batch():
    """A first deploy of a large fleet writes every history at once: in commits of COMMIT_BATCH."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import ndb

    from dedup.memory_store import MemoryStore
    from schedules.history import COMMIT_BATCH, record_schedules

    fleet = [JOB.model_copy(update={"name": f"job-{n}"}) for n in range(COMMIT_BATCH * 2 + 1)]
    with ndb.Client(project="fleet", credentials=AnonymousCredentials()).context():
        store = MemoryStore()
        begin, written = store.transaction, []

        def transaction(*args, **kwargs):
            made = begin(*args, **kwargs)
            put = made.put

            def counted(entity):
                written[-1] += 1
                return put(entity)

            made.put = counted
            written.append(0)
            return made

        store.transaction = transaction
        histories = record_schedules(fleet, T0, store=store)
    assert len(histories) == len(fleet)
    assert written == [COMMIT_BATCH, COMMIT_BATCH, 1]
