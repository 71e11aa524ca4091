"""Issue 24 §5: automatic catch-up, the misfire policy.

When the audit finds missed slots of a job with ``misfire: run_latest`` or ``run_all``, it
dispatches the ones the policy names (within ``catchup_window``), once each, instead of
reporting them; the rest stay missed and alert as before.

The clock starts at 2030-01-01T00:00Z; ``invoice-hourly`` runs at every full hour and is
never delivered here.
"""

from __future__ import annotations

import datetime
import logging
import textwrap

import pytest
import webtest

from dedup.keys import format_utc
from devtools.cloud_tasks_fake import to_webtest
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.schedule_sites import CRON, T0, at, schedule_site

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
%s"""


@pytest.fixture
def make_site(cloud_tasks, ndb_client, tmp_path, clock):
    def build(extra: str) -> webtest.TestApp:
        return schedule_site(tmp_path, JOBS, SCHEDULES % extra, clock, ndb_client)

    return build


def audit(site, caplog) -> tuple[dict, list[logging.LogRecord]]:
    caplog.clear()
    answer = site.get("/tasks/audit", headers=CRON).json
    return answer, [r for r in caplog.records if r.name == "dedup.audit"]


@pytest.mark.parametrize(
    "policy, caught, reported",
    [
        ("misfire: run_all", [0, 1, 2, 3, 4], []),
        ("misfire: run_latest", [4], [0, 1, 2, 3]),
        ("misfire: run_all\n    catchup_window: 2h", [4], [0, 1, 2, 3]),  # from 03:03 on
        ("misfire: none", [], [0, 1, 2, 3, 4]),
        # Issue 41 §3: at most max_catchup_runs, the newest; the older are reported missed.
        ("misfire: run_all\n    max_catchup_runs: 2", [3, 4], [0, 1, 2]),
    ],
)
def test_the_audit_runs_what_the_policy_names_and_reports_the_rest(
    make_site, clock, cloud_tasks, caplog, policy, caught, reported
):
    site = make_site(f"    {policy}\n")
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    clock.advance(5 * 3600 + 180)  # 05:03: 00:00 to 04:00 missed (05:00's window is still open)
    answer, lines = audit(site, caplog)
    assert [s["schedule_time"] for s in answer["caught_up"]] == [at(h) for h in caught]
    assert [s["schedule_time"] for s in answer["missed"]] == [at(h) for h in reported]
    assert sorted(r.schedule_time for r in lines if r.levelname == "ERROR") == [at(h) for h in reported]
    assert sorted(r.schedule_time for r in lines if getattr(r, "outcome", None) == "caught_up") == [
        at(h) for h in caught
    ]
    assert job_targets.EFFECTS == [] and len(cloud_tasks.tasks) == len(caught)  # dispatched, not run here
    cloud_tasks.deliver(to_webtest(site), times=2)
    assert sorted(e["schedule_time"] for e in job_targets.EFFECTS) == [T0 + datetime.timedelta(hours=h) for h in caught]
    again, _ = audit(site, caplog)  # the next pass: nothing twice
    assert again["caught_up"] == [] and again["missed"] == [] and len(cloud_tasks.tasks) == len(caught)


def test_a_slot_the_queue_would_not_take_is_reported_missed(make_site, clock, cloud_tasks, caplog):
    site = make_site("    misfire: run_latest\n")
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    clock.advance(2 * 3600 + 180)
    cloud_tasks.fail_next = [503]
    answer, lines = audit(site, caplog)
    assert answer["caught_up"] == [] and [s["schedule_time"] for s in answer["missed"]] == [at(0), at(1)]
    assert sorted(r.schedule_time for r in lines if r.levelname == "ERROR") == [at(0), at(1)]


def test_a_bad_misfire_policy_is_refused_by_name():
    import yaml

    from schedules.config import ScheduleFileError, parse_scheduler_document

    with pytest.raises(ScheduleFileError) as refused:
        parse_scheduler_document(yaml.safe_load(textwrap.dedent(SCHEDULES % "    misfire: run_some\n")))
    [problem] = refused.value.problems
    assert problem.field == "misfire" and "run_latest" in str(problem)


def test_run_latest_runs_the_newest_missed_slot_once_when_the_audit_is_far_behind(
    cloud_tasks, ndb_client, tmp_path, clock, caplog
):
    """Issue 35 §3 F1: a pass judges at most 1,000 slots, oldest first, and says where it stopped
    (its mark).  ``run_latest`` takes the newest missed slot once the passes reach now, never the
    newest of a pass that stopped short: 20 hours of a per-minute job nobody delivered."""
    every_minute = (SCHEDULES % "    misfire: run_latest\n").replace('"0 * * * *"', '"* * * * *"')
    every_minute = every_minute.replace("invoice-hourly", "invoice-minutely")
    site = schedule_site(tmp_path, JOBS, every_minute, clock, ndb_client)
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    clock.advance(20 * 3600)
    passes = [audit(site, caplog)[0] for _ in range(3)]  # the first stops 1,000 slots in; the second reaches now
    caught = [s["schedule_time"] for answer in passes for s in answer["caught_up"]]
    missed = [s["schedule_time"] for answer in passes for s in answer["missed"]]
    assert len(caught) == 1 and len(cloud_tasks.tasks) == 1 and passes[0]["caught_up"] == []
    assert len(missed) == len(set(missed)) and max(missed) < caught[0]  # each reported once; none newer
    cloud_tasks.deliver(to_webtest(site))
    page = site.get("/api/v1/jobs/invoice/executions", params={"since": at(19.5), "until": at(20)}).json
    listed = [(e["schedule_time"], e["status"]) for e in page["executions"]]
    newest_missed = max(i for i, (_, status) in enumerate(listed) if status != "due")
    assert listed[newest_missed] == (caught[0], "completed")
    assert {status for _, status in listed[:newest_missed]} == {"missed"}


@pytest.mark.parametrize("hours", [78 / 60, 20])  # DBOS #803's 78-minute suspension; and 20 hours, past a pass
def test_a_long_outages_catch_up_is_bounded_and_each_slot_runs_at_most_once(
    cloud_tasks, ndb_client, tmp_path, clock, caplog, hours
):
    """Issue 41 §3's evidence: a per-minute job nobody delivered for ``hours``, misfire: run_all with
    max_catchup_runs: 20.  However many passes it takes to judge the outage, at most 20 runs are
    dispatched, the newest; every task delivered twice runs once; a late Scheduler delivery of a
    caught-up slot is a duplicate; the rest are reported missed, each once."""
    policy = "    misfire: run_all\n    max_catchup_runs: 20\n"
    every_minute = (SCHEDULES % policy).replace('"0 * * * *"', '"* * * * *"')
    every_minute = every_minute.replace("invoice-hourly", "invoice-minutely")
    site = schedule_site(tmp_path, JOBS, every_minute, clock, ndb_client)
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    clock.advance(hours * 3600 + 180)
    passes = [audit(site, caplog)[0] for _ in range(3)]
    caught = [s["schedule_time"] for answer in passes for s in answer["caught_up"]]
    missed = [s["schedule_time"] for answer in passes for s in answer["missed"]]
    assert len(caught) == len(cloud_tasks.tasks) == 20 and max(missed) < min(caught)  # the newest twenty
    assert len(missed) == len(set(missed)) and not set(missed) & set(caught)
    cloud_tasks.deliver(to_webtest(site), times=2)
    ran = [format_utc(effect["schedule_time"]) for effect in job_targets.EFFECTS]
    assert sorted(ran) == sorted(caught)  # each once
    late = site.post(
        "/jobs/invoice?project=acme-prod&location=us-central1",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice-minutely", schedule_time=caught[0]),
        status=200,
    ).json
    assert late["duplicate"] is True and len(job_targets.EFFECTS) == 20


@pytest.mark.parametrize("policy, caught", [("run_all", [0]), ("run_latest", []), ("compact", [0])])
def test_a_pass_stopped_by_a_run_holding_its_lease_still_catches_up_the_slots_before_it(
    make_site, clock, cloud_tasks, caplog, ndb_client, policy, caught
):
    """A pass stops its mark before a run still holding a live lease past its retry window (a long
    lease, a heartbeat) and judges the slots before it once: run_all and compact catch them up
    then, as no later pass judges them again; run_latest has none to run, a newer slot is running."""
    from dedup.claims import RunDescription, RunPolicy
    from dedup.keys import scheduled_run_key
    from dedup.ledger import Ledger

    site = make_site(f"    misfire: {policy}\n")
    site.get("/tasks/audit", headers=CRON)  # the marks
    clock.advance(3600 + 10)  # 01:00:10: 00:00 was never delivered; 01:00's run starts, for hours
    key = scheduled_run_key("invoice-hourly", at(1), query_project="acme-prod", query_location="us-central1")
    description = RunDescription("scheduler", "invoice", "invoice-hourly", key.schedule_time, key.project, key.location)
    with ndb_client.context():
        Ledger(clock).claim_run(key.run_id, description, RunPolicy(4 * 3600, 86_400))
    clock.advance(1800)  # 01:30: 01:00's retry window has closed, its lease is live
    answer, lines = audit(site, caplog)
    assert [s["schedule_time"] for s in answer["caught_up"]][-1:] == [at(n) for n in caught][-1:]
    assert len(cloud_tasks.tasks) == len(caught)
    reported = [r for r in lines if r.levelno >= logging.ERROR]
    assert len(reported) == (0 if caught else 1)
