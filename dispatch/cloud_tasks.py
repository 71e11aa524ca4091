"""Dispatching through Cloud Tasks: App Engine tasks to this app's own endpoints, and HTTP tasks
with an OIDC token to an external job's handler.

The client speaks gRPC, google-cloud-tasks' default and what its emulators speak, or REST
(DEDUP_TASKS_TRANSPORT=rest).  Against an ``http://`` base URL (a local emulator or stand-in)
it sends no credentials: a plaintext channel, anonymous credentials; against Google's (or an
``https://`` endpoint) it uses the app's service account.

A task named ``<queue>/tasks/<task id>`` is refused (ALREADY_EXISTS) while the queue
remembers the id (an hour for queues made through the API, 9 days for queue.yaml's), so
dispatching the same work twice is refused by the queue itself.  Tasks carry
``X-AppEngine-QueueName``, a deliverer's marker the app already trusts (App Engine strips it
from outside requests).
"""

from __future__ import annotations

import datetime
import json
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

import google.auth.exceptions
import grpc
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from dispatch import Dispatched, DispatchError, HttpTarget, Work
from jobs.trace_headers import outgoing_trace_headers, traced
from settings import SettingError, Settings, is_local_api_base, tasks_queue_name

# The app's one setting error: a bad DEDUP_TASKS_* setting stops the app (settings.py's rules).
DispatchSettingError = SettingError


class CloudTasksDispatcher:
    """Work as App Engine tasks on one queue, routed to ``service`` (this app's)."""

    def __init__(
        self,
        queue: str,
        service: str | None = None,
        api_base: str | None = None,
        client: Any = None,
        transport: str = "grpc",
    ) -> None:
        self.queue = tasks_queue_name(queue)
        self.service = service
        self.api_base = api_base
        self.transport = transport
        self._client = client
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """Made on first use: building the app needs no credentials (the NDB client waits too)."""
        with self._lock:
            if self._client is None:
                self._client = tasks_client(self.api_base, self.transport)
            return self._client

    @classmethod
    def from_settings(cls, settings: Settings) -> CloudTasksDispatcher | None:
        """The dispatcher of the queue DEDUP_TASKS_QUEUE names, or None when none is (settings.py)."""
        if settings.tasks_queue is None:
            return None
        return cls(
            settings.tasks_queue,
            service=settings.service,
            api_base=settings.tasks_api_base,
            transport=settings.tasks_transport,
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CloudTasksDispatcher | None:
        """``from_settings`` of the settings ``environ`` holds."""
        return cls.from_settings(Settings.from_environ(environ))

    def dispatch(self, work: Work) -> Dispatched:
        name = f"{self.queue}/tasks/{work.task_id}"
        # The task continues the trace of the request that dispatched it (handlers/tracing.py reads it).
        trace = outgoing_trace_headers()
        if work.http is not None:
            deadline = datetime.timedelta(seconds=round(min(max(work.http.deadline_seconds, 15), 1800)))
            task = tasks_v2.Task(name=name, http_request=http_request(work.http, trace), dispatch_deadline=deadline)
        else:
            request = tasks_v2.AppEngineHttpRequest(
                http_method=tasks_v2.HttpMethod.POST,
                relative_uri=work.relative_uri,
                headers={**trace, "Content-Type": "application/json"},
                body=json.dumps(work.body, sort_keys=True).encode("utf-8"),
                app_engine_routing=tasks_v2.AppEngineRouting(service=self.service) if self.service else None,
            )
            task = tasks_v2.Task(name=name, app_engine_http_request=request)
        if work.delay_seconds > 0:
            task.schedule_time = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=work.delay_seconds)
        try:
            self.client.create_task(parent=self.queue, task=task)
        except (api_exceptions.GoogleAPIError, google.auth.exceptions.GoogleAuthError, OSError) as exc:
            if already_exists(exc):
                return Dispatched(work.task_id, already=True)
            raise DispatchError(f"Cloud Tasks did not take task {work.task_id}: {exc}") from exc
        return Dispatched(work.task_id)


def tasks_client(api_base: str | None, transport: str) -> tasks_v2.CloudTasksClient:
    """A Cloud Tasks client over ``transport`` to ``api_base`` (None: Google's, with the app's credentials).

    A plain ``http://`` base is a local emulator (settings.is_local_api_base): no TLS and no
    credentials, which google-auth would otherwise look for (and fail to find) before the first call.
    """
    if api_base is None:
        return tasks_v2.CloudTasksClient(transport=transport)
    local = is_local_api_base(api_base)
    if transport == "grpc":
        endpoint = grpc_endpoint(api_base)
        if local:
            return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=grpc.insecure_channel(endpoint)))
        return tasks_v2.CloudTasksClient(transport="grpc", client_options=ClientOptions(api_endpoint=endpoint))
    return tasks_v2.CloudTasksClient(
        transport="rest",
        client_options=ClientOptions(api_endpoint=api_base),
        credentials=AnonymousCredentials() if local else None,  # type: ignore[no-untyped-call]
    )


def grpc_endpoint(api_base: str) -> str:
    """``host:port`` of a base URL, as gRPC names a target: an IPv6 host bracketed, the scheme's port
    when none is given."""
    parts = urllib.parse.urlsplit(api_base)
    host = parts.hostname or ""
    port = parts.port or (80 if parts.scheme == "http" else 443)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_request(target: HttpTarget, trace: dict[str, str]) -> tasks_v2.HttpRequest:
    """An HTTP target's request: Cloud Tasks signs an OIDC token as ``service_account`` (the app's
    own account needs roles/iam.serviceAccountUser on it) and sends it with the request."""
    return tasks_v2.HttpRequest(
        url=target.url,
        http_method=getattr(tasks_v2.HttpMethod, target.method),
        headers=traced(target.headers, trace),
        body=target.body,
        oidc_token=tasks_v2.OidcToken(service_account_email=target.service_account, audience=target.audience),
    )


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
