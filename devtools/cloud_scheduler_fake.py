"""A local stand-in for Cloud Scheduler's v1 REST API as ``python -m deploy scheduler apply`` calls it.

It speaks the API's shapes: ``GET`` and ``POST /v1/projects/P/locations/L/jobs`` (jobs.list, paged
with ``pageSize`` and ``pageToken``; jobs.create), ``GET``, ``PATCH`` and ``DELETE /v1/{name}``
(jobs.get; jobs.patch with its ``updateMask``; jobs.delete) and ``POST /v1/{name}:pause`` and
``:resume``.  Jobs are kept as the API's JSON (camelCase, enums by name, bytes in base64).

An update does what the API does with a mask: each path it names is set from the request's job,
or cleared where the request's job has none (a proto3 default is not sent), so a field left out of
the mask is never touched and one named but not sent is gone.  It refuses an empty mask (what
gcloud 528 sends for ``--clear-message-body`` alone: the flag names no field), so a client that
would send one is caught, not believed; and a path that is no Job field or is output only, and a
job left without exactly one target.  It shows the ``User-Agent`` header Scheduler sets on every
job's target (target.proto), so a diff against a live job meets it.

It records every request, asks for no credentials (a client sends none to an ``http://`` base),
and refuses requests on demand (``refuse``).  The Cloud Scheduler the app itself
calls (pause, resume, run, with its service account) is GoogleFakes' (devtools/google_fakes.py).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import re
import threading
import urllib.parse
from typing import Any

from devtools.json_server import JsonServer

JOBS = re.compile(r"/v1/(projects/[^/]+/locations/[^/]+)/jobs")
JOB = re.compile(r"/v1/(projects/[^/]+/locations/[^/]+/jobs/[A-Za-z0-9_-]{1,500})(?::(pause|resume))?")
TARGETS = ("appEngineHttpTarget", "httpTarget", "pubsubTarget")
# What Scheduler shows in a target's headers unless the job sets its own (target.proto).
USER_AGENTS = {
    "appEngineHttpTarget": "AppEngine-Google; (+http://code.google.com/appengine)",
    "httpTarget": "Google-Cloud-Scheduler",
}
# The Job fields a mask may name (their subfields too); the rest are output only.
UPDATABLE = frozenset({"description", "schedule", "timeZone", "attemptDeadline", "retryConfig", *TARGETS})
HTTP_METHODS = ("HTTP_METHOD_UNSPECIFIED", "POST", "GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS")
DEFAULT_PAGE_SIZE = 500

Job = dict[str, Any]


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any  # the request's JSON, or None
    headers: dict[str, str]

    @property
    def update_mask(self) -> list[str]:
        """A PATCH's updateMask, path by path (camelCase, as the REST API takes them)."""
        return [path for path in self.query.get("updateMask", "").split(",") if path]


@dataclasses.dataclass
class Refusal:
    method: str
    path_part: str
    status: int
    api_status: str
    message: str
    times: int = 1


class CloudSchedulerFake:
    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}  # by resource name, as the API would answer a get
        self.requests: list[Request] = []
        self.refusals: list[Refusal] = []
        self.page_size = DEFAULT_PAGE_SIZE  # jobs.list's largest page (a test lowers it to page)
        self._lock = threading.Lock()
        self.local = JsonServer(self._serve)
        self.url = self.local.url

    def close(self) -> None:
        self.local.close()

    def reset(self) -> None:
        with self._lock:
            self.jobs.clear()
            self.requests.clear()
            self.refusals.clear()
            self.page_size = DEFAULT_PAGE_SIZE

    def put(self, job: Job, state: str = "ENABLED") -> Job:
        """A live job, as a test finds it (made earlier, by hand or by another tool)."""
        stored = _shown({**copy.deepcopy(job), "state": state, "userUpdateTime": _now()})
        with self._lock:
            self.jobs[job["name"]] = stored
        return stored

    def refuse(
        self, method: str, path_part: str, status: int = 403, api_status: str = "PERMISSION_DENIED", **more: Any
    ) -> None:
        """Answer the next ``method`` request whose path holds ``path_part`` with an error, doing nothing."""
        message = more.pop("message", "The caller does not have permission")
        with self._lock:
            self.refusals.append(Refusal(method, path_part, status, api_status, message, **more))

    def calls(self, method: str | None = None) -> list[Request]:
        return [request for request in self.requests if method is None or request.method == method]

    # -- serving -----------------------------------------------------------------------------

    def _serve(self, method: str, target: str, raw: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        parts = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(parts.query))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return _error(400, "INVALID_ARGUMENT", "the body is not JSON")
        with self._lock:
            self.requests.append(Request(method, parts.path, query, body, headers))
            for refusal in self.refusals:
                if refusal.method == method and refusal.path_part in parts.path and refusal.times > 0:
                    refusal.times -= 1
                    return _error(refusal.status, refusal.api_status, refusal.message)
            return self._route(method, parts.path, query, body)

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        listed = JOBS.fullmatch(path)
        if listed and method == "GET":
            return self._list(listed[1], query)
        if listed and method == "POST":
            return self._create(listed[1], body)
        named = JOB.fullmatch(path)
        if named is None:
            return _error(404, "NOT_FOUND", f"no such method: {method} {path}")
        name, action = named[1], named[2]
        job = self.jobs.get(name)
        if job is None:
            return _error(404, "NOT_FOUND", f"Job not found: {name}.")
        if action is None and method == "GET":
            return 200, job
        if action is None and method == "DELETE":
            del self.jobs[name]
            return 200, {}
        if action is None and method == "PATCH":
            return self._update(job, body, query.get("updateMask", ""))
        if action is not None and method == "POST":
            wanted, needed = ("PAUSED", "ENABLED") if action == "pause" else ("ENABLED", "PAUSED")
            if job["state"] != needed:
                return _error(400, "FAILED_PRECONDITION", f"Job must be {needed} to {action}; it is {job['state']}.")
            job["state"] = wanted
            return 200, job
        return _error(404, "NOT_FOUND", f"no such method: {method} {path}")

    def _list(self, parent: str, query: dict[str, str]) -> tuple[int, Any]:
        found = sorted((job for name, job in self.jobs.items() if name.startswith(parent + "/jobs/")), key=_name)
        size = min(int(query.get("pageSize") or self.page_size), self.page_size)
        start = int(query.get("pageToken") or 0)
        page: dict[str, Any] = {"jobs": found[start : start + size]} if found else {}
        if start + size < len(found):
            page["nextPageToken"] = str(start + size)
        return 200, page

    def _create(self, parent: str, job: Any) -> tuple[int, Any]:
        name = job.get("name") if isinstance(job, dict) else None
        if not isinstance(name, str) or not re.fullmatch(rf"{re.escape(parent)}/jobs/[A-Za-z0-9_-]{{1,500}}", name):
            return _error(400, "INVALID_ARGUMENT", f"Job name must be {parent}/jobs/JOB_ID, got {name!r}.")
        if not job.get("schedule"):
            return _error(400, "INVALID_ARGUMENT", "A job needs a schedule.")
        problem = _target_problem(job)
        if problem:
            return _error(400, "INVALID_ARGUMENT", problem)
        if name in self.jobs:
            return _error(409, "ALREADY_EXISTS", f"Job {name} already exists.")
        self.jobs[name] = _shown({**copy.deepcopy(job), "state": "ENABLED", "userUpdateTime": _now()})
        return 200, self.jobs[name]

    def _update(self, job: Job, sent: Any, mask: str) -> tuple[int, Any]:
        paths = [path for path in mask.split(",") if path]
        if not paths:
            return _error(400, "INVALID_ARGUMENT", "updateMask names no field: this stand-in updates nothing on it")
        if not isinstance(sent, dict) or sent.get("name", job["name"]) != job["name"]:  # the URL names it
            return _error(400, "INVALID_ARGUMENT", f"the body's job is not {job['name']}")
        unknown = [path for path in paths if path.split(".")[0] not in UPDATABLE]
        if unknown:
            return _error(400, "INVALID_ARGUMENT", f"updateMask names fields that cannot be updated: {unknown}")
        updated = copy.deepcopy(job)
        for path in paths:
            _set(updated, path.split("."), _get(sent, path.split(".")))
        problem = _target_problem(updated)
        if problem:
            return _error(400, "INVALID_ARGUMENT", problem)
        updated = _shown({**updated, "userUpdateTime": _now()})
        self.jobs[job["name"]] = updated
        return 200, updated


def _target_problem(job: Job) -> str | None:
    targets = [target for target in TARGETS if target in job]
    if len(targets) != 1:
        return f"A job needs exactly one target; this one has {targets or 'none'}."
    target = job[targets[0]]
    if "oidcToken" in target and "oauthToken" in target:  # authorization_header is a oneof (target.proto)
        return "An HttpTarget takes an oidcToken or an oauthToken, not both."
    if "body" in target and _method(target.get("httpMethod")) not in ("POST", "PUT", "PATCH"):
        return "A body is allowed only with POST, PUT or PATCH."
    return None


def _shown(job: Job) -> Job:
    """The job as the API answers it: enums by name, Scheduler's own User-Agent on its target."""
    for kind, agent in USER_AGENTS.items():
        target = job.get(kind)
        if isinstance(target, dict):
            target["httpMethod"] = _method(target.get("httpMethod"))
            headers = target.setdefault("headers", {})
            if not any(header.lower() == "user-agent" for header in headers):
                headers["User-Agent"] = agent
    return job


def _method(value: Any) -> str:
    """An HttpMethod as JSON may carry it (its name, or its number: the client sends numbers)."""
    if isinstance(value, int) and 0 <= value < len(HTTP_METHODS):
        value = HTTP_METHODS[value]
    return "POST" if value in (None, "HTTP_METHOD_UNSPECIFIED") else str(value)


def _get(job: Any, keys: list[str]) -> Any:
    for key in keys:
        if not isinstance(job, dict) or key not in job:
            return None
        job = job[key]
    return job


def _set(job: Job, keys: list[str], value: Any) -> None:
    """Set the path to ``value``, or clear it (None), dropping the messages it leaves empty."""
    if len(keys) == 1:
        if value is None:
            job.pop(keys[0], None)
        else:
            job[keys[0]] = copy.deepcopy(value)
        return
    inner = job.get(keys[0])
    if not isinstance(inner, dict):
        if value is None:
            return
        inner = job[keys[0]] = {}
    _set(inner, keys[1:], value)
    if not inner:
        del job[keys[0]]


def _name(job: Job) -> str:
    return str(job["name"])


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def _error(code: int, status: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"error": {"code": code, "status": status, "message": message}}
