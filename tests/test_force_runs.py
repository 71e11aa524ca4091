"""Issue 24 §3: a Force run never takes a slot that has not come.

Cloud Scheduler's Force run carries either the next slot's schedule time or its
own execution time (the docs disagree).  Either way it runs once under a key of
its own, recorded as ``force_run`` and listed apart from the slots, and the
slot's own delivery then runs the slot.

The clock starts at 2030-01-01T00:00:20Z; ``tick`` runs every minute.
"""

from __future__ import annotations

import datetime
import textwrap

import pytest
import webtest

from bench import cost
from dedup.keys import CLOCK_SKEW_SECONDS, format_utc, scheduled_run_key
from devtools.rpc_counter import counting_client
from handlers import create_app
from tests import job_targets
from tests.support.deliveries import scheduler_headers

JOBS = """
jobs:
  tick:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
    max_delay_seconds: 30
"""
SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z  # expected from the clock's start (else from the first request)
jobs:
  tick-every-minute:
    target: tick
    schedule: "* * * * *"
    attempt_deadline: 60s
    retry: {retry_count: 3, min_backoff: 5s, max_backoff: 60s}  # a Force run is retried too
"""
T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
SCOPE = "?project=acme-prod&location=us-central1"


def site_for(tmp_path, clock, ndb_client, schedules: str | None) -> webtest.TestApp:
    if schedules is not None:
        (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(schedules))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(textwrap.dedent(JOBS))
    clock.advance(20)  # 00:00:20
    return webtest.TestApp(create_app(jobs_file=str(jobs), clock=clock, ndb_client=ndb_client))


@pytest.fixture
def site(datastore, ndb_client, tmp_path, clock):
    return site_for(tmp_path, clock, ndb_client, SCHEDULES)


@pytest.fixture
def bare_site(datastore, ndb_client, tmp_path, clock):
    """The same job with no scheduler.yaml: the app knows no schedule."""
    return site_for(tmp_path, clock, ndb_client, None)


def at(seconds: float) -> str:
    return format_utc(T0 + datetime.timedelta(seconds=seconds))


def deliver(site, seconds: float, status: int | str = 200):
    headers = scheduler_headers(scheduler_job_name="tick-every-minute", schedule_time=at(seconds))
    return site.post(f"/jobs/tick{SCOPE}", b"", headers=headers, status=status)


def slot_run_id(seconds: float) -> str:
    return scheduled_run_key(
        "tick-every-minute", at(seconds), query_project="acme-prod", query_location="us-central1"
    ).run_id


def listing(site):
    return site.get("/api/v1/jobs/tick/executions", params={"since": at(0), "until": at(180)}, status=200).json


def runs_of(source: str) -> list[dict]:
    return [effect for effect in job_targets.EFFECTS if effect["source"] == source]


def test_a_force_run_with_the_next_slots_time_runs_once_apart_and_the_slot_still_runs(site, clock):
    forced = deliver(site, 60).json  # 00:00:20, carrying 00:01:00: 40 s ahead
    assert forced["status"] == "completed" and forced["duplicate"] is False
    assert forced["run_id"] != slot_run_id(60)
    assert deliver(site, 60).json["duplicate"] is True  # the Force run's own retry
    assert len(job_targets.EFFECTS) == 1 and runs_of("force_run")[0]["run_id"] == forced["run_id"]
    record = site.get(f"/api/v1/runs/{forced['run_id']}", status=200).json
    assert record["source"] == "force_run" and record["schedule_time"] == at(60)
    slot = next(e for e in listing(site)["executions"] if e["schedule_time"] == at(60))
    assert slot["status"] == "upcoming" and "run" not in slot  # the slot was not taken

    clock.advance(40)  # 00:01:00: the slot's own delivery
    delivered = deliver(site, 60).json
    assert delivered["duplicate"] is False and delivered["run_id"] == slot_run_id(60)
    assert [e["source"] for e in job_targets.EFFECTS] == ["force_run", "scheduler"]
    listed = listing(site)
    assert next(e for e in listed["executions"] if e["schedule_time"] == at(60))["status"] == "completed"
    assert [(run["run_id"], run["source"]) for run in listed["unscheduled"]] == [(forced["run_id"], "force_run")]


def test_a_force_run_with_its_own_execution_time_runs_once_under_its_own_key(site, clock):
    """Its time names no slot, so the key of that time is its own: the same in every process,
    whatever schedule history each holds."""
    forced = deliver(site, 20.417).json  # its own time: no slot of a per-minute schedule
    assert forced["duplicate"] is False and forced["run_id"] == slot_run_id(20.417)
    record = site.get(f"/api/v1/runs/{forced['run_id']}", status=200).json
    assert record["source"] == "force_run"
    clock.advance(120)  # retried late: a Force run is asked for now, never skipped as late
    again = deliver(site, 20.417).json
    assert again["duplicate"] is True and again["run_id"] == forced["run_id"]
    assert len(runs_of("force_run")) == 1 and not runs_of("scheduler")
    listed = listing(site)
    assert [run["run_id"] for run in listed["unscheduled"]] == [forced["run_id"]]
    assert all(e["status"] in ("missed", "due", "upcoming") for e in listed["executions"])  # no slot claimed


@pytest.mark.parametrize(
    "offset, force_run",
    [
        (-3600.0, False),  # an hour late: the slot's delivery (skipped: later than max_delay_seconds)
        (-20.0, False),  # the slot that has just come
        (CLOCK_SKEW_SECONDS - 0.001, False),  # early by the skew a slot's delivery may have
        (CLOCK_SKEW_SECONDS + 0.001, True),
        (40.0, True),
        (86400.0, True),  # tomorrow's slot
    ],
)
def test_only_a_time_beyond_the_clock_skew_makes_a_slots_time_a_force_run(site, clock, offset, force_run):
    """Every time here is a slot of the schedule: what decides is how far ahead it is."""
    seconds = 2 * 86400.0  # a slot two days on (the clock is at 00:00:20)
    clock.advance(seconds - 20 - offset)  # now the slot lies ``offset`` ahead
    answer = deliver(site, seconds, status="*")
    assert answer.status_int == 200, answer.text
    assert (answer.json["run_id"] != slot_run_id(seconds)) is force_run
    record = site.get(f"/api/v1/runs/{answer.json['run_id']}", status=200).json
    assert record["source"] == ("force_run" if force_run else "scheduler")
    assert record["status"] == ("skipped" if offset < -30 else "completed")


def test_a_retry_of_a_force_run_within_the_skew_of_its_time_is_its_retry_not_the_slot(site, clock):
    """Scheduler retries keep the schedule time: one arriving just before it finds the Force run unfinished."""
    job_targets.FAILURES["tick"] = ["retryable"]
    first = deliver(site, 60, status=500).json  # 00:00:20, carrying 00:01:00: released
    clock.advance(35)  # 00:00:55: Scheduler's retry, 5 s before the time it carries
    retried = deliver(site, 60).json
    assert retried["run_id"] == first["run_id"] != slot_run_id(60) and retried["attempt"] == 2
    clock.advance(5)  # 00:01:00: the slot's own delivery runs the slot
    slot = deliver(site, 60).json
    assert slot["run_id"] == slot_run_id(60) and slot["duplicate"] is False
    assert [e["source"] for e in job_targets.EFFECTS] == ["force_run", "force_run", "scheduler"]


def test_a_retry_of_a_completed_force_run_within_the_skew_is_its_duplicate_not_the_slot(site, clock):
    """Issue 35 §3 F7: the Force run completed and its answer was lost; Scheduler's retry comes 5 s
    before the time it carries.  It is answered from the Force run, and the slot's own delivery
    still runs the slot."""
    forced = deliver(site, 60).json  # 00:00:20: a Force run carrying 00:01:00, completed
    clock.advance(35)  # 00:00:55
    retried = deliver(site, 60).json
    assert retried["run_id"] == forced["run_id"] and retried["duplicate"] is True
    clock.advance(5)  # 00:01:00: the slot's own delivery
    slot = deliver(site, 60).json
    assert slot["run_id"] == slot_run_id(60) and slot["duplicate"] is False
    assert [e["source"] for e in job_targets.EFFECTS] == ["force_run", "scheduler"]


@pytest.mark.parametrize("arrives", [-5.0, 0.0, 25.0, 200.0])  # seconds from the slot's time
def test_a_force_runs_retry_is_its_own_whenever_it_arrives_and_the_slot_runs_apart(site, clock, arrives):
    """Issue 35 §3 F7: a Force run carrying 00:01:00 is released (500); Scheduler's retry comes
    before the slot within the skew, at it, or after it, and takes the Force run over.  The slot's
    own delivery then runs as its own run (skipped where it is later than max_delay_seconds)."""
    job_targets.FAILURES["tick"] = ["retryable"]
    first = deliver(site, 60, status=500).json  # 00:00:20
    clock.advance(40 + arrives)
    retried = deliver(site, 60).json
    assert retried["run_id"] == first["run_id"] != slot_run_id(60)
    assert retried["status"] == "completed" and retried["attempt"] == 2 and retried["duplicate"] is False
    clock.advance(max(0.0, -arrives))  # the slot's own delivery, at its time or with the retry
    slot = deliver(site, 60).json
    assert slot["run_id"] == slot_run_id(60) and slot["duplicate"] is False
    assert slot["status"] == ("skipped" if arrives > 30 else "completed")  # max_delay_seconds: 30
    record = site.get(f"/api/v1/runs/{first['run_id']}", status=200).json
    assert record["source"] == "force_run" and record["status"] == "completed" and record["attempt"] == 2


def test_every_retry_of_a_force_run_is_one_run_until_scheduler_has_none_left(site, clock):
    """Released at each of its first three attempts (before the slot, at it, after it), the fourth
    completes it; once its Scheduler job's retries are used up, a delivery is the slot's."""
    job_targets.FAILURES["tick"] = ["retryable"] * 3
    runs = [deliver(site, 60, status=500).json["run_id"]]  # 00:00:20
    for step in (35, 5, 10):  # 00:00:55, 00:01:00, 00:01:10
        clock.advance(step)
        runs.append(deliver(site, 60, status="*").json["run_id"])
    assert set(runs) == {runs[0]} and runs[0] != slot_run_id(60)
    record = site.get(f"/api/v1/runs/{runs[0]}", status=200).json
    assert record["status"] == "completed" and record["attempt"] == 4
    clock.advance(5)  # 00:01:15: the slot's delivery
    slot = deliver(site, 60).json
    assert slot["run_id"] == slot_run_id(60) and slot["status"] == "completed"
    assert [e["source"] for e in job_targets.EFFECTS] == ["force_run"] * 4 + ["scheduler"]


def test_a_released_force_run_with_no_retry_left_leaves_the_slot_to_its_delivery(site, clock):
    """Scheduler retries an execution retry_count times: a Force run released at every one of its
    four attempts is not retried again, so the slot's delivery that comes next runs the slot."""
    job_targets.FAILURES["tick"] = ["retryable"] * 4
    forced = deliver(site, 60, status=500).json  # 00:00:20
    for step in (5, 10, 20):  # Scheduler's three retries: 00:00:25, 00:00:35, 00:00:55
        clock.advance(step)
        assert deliver(site, 60, status=500).json["run_id"] == forced["run_id"]
    clock.advance(5)  # 00:01:00
    slot = deliver(site, 60).json
    assert slot["run_id"] == slot_run_id(60) and slot["status"] == "completed"


def test_without_a_schedule_only_a_time_ahead_is_a_force_run(bare_site, clock):
    """The app cannot tell an off-schedule time without scheduler.yaml; it keys it as before."""
    own_time = deliver(bare_site, 20.417).json
    assert own_time["run_id"] == slot_run_id(20.417)
    ahead = deliver(bare_site, 60).json
    assert ahead["run_id"] != slot_run_id(60)
    assert [e["source"] for e in job_targets.EFFECTS] == ["scheduler", "force_run"]


def test_a_force_run_without_a_schedule_time_is_refused_and_not_run(site):
    headers = scheduler_headers(scheduler_job_name="tick-every-minute", schedule_time=None)
    refused = site.post(f"/jobs/tick{SCOPE}", b"", headers=headers, status=400).json
    assert refused["field"] == "X-CloudScheduler-ScheduleTime" and "manual run" in refused["detail"]
    assert job_targets.EFFECTS == []


def test_a_force_run_is_logged_with_its_source_and_why(site, caplog):
    caplog.set_level("INFO")
    deliver(site, 60)
    [line] = [r for r in caplog.records if r.name == "service.runs"]
    assert "Force run of tick-every-minute" in line.getMessage() and "40s ahead" in line.getMessage()
    [request] = [r for r in caplog.records if r.name == "dedup.requests"]
    assert request.source == "force_run"


def test_looking_for_the_force_run_costs_no_round_trip_more(datastore, tmp_path, clock):
    """The Force run's record is read in one lookup with the pause intervals a declared Scheduler
    job's delivery reads anyway: an on-time delivery costs what it did."""
    client, counter = counting_client(datastore.project, datastore.host)
    site = site_for(tmp_path, clock, client, SCHEDULES)
    deliver(site, 0)  # 00:00:20: the first delivery reads the schedule's history too
    clock.advance(40)  # 00:01:00: the slot's delivery, inside any Force run's retry window
    counter.wait_until_idle()
    counter.reset()
    assert deliver(site, 60).json["run_id"] == slot_run_id(60)
    counter.wait_until_idle()
    # The claim's, the pauses' with the Force run's, and after the answer the day summary's note
    # (schedules.summaries: a transaction's lookup and commit).
    assert counter.snapshot() == {"Lookup": 3, "Commit": 3}
    assert counter.entities["reads"] == 3 + cost.SLOT_NOTE.reads
