"""dispatch/: task ids, the settings that pick a dispatcher, and make run's in-process dispatcher."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions as api_exceptions

from dispatch import Work, task_id
from dispatch.cloud_tasks import CloudTasksDispatcher, DispatchSettingError, already_exists
from dispatch.in_process import InProcessDispatcher

QUEUE = "projects/acme-prod/locations/us-central1/queues/dedup-dispatch"


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
