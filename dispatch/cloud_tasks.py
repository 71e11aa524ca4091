"""Dispatching through Cloud Tasks: App Engine tasks to this app's own endpoints.

A task named ``<queue>/tasks/<task id>`` is refused (ALREADY_EXISTS) while the queue
remembers the id (an hour for queues made through the API, 9 days for queue.yaml's), so
dispatching the same work twice is refused by the queue itself.  Tasks carry
``X-AppEngine-QueueName``, a deliverer's marker the app already trusts (App Engine strips it
from outside requests).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from typing import Any

import google.auth.exceptions
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.cloud import tasks_v2

from dispatch import Dispatched, DispatchError, Work

QUEUE_SETTING = "DEDUP_TASKS_QUEUE"
LOCATION_SETTING = "DEDUP_TASKS_LOCATION"
API_BASE_SETTING = "DEDUP_TASKS_API_BASE"
QUEUE_ID = re.compile(r"[A-Za-z0-9-]{1,100}")
QUEUE_NAME = re.compile(r"projects/[a-z0-9.:-]+/locations/[a-z0-9-]+/queues/[A-Za-z0-9-]{1,100}")


class DispatchSettingError(ValueError):
    """A bad DEDUP_TASKS_* setting: the app refuses to start."""


class CloudTasksDispatcher:
    """Work as App Engine tasks on one queue, routed to ``service`` (this app's)."""

    def __init__(self, queue: str, service: str | None = None, api_base: str | None = None, client: Any = None) -> None:
        if not QUEUE_NAME.fullmatch(queue):
            raise DispatchSettingError(
                f"{QUEUE_SETTING} must be projects/PROJECT/locations/LOCATION/queues/QUEUE, got {queue!r}"
            )
        self.queue = queue
        self.service = service
        self.api_base = api_base
        self._client = client
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """Made on first use: building the app needs no credentials (the NDB client waits too)."""
        with self._lock:
            if self._client is None:
                options = ClientOptions(api_endpoint=self.api_base) if self.api_base else None
                # REST, not gRPC: one transport for production and the local stand-in tests use.
                self._client = tasks_v2.CloudTasksClient(transport="rest", client_options=options)
            return self._client

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CloudTasksDispatcher | None:
        """The dispatcher DEDUP_TASKS_QUEUE names, or None when it is unset (or names a bare queue id
        where no project is known: off App Engine, as under make devserver).

        DEDUP_TASKS_QUEUE is the queue's resource name, or its id: then the project is
        GOOGLE_CLOUD_PROJECT (App Engine sets it) and the location DEDUP_TASKS_LOCATION.
        """
        queue = environ.get(QUEUE_SETTING)
        if not queue:
            return None
        if QUEUE_ID.fullmatch(queue):
            project, location = environ.get("GOOGLE_CLOUD_PROJECT"), environ.get(LOCATION_SETTING)
            if not project and environ.get("GAE_ENV") != "standard":
                return None
            if not project or not location:
                raise DispatchSettingError(
                    f"{QUEUE_SETTING}={queue!r} is a queue id: it needs GOOGLE_CLOUD_PROJECT and {LOCATION_SETTING} "
                    "(the queue's region, e.g. us-central1), or give the queue's whole name"
                )
            queue = f"projects/{project}/locations/{location}/queues/{queue}"
        base = environ.get(API_BASE_SETTING) or None
        if base is not None and not re.fullmatch(r"https?://[^/?#\s]+", base):
            raise DispatchSettingError(f"{API_BASE_SETTING} must be an http(s) base URL, got {base!r}")
        return cls(queue, service=environ.get("GAE_SERVICE") or None, api_base=base)

    def dispatch(self, work: Work) -> Dispatched:
        request = tasks_v2.AppEngineHttpRequest(
            http_method=tasks_v2.HttpMethod.POST,
            relative_uri=work.relative_uri,
            headers={"Content-Type": "application/json"},
            body=json.dumps(work.body, sort_keys=True).encode("utf-8"),
            app_engine_routing=tasks_v2.AppEngineRouting(service=self.service) if self.service else None,
        )
        task = tasks_v2.Task(name=f"{self.queue}/tasks/{work.task_id}", app_engine_http_request=request)
        try:
            self.client.create_task(parent=self.queue, task=task)
        except (api_exceptions.GoogleAPIError, google.auth.exceptions.GoogleAuthError, OSError) as exc:
            if already_exists(exc):
                return Dispatched(work.task_id, already=True)
            raise DispatchError(f"Cloud Tasks did not take task {work.task_id}: {exc}") from exc
        return Dispatched(work.task_id)


def already_exists(exc: BaseException) -> bool:
    """ALREADY_EXISTS: gRPC's own code, or over REST a 409 whose status says so (409 is ABORTED too)."""
    if isinstance(exc, api_exceptions.AlreadyExists):
        return True
    if not isinstance(exc, api_exceptions.Conflict) or exc.response is None:
        return False
    try:
        return bool(exc.response.json()["error"]["status"] == "ALREADY_EXISTS")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
