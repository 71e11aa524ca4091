"""A local stand-in for Cloud Tasks (v2 REST): tasks.create with App Engine or HTTP requests, and delivery.

It speaks the API's shapes (``POST /v2/{queue}/tasks`` with ``{"task": {...}}``; a task id
it has seen is 409 ALREADY_EXISTS, as a queue refuses a name within its dedup window) and
delivers each task to the app as App Engine would: a POST of its relative URI and body with
``X-AppEngine-QueueName``, ``-TaskName``, ``-TaskRetryCount`` and ``-TaskExecutionCount``,
again after any answer but 2xx.  ``deliver`` is given the app to call (a webtest app or a
base URL), so tests choose when tasks run.  An HTTP task (``httpRequest``, an external job's
slot run) is sent to its own URL with ``X-CloudTasks-QueueName``, ``-TaskName`` and
``-TaskRetryCount``; the OIDC token it asks for is kept (``oidc``), not minted.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import requests

from devtools.json_server import JsonServer

TASK_PATH = re.compile(r"/v2/(projects/[^/]+/locations/[^/]+/queues/[^/]+)/tasks")


@dataclasses.dataclass
class FakeTask:
    name: str
    relative_uri: str
    body: bytes
    headers: dict[str, str]
    service: str | None
    answers: list[int] = dataclasses.field(default_factory=list)
    url: str | None = None  # an HTTP task's (relative_uri is then "")
    method: str = "POST"
    dispatch_deadline: str | None = None  # an HTTP task's, as the API spells a Duration ("600s")
    oidc: dict[str, str] | None = None  # an HTTP task's oidcToken: serviceAccountEmail, audience
    schedule_time: str | None = None  # when the task may run, as the API spells a Timestamp (None: now)

    @property
    def task_id(self) -> str:
        return self.name.rsplit("/", 1)[1]

    @property
    def queue(self) -> str:
        return self.name.split("/tasks/")[0].rsplit("/", 1)[1]


class CloudTasksFake:
    def __init__(self) -> None:
        self.tasks: list[FakeTask] = []  # every task created, in order
        self.refused: list[str] = []  # task ids created again (ALREADY_EXISTS)
        self.fail_next: list[int] = []  # statuses to answer the next creates with (503, ...)
        self._lock = threading.Lock()
        self.local = JsonServer(lambda method, path, raw, headers: self._create(path.split("?")[0], raw), ("POST",))
        self.url = self.local.url

    def close(self) -> None:
        self.local.close()

    def reset(self) -> None:
        with self._lock:
            self.tasks.clear()
            self.refused.clear()
            self.fail_next.clear()

    def _create(self, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        match = TASK_PATH.fullmatch(path)
        if match is None:
            return 404, _error(404, "NOT_FOUND", f"no such method {path}")
        try:
            task = json.loads(raw)["task"]
            request = task.get("appEngineHttpRequest") or task["httpRequest"]
            name = task["name"]
        except (ValueError, KeyError, TypeError, AttributeError):
            return 400, _error(
                400, "INVALID_ARGUMENT", "a task needs a name and an appEngineHttpRequest or httpRequest"
            )
        http_task = "appEngineHttpRequest" not in task
        if http_task and not str(request.get("url", "")).startswith(("http://", "https://")):
            return 400, _error(400, "INVALID_ARGUMENT", "an httpRequest needs an absolute url")
        if not name.startswith(match[1] + "/tasks/") or not re.fullmatch(r"[A-Za-z0-9_-]{1,500}", name.rsplit("/")[-1]):
            return 400, _error(400, "INVALID_ARGUMENT", f"bad task name {name!r}")
        methods = ("POST", 1, "GET", 2) if http_task else ("POST", 1)
        if request.get("httpMethod") not in methods:
            return 400, _error(400, "INVALID_ARGUMENT", "this stand-in takes POST tasks (and GET HTTP tasks) only")
        with self._lock:
            if self.fail_next:
                status = self.fail_next.pop(0)
                return status, _error(status, "UNAVAILABLE", "the queue is unavailable")
            if any(existing.name == name for existing in self.tasks):
                self.refused.append(name.rsplit("/", 1)[1])
                return 409, _error(
                    409,
                    "ALREADY_EXISTS",
                    "The task cannot be created because a task with this name existed too recently.",
                )
            self.tasks.append(
                FakeTask(
                    name=name,
                    relative_uri="" if http_task else request["relativeUri"],
                    body=base64.b64decode(request.get("body", "")),
                    headers=dict(request.get("headers", {})),
                    service=(request.get("appEngineRouting") or {}).get("service") or None,
                    url=request["url"] if http_task else None,
                    oidc=dict(request["oidcToken"]) if http_task and request.get("oidcToken") else None,
                    method="GET" if request.get("httpMethod") in ("GET", 2) else "POST",
                    dispatch_deadline=task.get("dispatchDeadline"),
                    schedule_time=task.get("scheduleTime"),
                )
            )
        return 200, task

    def deliver(
        self,
        post: Callable[[FakeTask, dict[str, str]], int],
        times: int = 1,
        max_attempts: int = 5,
        at_once: bool = False,
    ) -> None:
        """Deliver every task ``times`` times (a double delivery: 2), each until a 2xx or ``max_attempts``.

        ``at_once``: a task's deliveries are sent together, from threads of their own, as two
        instances of the queue may; a delivery answered 409 (the other holds the run) is
        retried after a backoff, as a queue retries any answer but 2xx."""
        lock = threading.Lock()

        def one(task: FakeTask) -> None:
            for retry in range(max_attempts):
                with lock:
                    executions = len(task.answers)
                if task.url is not None:  # an HTTP task: to its own URL, whatever ``post`` is
                    marks = {"QueueName": task.queue, "TaskName": task.task_id, "TaskRetryCount": str(retry)}
                    headers = {**task.headers, **{f"X-CloudTasks-{name}": value for name, value in marks.items()}}
                    sent = requests.request(task.method, task.url, data=task.body or None, headers=headers, timeout=60)
                    status = sent.status_code
                else:
                    headers = {
                        **task.headers,
                        "X-AppEngine-QueueName": task.queue,
                        "X-AppEngine-TaskName": task.task_id,
                        "X-AppEngine-TaskRetryCount": str(retry),
                        "X-AppEngine-TaskExecutionCount": str(executions),
                    }
                    status = post(task, headers)
                with lock:
                    task.answers.append(status)
                if 200 <= status < 300:
                    return
                if at_once:
                    time.sleep(0.1 * 2**retry)

        for task in list(self.tasks):
            if not at_once:
                for _ in range(times):
                    one(task)
                continue
            threads = [threading.Thread(target=one, args=(task,)) for _ in range(times)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()


def to_webtest(app: Any) -> Callable[[FakeTask, dict[str, str]], int]:
    """Deliver into a webtest app."""
    return lambda task, headers: app.post(task.relative_uri, task.body, headers=headers, expect_errors=True).status_int


def to_url(base_url: str) -> Callable[[FakeTask, dict[str, str]], int]:
    """Deliver to a running app."""
    return lambda task, headers: (
        requests.post(base_url + task.relative_uri, task.body, headers=headers, timeout=60).status_code
    )


def _error(code: int, status: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "status": status, "message": message}}
