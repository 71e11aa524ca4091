"""Issue 24 §7: the schedule code at fleet size.

Start-up validates scheduler.yaml with the ops CLI's validation, but the period check (a
year of executions per distinct schedule, seconds of CPU per thousand) is the ops CLI's
alone: the app checks the first two gaps.  The audit batches its reads and judges jobs on
a few threads.  The figures are `make bench`'s (bench/fleet.py).
"""

from __future__ import annotations

import datetime
import textwrap

import pytest
import yaml

from bench.fleet import scheduler_document
from jobs.config import parse_jobs
from schedules.config import dedup_problems, parse_scheduler_document

WEEKDAYS = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s}
jobs:
  monthly-days: {target: report, schedule: "0 9 1-28 * *"}
"""
# Kept two days: enough between the 1st and the 28th, not for the month's end (4 days in January).
JOBS = {"jobs": {"report": {"kind": "python", "target": "tests.job_targets:record", "retention_seconds": 172800}}}


def test_the_ops_cli_finds_a_gap_the_start_up_check_leaves_to_it():
    jobs = parse_scheduler_document(yaml.safe_load(textwrap.dedent(WEEKDAYS)))
    app_jobs = parse_jobs(yaml.safe_dump(JOBS))
    [problem] = dedup_problems(jobs, app_jobs)
    assert problem.field == "schedule" and "345600s apart" in str(problem)
    assert dedup_problems(jobs, app_jobs, exhaustive=False) == []  # the app starts; the deploy refused it


@pytest.mark.slow  # 200 Scheduler jobs through the audit: make test runs it, make check does not
def test_a_fleet_of_distinct_schedules_is_audited_in_one_pass_each_slot_once(datastore, clock, tmp_path, ndb_client):
    """Every job of the fleet is judged in one pass, each slot once, across the audit's threads."""
    import webtest

    from bench.fleet import fleet_files
    from handlers import create_app

    document = scheduler_document(200)
    assert len({job["schedule"] for job in document["jobs"].values()}) == 200
    clock.advance(12 * 3600)  # 12:00: the day's slot of each job (00:00 to 03:19) passed, none delivered
    site = webtest.TestApp(create_app(jobs_file=fleet_files(200, str(tmp_path)), clock=clock, ndb_client=ndb_client))
    declared = [job["scheduler_job"] for job in site.get("/api/v1/scheduler-jobs").json["scheduler_jobs"]]
    answer = site.get("/tasks/audit", headers={"X-Appengine-Cron": "true"}).json
    missed = [(m["scheduler_job"], m["schedule_time"]) for m in answer["missed"]]
    assert len(missed) == len(set(missed)) == 200 and answer["scheduler_jobs"] == 200
    assert [m["scheduler_job"] for m in answer["missed"]] == declared  # in the file's order, whichever thread
    assert site.get("/tasks/audit", headers={"X-Appengine-Cron": "true"}).json["missed"] == []
    assert datetime.datetime.fromisoformat(missed[0][1].replace("Z", "+00:00")).date() == datetime.date(2030, 1, 1)
