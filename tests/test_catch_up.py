"""Issue 24 §§1-2: resume with catch-up, dispatched through Cloud Tasks (the local stand-in).

The slots of a pause that never ran are dispatched as tasks named from their run ids,
each run under the slot's own key: a task delivered twice, a resume sent again and a late
Scheduler retry of a caught-up slot are all the same run.

The clock starts at 2030-01-01T00:00Z; ``invoice-hourly`` runs at every full hour.
"""

from __future__ import annotations

import datetime
import json

import pytest
import webtest

from dedup.keys import format_utc
from devtools.cloud_tasks_fake import to_webtest
from dispatch import Dispatched, Work
from handlers import create_app
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.schedule_sites import T0, at, schedule_site

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
def make_site(cloud_tasks, ndb_client, tmp_path, clock, monkeypatch, google):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)

    def build(extra: str = "") -> webtest.TestApp:
        return schedule_site(tmp_path, JOBS, SCHEDULES % extra, clock, ndb_client)

    return build


def paused_from_half_past_midnight_to(site, clock, hours: float) -> None:
    clock.advance(1800)
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {"note": "incident"})
    clock.advance(hours * 3600 - 1800)


def resume(site, mode: str | None, status: int = 200):
    body = {} if mode is None else {"catch_up": mode}
    return site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", body, status=status)


def statuses(site, since: float, until: float) -> dict[str, str]:
    page = site.get("/api/v1/jobs/invoice/executions", params={"since": at(since), "until": at(until)}).json
    return {e["schedule_time"]: e["status"] for e in page["executions"]}


def test_catch_up_all_runs_each_paused_slot_once_however_often_it_is_delivered(make_site, clock, cloud_tasks):
    site = make_site()
    paused_from_half_past_midnight_to(site, clock, 5.5)  # 05:30: 01:00 to 05:00 never delivered
    answer = resume(site, "all").json
    assert [c["schedule_time"] for c in answer["caught_up"]] == [at(h) for h in range(1, 6)]
    assert not any(c["already_dispatched"] for c in answer["caught_up"])
    assert [t.task_id for t in cloud_tasks.tasks] == [c["task_id"] for c in answer["caught_up"]]
    assert all(t.relative_uri == "/tasks/run-slot" and t.queue == "dedup-dispatch" for t in cloud_tasks.tasks)
    assert json.loads(cloud_tasks.tasks[0].body)["requested_by"] == "local"  # who asked, carried by the task
    assert job_targets.EFFECTS == []  # dispatched, not run inside the request

    cloud_tasks.deliver(to_webtest(site), times=2)  # Cloud Tasks delivers each twice
    assert sorted(e["schedule_time"] for e in job_targets.EFFECTS) == [
        T0 + datetime.timedelta(hours=h) for h in range(1, 6)
    ]
    assert all(answers == [200, 200] for answers in (t.answers for t in cloud_tasks.tasks))
    assert statuses(site, 0, 6) == {at(0): "missed", **{at(h): "completed" for h in range(1, 6)}}

    late = site.post(
        "/jobs/invoice?project=acme-prod&location=us-central1",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(3)),
        status=200,
    ).json
    assert late["duplicate"] is True and len(job_targets.EFFECTS) == 5  # Scheduler's own retry: the same run

    again = resume(site, "all").json  # the resume sent again (a lost answer)
    assert again["changed"] is False and again["caught_up"] == []  # every paused slot has run
    record = site.get(f"/api/v1/runs/{answer['caught_up'][0]['run_id']}").json
    assert record["requested_by"] == "local" and record["source"] == "scheduler"


def test_a_resume_sent_again_before_the_tasks_ran_is_refused_by_the_queue(make_site, clock, cloud_tasks):
    site = make_site()
    paused_from_half_past_midnight_to(site, clock, 3.5)
    first = resume(site, "all").json
    again = resume(site, "all").json
    assert [c["already_dispatched"] for c in again["caught_up"]] == [True, True, True]
    assert len(cloud_tasks.tasks) == 3 and len(cloud_tasks.refused) == 3
    assert [c["task_id"] for c in again["caught_up"]] == [c["task_id"] for c in first["caught_up"]]


@pytest.mark.parametrize("mode, expected", [("latest", [5]), ("none", []), (None, [])])
def test_catch_up_latest_takes_the_newest_slot_and_none_takes_nothing(make_site, clock, cloud_tasks, mode, expected):
    site = make_site()
    paused_from_half_past_midnight_to(site, clock, 5.5)
    answer = resume(site, mode).json
    assert [c["schedule_time"] for c in answer["caught_up"]] == [at(h) for h in expected]
    assert len(cloud_tasks.tasks) == len(expected)
    cloud_tasks.deliver(to_webtest(site))
    listed = statuses(site, 1, 5.5)
    assert listed == {at(h): "completed" if h in expected else "paused" for h in range(1, 6)}


def test_the_catchup_window_bounds_how_far_back_it_reaches(make_site, clock, cloud_tasks):
    site = make_site("    catchup_window: 2h\n")
    paused_from_half_past_midnight_to(site, clock, 5.5)
    answer = resume(site, "all").json
    assert [c["schedule_time"] for c in answer["caught_up"]] == [at(4), at(5)]  # from 03:30 on


def test_a_queue_that_fails_is_502_and_the_same_resume_dispatches_the_rest(make_site, clock, cloud_tasks):
    site = make_site()
    paused_from_half_past_midnight_to(site, clock, 2.5)
    cloud_tasks.fail_next = [503]
    failed = resume(site, "all", status=502).json
    assert failed["error"] == "DispatchFailed" and failed["retryable"] is True and failed["paused"] is False
    answer = resume(site, "all").json
    assert [c["schedule_time"] for c in answer["caught_up"]] == [at(1), at(2)] and len(cloud_tasks.tasks) == 2


@pytest.mark.parametrize(
    "body, words",
    [({"catch_up": "some"}, "catch_up must be one of"), ({"catchup": "all"}, "at most"), ([], "at most")],
)
def test_a_bad_catch_up_is_400_and_resumes_nothing(make_site, clock, cloud_tasks, body, words):
    site = make_site()
    paused_from_half_past_midnight_to(site, clock, 2.5)
    refused = site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", body, status=400).json
    assert words in refused["detail"]
    assert site.get("/api/v1/scheduler-jobs").json["scheduler_jobs"][0]["paused"] is True and not cloud_tasks.tasks


def test_a_dispatched_slot_run_with_a_bad_body_settles_as_400(make_site, cloud_tasks):
    site = make_site()
    queue = {"X-AppEngine-QueueName": "dedup-dispatch"}
    refused = site.post_json("/tasks/run-slot", {"job_id": "invoice"}, headers=queue, status=400).json
    assert refused["error"] == "InvalidParameterException"
    not_a_slot = {
        "job_id": "invoice",
        "schedule_time": "2030-01-01T00:30:00Z",
        "scheduler_job": "invoice-hourly",
        "project": "acme-prod",
        "location": "us-central1",
        "attempt": 0,
        "requested_by": "local",
    }
    settled = site.post_json("/tasks/run-slot", not_a_slot, headers=queue, status=200).json  # a retry cannot cure it
    assert settled["settled"] is True and settled["status"] == 404 and job_targets.EFFECTS == []
    # Without the queue's marker, a task that names who asked is refused before its body is read.
    for path in ("/tasks/run-slot", "/tasks/manual-run"):
        refused = site.post_json(path, not_a_slot, status=403).json
        assert refused["error"] == "Forbidden" and "only the task queue" in refused["detail"]


# Issue 35 §3 F1: a pause longer than one listing's cap (1,000 slots, oldest first).
MINUTELY = (
    (SCHEDULES % "    max_catchup_runs: 1000\n")
    .replace('"0 * * * *"', '"* * * * *"')
    .replace("invoice-hourly", "invoice-minutely")
)
LONG_PAUSE_MINUTES = 1020  # 00:01 to 17:00: twenty slots more than a listing's cap


class KeptQueue:
    """A queue that keeps its tasks until the test delivers them and refuses a task id it has, as
    Cloud Tasks does (the stand-in's REST round trips would cost a minute for a thousand tasks)."""

    def __init__(self) -> None:
        self.tasks: dict[str, Work] = {}

    def dispatch(self, work: Work) -> Dispatched:
        if work.task_id in self.tasks:
            return Dispatched(work.task_id, already=True)
        self.tasks[work.task_id] = work
        return Dispatched(work.task_id)


def minute(n: int) -> str:
    return at(n / 60)


@pytest.mark.parametrize("mode", ["all", "latest", "none"])
def test_a_pause_longer_than_the_listing_cap_is_caught_up_to_its_newest_slot(
    ndb_client, tmp_path, clock, monkeypatch, google, mode
):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    (tmp_path / "scheduler.yaml").write_text(MINUTELY)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    queue = KeptQueue()
    app = create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client, dispatcher=queue)
    site = webtest.TestApp(app)
    clock.advance(30)
    site.post_json("/api/v1/scheduler-jobs/invoice-minutely/pause", {"note": "incident"})
    clock.advance(LONG_PAUSE_MINUTES * 60)  # 17:00:30
    path = "/api/v1/scheduler-jobs/invoice-minutely/resume"
    full = {"all": list(range(1, LONG_PAUSE_MINUTES + 1)), "latest": [LONG_PAUSE_MINUTES], "none": []}[mode]
    expected = full[-1000:]  # a catch-up runs at most max_catchup_runs (here 1,000), the newest

    answer = site.post_json(path, {"catch_up": mode}).json
    assert [c["schedule_time"] for c in answer["caught_up"]] == [minute(n) for n in expected]
    assert len(queue.tasks) == len(expected)
    if mode == "all":  # the twenty the cap left are said, and stay paused
        assert answer["left_by_cap"] == {
            "count": 20,
            "first": minute(1),
            "last": minute(20),
            "slots": [minute(n) for n in range(1, 21)],
            "reason": "catch-up cap: max_catchup_runs is 1000, the newest ran",
        }
    else:
        assert "left_by_cap" not in answer

    # The same resume sent before the tasks ran: the queue refuses every one, nothing new.
    again = site.post_json(path, {"catch_up": mode}).json
    assert [c["schedule_time"] for c in again["caught_up"]] == [minute(n) for n in expected]
    assert all(c["already_dispatched"] for c in again["caught_up"]) and len(queue.tasks) == len(expected)

    # The newest twenty (the ones the cap left behind) run, each once, and are listed so.
    for work in queue.tasks.values():
        if work.body["schedule_time"] >= minute(LONG_PAUSE_MINUTES - 19):
            site.post_json(work.relative_uri, work.body, headers={"X-AppEngine-QueueName": "dedup-dispatch"})
    ran = sorted(format_utc(e["schedule_time"]) for e in job_targets.EFFECTS)
    assert ran == [minute(n) for n in expected if n > LONG_PAUSE_MINUTES - 20]
    page = site.get(
        "/api/v1/jobs/invoice/executions",
        params={"since": minute(LONG_PAUSE_MINUTES - 19), "until": minute(LONG_PAUSE_MINUTES + 1)},
    ).json
    assert {e["schedule_time"]: e["status"] for e in page["executions"]} == {
        minute(n): "completed" if n in expected else "paused"
        for n in range(LONG_PAUSE_MINUTES - 19, LONG_PAUSE_MINUTES + 1)
    }

    # Sent again once they ran: only what is still paused, and "latest" takes no older slot in
    # the place of the newest, which has run.  For "all", the cap still holds: the twenty that
    # ran count against it as the catch-up's own runs, so the twenty it left stay left, and no
    # resume sent again adds a run past the newest 1,000.
    last = site.post_json(path, {"catch_up": mode}).json
    assert [c["schedule_time"] for c in last["caught_up"]] == [
        minute(n) for n in expected if n <= LONG_PAUSE_MINUTES - 20
    ]
    assert all(c["already_dispatched"] for c in last["caught_up"]) and len(queue.tasks) == len(expected)
    if mode == "all":
        assert last["left_by_cap"]["count"] == 20 and last["left_by_cap"]["last"] == minute(20)


def test_a_catch_up_runs_at_most_max_catchup_runs_the_newest_spread_by_the_jobs_name(make_site, clock, cloud_tasks):
    """Issue 41 §3: a catch-up cannot flood. Five slots never ran; the job's cap is 2: the newest
    two are dispatched, the rest stay paused and the answer says which; the tasks wait the job's
    own share of a minute, the same on every catch-up of the job."""
    from service.slots import CATCH_UP_SPREAD_SECONDS

    site = make_site("    max_catchup_runs: 2\n")
    paused_from_half_past_midnight_to(site, clock, 5.5)  # 01:00 to 05:00 never ran
    answer = resume(site, "all").json
    assert [c["schedule_time"] for c in answer["caught_up"]] == [at(4), at(5)]
    assert answer["left_by_cap"] == {
        "count": 3,
        "first": at(1),
        "last": at(3),
        "slots": [at(1), at(2), at(3)],
        "reason": "catch-up cap: max_catchup_runs is 2, the newest ran",
    }
    assert len(cloud_tasks.tasks) == 2
    waits = {
        datetime.datetime.fromisoformat(t.schedule_time) - datetime.datetime.now(datetime.UTC)
        for t in cloud_tasks.tasks
    }
    assert all(datetime.timedelta(0) < wait <= datetime.timedelta(seconds=CATCH_UP_SPREAD_SECONDS) for wait in waits)
    cloud_tasks.deliver(to_webtest(site))
    assert statuses(site, 0, 6) == {
        at(0): "missed",
        **{at(h): "paused" for h in (1, 2, 3)},
        **{at(h): "completed" for h in (4, 5)},
    }
    # The resume sent again (its answer lost) after the two ran: the cap is the pause's, not the
    # request's, so the older three are not run in their place.
    again = resume(site, "all").json
    assert again["caught_up"] == [] and again["left_by_cap"]["count"] == 3 and len(cloud_tasks.tasks) == 2


def test_the_spread_is_a_jobs_own_and_differs_from_job_to_job():
    from schedules.config import parse_scheduler_document
    from service.slots import CATCH_UP_SPREAD_SECONDS, spread_seconds

    jobs = parse_scheduler_document(
        {
            "defaults": {"project": "acme-prod", "location": "us-central1"},
            "jobs": {f"job-{n}": {"target": "invoice", "schedule": "* * * * *"} for n in range(50)},
        }
    )
    spreads = [spread_seconds(job) for job in jobs]
    assert spreads == [spread_seconds(job) for job in jobs]  # deterministic
    assert len(set(spreads)) == 50 and all(0 <= s < CATCH_UP_SPREAD_SECONDS for s in spreads)
