"""The app's tasks through Cloud Tasks' real transport, on a third-party emulator (issue 40 §2).

gunicorn dispatches over google-cloud-tasks' gRPC transport (the default, DEDUP_TASKS_TRANSPORT
unset) to gcloud-tasks-emulator, with no credentials, and the emulator delivers each task back
through a recording relay: Run now, a bulk run of missed slots, the misfire policy's catch-up,
and a task dispatched twice.  Each slot's downstream call happens once.

Where the emulator is not Cloud Tasks, the tests record it (devtools/tasks_emulator.py):
it accepts a task name it has seen (the app's own stand-in, devtools/cloud_tasks_fake.py,
keeps covering ALREADY_EXISTS: tests/test_dispatch.py), sends the queue's whole name in
``X-AppEngine-QueueName``, and ignores routing.  The app holds either way: the ledger's key,
not the task's name, makes a run once.
"""

from __future__ import annotations

import collections
import datetime
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from bs4 import BeautifulSoup

from devtools.gunicorn import GunicornServer
from devtools.tasks_emulator import TasksEmulator, venv_ready
from dispatch import Work, task_id
from dispatch.cloud_tasks import CloudTasksDispatcher
from tests.support.deliveries import a_day_ago
from tests.support.downstream import Downstream
from tests.support.proxies import FaultProxy

pytestmark = pytest.mark.live

PROJECT, LOCATION = "acme-prod", "us-central1"
QUEUE = f"projects/{PROJECT}/locations/{LOCATION}/queues/dedup-dispatch"  # queue.yaml's queue
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}
CRON = {"X-Appengine-Cron": "true"}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def downstream() -> Iterator[Downstream]:
    with Downstream() as server:
        yield server


@pytest.fixture(scope="module")
def site(emulator, downstream, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """gunicorn dispatching to the tasks emulator, which delivers through ``relay`` back to it."""
    assert venv_ready(), "the tasks emulator's virtualenv is missing: make tasks-emulator (make test builds it)"
    folder = tmp_path_factory.mktemp("tasks-emulator")
    (folder / "jobs.yaml").write_text(
        f"""
jobs:
  sync:
    kind: http
    url: {downstream.url}/sync
    lease_seconds: 60
  report:
    kind: http
    url: {downstream.url}/report
    lease_seconds: 60
  ping:
    kind: http
    url: {downstream.url}/ping
    lease_seconds: 60
"""
    )
    (folder / "scheduler.yaml").write_text(
        f"""
defaults: {{project: {PROJECT}, location: {LOCATION}, attempt_deadline: 60s, start_at: {a_day_ago()}}}
jobs:
  sync-6h: {{target: sync, schedule: "0 */6 * * *", misfire: run_all}}
  report-6h: {{target: report, schedule: "30 */6 * * *"}}
"""
    )
    tasks = TasksEmulator(target_port=0, project=PROJECT, location=LOCATION, log_path=folder / "emulator.log")
    env = {
        "DEDUP_TASKS_QUEUE": QUEUE,
        "DEDUP_TASKS_API_BASE": tasks.url,
        "DEDUP_TASKS_TRANSPORT": None,  # unset: gRPC, the default
        "DEDUP_FINISHED_CACHE_ENTRIES": "0",
        "GAE_SERVICE": "dedup",  # the routing the emulator ignores
    }
    with GunicornServer(
        emulator, str(folder / "jobs.yaml"), workers=1, threads=8, extra_env=env, log_path=str(folder / "app.log")
    ) as app:
        relay = FaultProxy(app.url)
        tasks.target_port = int(relay.url.rsplit(":", 1)[1])
        try:
            with tasks:
                yield {"app": app, "relay": relay, "tasks": tasks}
        finally:
            relay.close()


@pytest.fixture
def fresh(site, downstream, datastore) -> dict[str, Any]:
    """Each test starts with an empty ledger, no downstream calls and no deliveries recorded."""
    downstream.requests.clear()
    site["relay"].received.clear()
    site["relay"].answered.clear()
    return site


def form_of(html: str, form_id: str = "confirm") -> tuple[str, dict[str, str]]:
    """A page's form: its action and the values a browser would send."""
    form = BeautifulSoup(html, "html.parser").find("form", id=form_id)
    assert form is not None, html[:2000]
    values = {
        field["name"]: field.get("value", "") for field in form.find_all(["input", "textarea"]) if field.get("name")
    }
    return form["action"], values


def wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def calls_to(downstream: Downstream, path: str) -> list[Any]:
    return [r for r in downstream.requests if r.path == path]


def test_run_now_goes_through_the_emulator_over_grpc_in_the_callers_trace(fresh, downstream):
    app, relay = fresh["app"], fresh["relay"]
    home = requests.get(f"{app.url}/admin/", timeout=30)
    link = BeautifulSoup(home.text, "html.parser").select_one(".job-card[data-job='ping'] a.run-now")
    assert link is not None, "the home page offers Run now for ping"
    confirm = requests.get(app.url + link["href"], timeout=30)
    action, values = form_of(confirm.text)
    traceparent = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
    sent = [
        requests.post(
            app.url + action,
            data=values,
            headers={**SAME_ORIGIN, "traceparent": traceparent},
            allow_redirects=False,
            timeout=30,
        )
        for _ in range(2)  # a double click: the same task name twice
    ]
    assert [answer.status_code for answer in sent] == [303, 303], sent[0].text[:500]
    assert len({answer.headers["Location"] for answer in sent}) == 1
    wait_for(lambda: len(calls_to(downstream, "/ping")) >= 1, "the task's run")
    wait_for(lambda: len([p for p, _ in relay.answered if p == "/tasks/manual-run"]) >= 2, "both deliveries")
    # The emulator accepted the name twice (Cloud Tasks refuses the second: ALREADY_EXISTS) and
    # delivered both; the ledger made them one run.
    deliveries = [
        {name.lower(): value for name, value in headers.items()}
        for path, headers in relay.received
        if path == "/tasks/manual-run"
    ]
    assert len(deliveries) >= 2 and len(calls_to(downstream, "/ping")) == 1
    # Its marker names the whole queue (App Engine sends the id) and the routing was ignored: it came here.
    assert {headers["x-appengine-queuename"] for headers in deliveries} == {QUEUE}
    # One trace: the click, the task, the delivery and the downstream call.
    assert deliveries[0]["traceparent"].split("-")[1] == TRACE_ID
    [call] = calls_to(downstream, "/ping")
    sent_headers = {name.lower(): value for name, value in call.headers.items()}
    assert sent_headers["traceparent"].split("-")[1] == TRACE_ID
    assert sent_headers["x-cloud-trace-context"].startswith(f"{TRACE_ID}/")
    page = requests.get(app.url + sent[0].headers["Location"], timeout=30)
    assert re.search(r'id="outcome"[^>]*>\s*completed', page.text), page.text[:3000]


def test_a_task_dispatched_twice_runs_its_slot_once(fresh, downstream):
    """The same Work twice through the dispatcher, as after a lost answer: the emulator takes both."""
    app, relay = fresh["app"], fresh["relay"]
    listing = requests.get(f"{app.url}/api/v1/jobs/report/executions", timeout=30).json()
    slot = next(e for e in listing["executions"] if e["status"] == "missed")
    dispatcher = CloudTasksDispatcher(QUEUE, api_base=fresh["tasks"].url)  # gRPC, no credentials
    work = Work(
        task_id("slot-run", slot["run_id"], "0"),
        "/tasks/run-slot",
        {
            "job_id": "report",
            "scheduler_job": slot["scheduler_job"],
            "project": PROJECT,
            "location": LOCATION,
            "schedule_time": slot["schedule_time"],
            "attempt": 0,
            "requested_by": "tests",
        },
    )
    first, second = dispatcher.dispatch(work), dispatcher.dispatch(work)
    assert (first.already, second.already) == (False, False)  # Cloud Tasks: (False, True)
    wait_for(lambda: len([p for p, _ in relay.answered if p == "/tasks/run-slot"]) >= 2, "both deliveries")
    assert [r.headers["Idempotency-Key"] for r in calls_to(downstream, "/report")] == [slot["run_id"]]


def test_the_missed_slots_of_a_range_run_in_bulk_each_once(fresh, downstream):
    app = fresh["app"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    day_behind = {"since": a_day_ago(), "until": now}
    history = requests.get(f"{app.url}/admin/jobs/report/history", params=day_behind, timeout=30)
    offer = BeautifulSoup(history.text, "html.parser").find(id="bulk-run")
    assert offer is not None, history.text[:3000]
    action, values = form_of(requests.get(app.url + offer["href"], timeout=30).text)
    answer = requests.post(app.url + action, data=values, headers=SAME_ORIGIN, allow_redirects=False, timeout=60)
    assert answer.status_code == 303, answer.text[:500]
    queued = int(re.search(r"bulk=(\d+)-", answer.headers["Location"]).group(1))
    assert queued >= 3  # every six hours over the day behind
    wait_for(lambda: len(calls_to(downstream, "/report")) >= queued, "the bulk runs")
    time.sleep(1)  # a second delivery of any of them would land now
    keys = [r.headers["Idempotency-Key"] for r in calls_to(downstream, "/report")]
    assert len(keys) == len(set(keys)) == queued


def test_the_misfire_policy_catches_up_through_the_emulator(fresh, downstream):
    app = fresh["app"]
    audit = requests.get(f"{app.url}/tasks/audit", headers=CRON, timeout=60)
    assert audit.status_code == 200, audit.text[:500]
    caught = [slot["schedule_time"] for slot in audit.json()["caught_up"]]
    assert len(caught) >= 3
    wait_for(lambda: len(calls_to(downstream, "/sync")) >= len(caught), "the catch-up runs")
    time.sleep(1)
    schedule_times = collections.Counter(r.json()["schedule_time"] for r in calls_to(downstream, "/sync"))
    assert sorted(schedule_times) == sorted(caught) and set(schedule_times.values()) == {1}
    again = requests.get(f"{app.url}/tasks/audit", headers=CRON, timeout=60).json()
    assert again["caught_up"] == []  # the next pass: nothing twice
