"""dispatch/: task ids, the settings that pick a dispatcher, and make run's in-process dispatcher."""

from __future__ import annotations

import datetime
import os
import threading
import time

import pytest
import requests
import yaml
from google.api_core import exceptions as api_exceptions

from dedup.clock import ManualClock
from dispatch import Work, task_id
from dispatch.cloud_tasks import CloudTasksDispatcher, DispatchSettingError, already_exists
from dispatch.in_process import InProcessDispatcher, RetryParameters
from tests import job_targets
from tests.support.schedule_sites import T0, at, schedule_site

QUEUE = "projects/acme-prod/locations/us-central1/queues/dedup-dispatch"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_task_ids_are_the_same_for_the_same_work_and_fit_cloud_tasks():
    first = task_id("slot-run", "a" * 64, "0")
    assert first == task_id("slot-run", "a" * 64, "0") and first != task_id("slot-run", "a" * 64, "1")
    assert first.startswith("slot-run-") and len(first) <= 500 and first.replace("-", "").isalnum()


@pytest.mark.parametrize(
    "environ, queue",
    [
        ({}, None),
        ({"DEDUP_TASKS_QUEUE": QUEUE}, QUEUE),
        (
            {
                "DEDUP_TASKS_QUEUE": "dedup-dispatch",
                "GOOGLE_CLOUD_PROJECT": "acme-prod",
                "DEDUP_TASKS_LOCATION": "us-central1",
            },
            QUEUE,
        ),
        ({"DEDUP_TASKS_QUEUE": "dedup-dispatch"}, None),  # off App Engine, no project: make devserver
    ],
)
def test_the_settings_name_the_queue(environ, queue):
    dispatcher = CloudTasksDispatcher.from_environ(environ)
    assert (dispatcher.queue if dispatcher else None) == queue


@pytest.mark.parametrize(
    "environ, words",
    [
        ({"DEDUP_TASKS_QUEUE": "projects/acme-prod/queues/q"}, "must be projects/PROJECT"),
        ({"DEDUP_TASKS_QUEUE": "a queue"}, "must be projects/PROJECT"),
        (
            {"DEDUP_TASKS_QUEUE": "dedup-dispatch", "GAE_ENV": "standard", "GOOGLE_CLOUD_PROJECT": "acme-prod"},
            "DEDUP_TASKS_LOCATION",
        ),
        ({"DEDUP_TASKS_QUEUE": QUEUE, "DEDUP_TASKS_API_BASE": "ftp://x"}, "http(s) base URL"),
        ({"DEDUP_TASKS_QUEUE": QUEUE, "DEDUP_TASKS_API_BASE": "http://x/path"}, "http(s) base URL"),
    ],
)
def test_bad_settings_stop_the_app_naming_the_setting(environ, words):
    with pytest.raises(DispatchSettingError, match="DEDUP_TASKS") as refused:
        CloudTasksDispatcher.from_environ(environ)
    assert words in str(refused.value)


def conflict(status: str) -> api_exceptions.Conflict:
    response = requests.Response()
    response.status_code = 409
    response._content = f'{{"error": {{"code": 409, "status": "{status}", "message": "m"}}}}'.encode()
    response.request = requests.Request("POST", "http://x").prepare()
    return api_exceptions.from_http_response(response)  # type: ignore[return-value]


def test_only_already_exists_means_dispatched_before():
    assert already_exists(conflict("ALREADY_EXISTS")) and already_exists(api_exceptions.AlreadyExists("x"))
    assert not already_exists(conflict("ABORTED")) and not already_exists(api_exceptions.ServiceUnavailable("x"))


def test_the_in_process_dispatcher_does_each_task_once_through_the_app(make_client):
    from tests.support.deliveries import JOBS

    client = make_client(JOBS)
    dispatcher = InProcessDispatcher()
    dispatcher.app = client.app
    work = Work("t-1", "/tasks/run-slot", {"job_id": "invoice"})
    assert dispatcher.dispatch(work).already is False
    assert dispatcher.dispatch(work).already is True  # a task id seen before, as a queue refuses it
    assert dispatcher.wait(30) == [400]  # the app's own answer to that body, through the whole stack


def test_a_retry_due_after_the_process_began_to_exit_settles_with_the_last_answer():
    """The queue's pool shuts down at interpreter exit; a retry due then is not sent, and its task
    settles with the answer it had, instead of an exception in the retry's thread."""
    from flask import Flask

    released = Flask("released")
    released.post("/tasks/x")(lambda: ("", 500))
    dispatcher = InProcessDispatcher(workers=1, retry=RetryParameters(task_retry_limit=3))

    def exiting(_seconds: float) -> None:
        dispatcher._pool.shutdown(wait=False)

    dispatcher.sleep = exiting
    dispatcher.app = released
    dispatcher.dispatch(Work("t-exit", "/tasks/x", {}))
    assert dispatcher.wait(10) == [500]


# Issue 35 §3 F6: make run's dispatcher retries what a task endpoint leaves to the queue.
FORBIDDING_JOBS = """
jobs:
  slow:
    kind: python
    target: tests.job_targets:gated
    lease_seconds: 60
    overlap: forbid
"""
HOURLY_SLOW = """
defaults: {project: acme-prod, location: us-central1, start_at: 2030-01-01T00:00:00Z, attempt_deadline: 60s}
jobs:
  slow-hourly: {target: slow, schedule: "0 * * * *", body: catch-up-gate}
"""


def test_a_catch_up_of_an_overlap_forbid_job_in_process_runs_every_slot_once(
    ndb_client, tmp_path, clock, google, monkeypatch
):
    """Seven paused slots of a job that forbids overlap, dispatched at once on make run's threads:
    while the first runs, the others are answered 409 and retried as queue.yaml's retry_parameters
    say (on a clock and a sleep of the test's, so nothing waits for real)."""
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    monkeypatch.delenv("DEDUP_TASKS_QUEUE", raising=False)  # make run: no queue, the in-process dispatcher
    site = schedule_site(tmp_path, FORBIDDING_JOBS, HOURLY_SLOW, clock, ndb_client)
    dispatcher = site.app.extensions["dedup"].dispatcher
    assert isinstance(dispatcher, InProcessDispatcher)
    queue_time = ManualClock()  # the queue's own time: the app's clock (and every lease) stands still
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        queue_time.advance(seconds)
        time.sleep(0.01)

    dispatcher.clock, dispatcher.sleep = queue_time, sleep
    clock.advance(1800)
    site.post_json("/api/v1/scheduler-jobs/slow-hourly/pause", {"note": "incident"})
    clock.advance(7 * 3600)  # 07:30: 01:00 to 07:00 never delivered
    answer = site.post_json("/api/v1/scheduler-jobs/slow-hourly/resume", {"catch_up": "all"}).json
    assert [c["schedule_time"] for c in answer["caught_up"]] == [at(h) for h in range(1, 8)]

    assert job_targets.STARTED.setdefault("catch-up-gate", threading.Event()).wait(10)  # one holds the job
    deadline = time.monotonic() + 10
    while len(waits) < 6 and time.monotonic() < deadline:  # the six others answered 409, waiting to retry
        time.sleep(0.01)
    job_targets.GATES.setdefault("catch-up-gate", threading.Event()).set()
    assert dispatcher.wait(30) == [200] * 7

    ran = sorted(effect["schedule_time"] for effect in job_targets.EFFECTS)
    assert ran == [T0 + datetime.timedelta(hours=h) for h in range(1, 8)]  # every slot, each once
    page = site.get("/api/v1/jobs/slow/executions", params={"since": at(1), "until": at(7.5)}).json
    assert [(e["status"], e["run"]["attempt"]) for e in page["executions"]] == [("completed", 1)] * 7
    with open(os.path.join(ROOT, "queue.yaml"), encoding="utf-8") as handle:
        [queue] = yaml.safe_load(handle)["queue"]
    assert len(waits) >= 6 and min(waits) == queue["retry_parameters"]["min_backoff_seconds"]


def test_retries_wait_and_stop_as_cloud_tasks_documents(tmp_path):
    # Cloud Tasks' own example: min_backoff 10s, max_backoff 300s, max_doublings 3.
    example = RetryParameters(min_backoff=10, max_backoff=300, max_doublings=3)
    assert [example.backoff(n) for n in range(1, 9)] == [10, 20, 40, 80, 160, 240, 300, 300]
    # It stops only once both limits are reached; a limit left out is reached at once.
    both = RetryParameters(task_retry_limit=7, task_age_limit=2 * 86400)
    day, days = datetime.timedelta(days=1), datetime.timedelta(days=2)
    assert not both.gives_up(7, day) and not both.gives_up(3, days) and both.gives_up(7, days)
    assert RetryParameters(task_retry_limit=2).gives_up(2, datetime.timedelta(0))
    assert not RetryParameters().gives_up(10**6, datetime.timedelta(days=365))  # neither: for ever
    # Read from a queue.yaml, App Engine's defaults for what it leaves out.
    queue_file = tmp_path / "queue.yaml"
    queue_file.write_text(
        "queue:\n- name: other\n- name: dedup-dispatch\n  retry_parameters:\n"
        "    task_age_limit: 2h\n    min_backoff_seconds: 5\n    max_doublings: 3\n"
    )
    assert RetryParameters.of_queue(str(queue_file)) == RetryParameters(None, 7200, 5, 3600, 3)
    # make run's dispatcher plays queue.yaml's queue, read from the file itself.
    assert InProcessDispatcher(workers=1).retry == RetryParameters.of_queue(os.path.join(ROOT, "queue.yaml"))
