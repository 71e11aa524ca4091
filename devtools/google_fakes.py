"""Local stand-ins for the Google services the job kinds call.

One HTTP server speaks the request and response shapes the code uses:
- the metadata server (google-auth finds it through GCE_METADATA_HOST and
  GCE_METADATA_IP, as on App Engine, and gets an access token from it);
- Workflows executions.create / executions.list (filter on a label);
- Cloud Run v2 jobs.run (a long-running operation whose execution it keeps, its
  task template's containers carrying the overrides) / executions.list (newest
  first, paged by pageSize and pageToken; no filter, as the real API has none);
- Cloud Build triggers.run (an operation carrying the build) / builds.list
  (filter on a substitution);
- Cloud Scheduler jobs.create, get, run, delete, pause and resume (a run delivers the
  job through ``on_run``, the test's App Engine);
- Cloud Logging entries.list (devtools/cloud_logging_fake.py).
It records every call, checks the bearer token, and fails or answers late
on demand.
"""

from __future__ import annotations

import dataclasses
import datetime
import http.server
import itertools
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from requests.structures import CaseInsensitiveDict

from dedup.clock import Clock, SystemClock
from devtools import POLL_SECONDS
from devtools.cloud_logging_fake import APP_ENGINE_USER_AGENT, CloudLogging

TOKEN = "fake-access-token"
SERVICE_ACCOUNT = "dedup-app@fake-project.iam.gserviceaccount.com"
RUN_EXECUTIONS_PAGE_SIZE = 50  # executions.list's page when pageSize is not given


@dataclasses.dataclass
class Call:
    method: str
    path: str
    query: dict
    body: Any  # the request's JSON, or None
    headers: CaseInsensitiveDict[str]


@dataclasses.dataclass
class Fault:
    path_part: str
    status: int = 503
    api_status: str = "UNAVAILABLE"
    message: str = "The service is currently unavailable."
    times: int = 1
    after_effect: bool = False  # create the resource, then answer with the error (a lost answer)
    delay: float = 0.0  # answer (successfully, unless status) this late, after the effect
    method: str = "POST"  # faults hit the calls that start things, unless told otherwise
    spare: int = 0  # let this many matching calls through first


class GoogleFakes:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self.executions: list[dict] = []
        self.run_operations: list[dict] = []
        # Cloud Run executions, as jobs.run made them (or a test put them), oldest first.
        self.run_executions: list[dict] = []
        # A listing that lags: while ``hide_new``, a new Cloud Run execution is left out of
        # executions.list until its name leaves ``unlisted``.
        self.hide_new = False
        self.unlisted: set[str] = set()
        self.builds: list[dict] = []
        # Cloud Scheduler jobs' states by resource name; a job not listed is ENABLED.
        self.scheduler_states: dict[str, str] = {}
        # Cloud Scheduler jobs by resource name, as jobs.create made them (or a test put them).
        self.scheduler_jobs: dict[str, dict] = {}
        # What a jobs.run sends, as Cloud Scheduler does: called with the job and the request's
        # headers (App Engine and the app are the test's).  None: the delivery never arrives.
        self.on_run: Callable[[dict, dict[str, str]], None] | None = None
        # The metadata server's ID tokens (…/identity?audience=A): a signed token for A, as the
        # test's issuer mints it.  None: the identity endpoint is not found.
        self.id_token_for: Callable[[str], str] | None = None
        self.logging = CloudLogging()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # The API servers' clock: the tests' manual clock, so start times and
        # the app's records agree (the google fixture sets it).
        self.clock: Clock = SystemClock()
        fakes = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                fakes._serve(self)

            do_POST = do_DELETE = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.host}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()

    def reset(self) -> None:
        self.clock = SystemClock()
        with self._lock:
            self.calls.clear()
            self.faults.clear()
            self.executions.clear()
            self.run_operations.clear()
            self.run_executions.clear()
            self.hide_new = False
            self.unlisted.clear()
            self.builds.clear()
            self.scheduler_states.clear()
            self.scheduler_jobs.clear()
            self.on_run = None
            self.id_token_for = None
        self.logging.clear()

    def fail(self, path_part: str, **fault) -> None:
        with self._lock:
            self.faults.append(Fault(path_part, **fault))

    def api_calls(self, method: str | None = None) -> list[Call]:
        return [
            c
            for c in self.calls
            if not c.path.startswith("/computeMetadata") and c.path != "/" and (method is None or c.method == method)
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- serving ---------------------------------------------------------------

    def _serve(self, handler) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        call = Call(handler.command, parsed.path, query, body, CaseInsensitiveDict(handler.headers.items()))
        with self._lock:
            self.calls.append(call)
        status, payload, headers = self._route(call)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        handler.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        try:
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _route(self, call: Call):
        path = call.path
        if path == "/" or path.startswith("/computeMetadata"):
            return self._metadata(call)
        if call.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
        fault = self._take_fault(call.method, path)
        if fault and not fault.after_effect and not fault.delay:
            return _error(fault.status, fault.api_status, fault.message)
        answer = self._api(call)
        if fault and fault.delay:
            time.sleep(fault.delay)
        if fault and fault.after_effect:
            return _error(fault.status, fault.api_status, fault.message)
        return answer

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.path_part in path and fault.method == method and fault.times > 0:
                    if fault.spare > 0:
                        fault.spare -= 1
                        continue
                    fault.times -= 1
                    return fault
        return None

    def _metadata(self, call: Call):
        flavor = {"Metadata-Flavor": "Google"}
        if call.path != "/" and call.headers.get("Metadata-Flavor") != "Google":
            return 403, b"missing Metadata-Flavor", flavor
        if call.path == "/":
            return 200, b"", flavor
        if call.path.endswith("/project/project-id"):
            return 200, b"fake-project", {**flavor, "Content-Type": "text/plain"}
        if call.path.endswith("/token"):
            return 200, {"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"}, flavor
        if call.path.endswith("/identity") and self.id_token_for is not None and call.query.get("audience"):
            return 200, self.id_token_for(call.query["audience"]).encode(), {**flavor, "Content-Type": "text/html"}
        if call.path.endswith("/email"):
            return 200, SERVICE_ACCOUNT.encode(), {**flavor, "Content-Type": "text/plain"}
        if call.path.rstrip("/").endswith("/service-accounts/default"):
            return (
                200,
                {
                    "email": SERVICE_ACCOUNT,
                    "aliases": ["default"],
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                },
                flavor,
            )
        return 404, b"not found", flavor

    def _scheduler(self, call: Call, name: str, action: str | None):
        """Cloud Scheduler's jobs.get, delete, run, pause and resume: a job must be ENABLED to pause,
        PAUSED to resume; delete and run need a job jobs.create made (or the test put)."""
        if action == "run" and call.method == "POST":
            return self._run_scheduler_job(name)
        with self._lock:
            state = self.scheduler_states.get(name, "ENABLED")
            job = self.scheduler_jobs.get(name)
            if action is None and call.method == "GET":
                return 200, {**(job or {"name": name}), "state": state}, {}
            if action is None and call.method == "DELETE":
                if self.scheduler_jobs.pop(name, None) is None:
                    return _error(404, "NOT_FOUND", "Job not found.")
                self.scheduler_states.pop(name, None)
                return 200, {}, {}
            if call.method != "POST" or action is None:
                return _error(404, "NOT_FOUND", f"no such method {call.method} {call.path}")
            wanted, needed = ("PAUSED", "ENABLED") if action == "pause" else ("ENABLED", "PAUSED")
            if state != needed:
                return _error(400, "FAILED_PRECONDITION", f"Job must be {needed} to {action}; it is {state}.")
            self.scheduler_states[name] = wanted
            return 200, {**(job or {"name": name}), "state": wanted}, {}

    def _create_scheduler_job(self, parent: str, job: Any):
        """jobs.create: the job's name must be under ``parent``, and new."""
        name = job.get("name") if isinstance(job, dict) else None
        if not isinstance(name, str) or not re.fullmatch(rf"{re.escape(parent)}/jobs/[A-Za-z0-9_-]{{1,500}}", name):
            return _error(400, "INVALID_ARGUMENT", f"Job name must be {parent}/jobs/JOB_ID, got {name!r}.")
        targets = [t for t in ("appEngineHttpTarget", "httpTarget", "pubsubTarget") if t in job]
        if len(targets) != 1 or not job.get("schedule"):
            return _error(400, "INVALID_ARGUMENT", "A job needs a schedule and exactly one target.")
        with self._lock:
            if name in self.scheduler_jobs:
                return _error(409, "ALREADY_EXISTS", f"Job {name} already exists.")
            created = {**job, "state": "ENABLED", "userUpdateTime": _utc_text(self.clock.now())}
            self.scheduler_jobs[name] = created
        return 200, created, {}

    def _run_scheduler_job(self, name: str):
        """jobs.run: deliver the job now, with the headers Cloud Scheduler sends an App Engine target."""
        with self._lock:
            job = self.scheduler_jobs.get(name)
        if job is None:
            return _error(404, "NOT_FOUND", "Job not found.")
        target = job.get("appEngineHttpTarget") or {}
        headers = {
            "User-Agent": APP_ENGINE_USER_AGENT,
            **(target.get("headers") or {}),
            "X-CloudScheduler": "true",
            "X-CloudScheduler-JobName": name.rsplit("/", 1)[-1],
            # A Force run's schedule time is not documented: this stand-in sends its own time.
            "X-CloudScheduler-ScheduleTime": _utc_text(self.clock.now().replace(microsecond=0)),
        }
        if self.on_run is not None:
            self.on_run(job, headers)
        return 200, {**job, "lastAttemptTime": _utc_text(self.clock.now())}, {}

    def _api(self, call: Call):
        now = self.clock.now().isoformat().replace("+00:00", "Z")
        number = next(self._ids)
        workflow = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+/workflows/[^/]+)/executions", call.path)
        if workflow and call.method == "POST":
            execution = {
                "name": f"{workflow[1]}/executions/exec-{number}",
                "state": "ACTIVE",
                "argument": call.body.get("argument"),
                "labels": call.body.get("labels", {}),
                "startTime": now,
            }
            with self._lock:
                self.executions.append(execution)
            return 200, execution, {}
        if workflow and call.method == "GET":
            match = re.fullmatch(r'labels\.([a-z0-9_]+)="([a-z0-9_-]*)"', call.query.get("filter", ""))
            if match is None:
                return _error(400, "INVALID_ARGUMENT", f"invalid filter: {call.query.get('filter')!r}")
            found = [
                e
                for e in self.executions
                if e["name"].startswith(workflow[1] + "/") and e["labels"].get(match[1]) == match[2]
            ]
            return 200, ({"executions": found} if found else {}), {}
        scheduler = re.fullmatch(
            r"/v1/(projects/[^/]+/locations/[^/]+/jobs/[A-Za-z0-9_-]+)(?::(pause|resume|run))?", call.path
        )
        if scheduler:
            return self._scheduler(call, scheduler[1], scheduler[2])
        new_job = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+)/jobs", call.path)
        if new_job and call.method == "POST":
            return self._create_scheduler_job(new_job[1], call.body)
        if call.path == "/v2/entries:list" and call.method == "POST":
            status, answer = self.logging.entries_list(call.body)
            return status, answer, {}
        run = re.fullmatch(r"/v2/(projects/([^/]+)/locations/([^/]+)/jobs/([^/]+)):run", call.path)
        if run and call.method == "POST":
            overrides = call.body.get("overrides") or {}
            execution = {
                "name": f"{run[1]}/executions/{run[4]}-{number:05d}",
                "createTime": now,
                "labels": {},
                "template": {"containers": [_container(o) for o in overrides.get("containerOverrides") or [{}]]},
            }
            operation = {
                "name": f"projects/{run[2]}/locations/{run[3]}/operations/op-{number}",
                "metadata": {
                    "@type": "type.googleapis.com/google.cloud.run.v2.Execution",
                    **execution,
                },
            }
            with self._lock:
                self.run_executions.append(execution)
                self.run_operations.append(operation)
                if self.hide_new:
                    self.unlisted.add(execution["name"])
            return 200, operation, {}
        run_executions = re.fullmatch(r"/v2/(projects/[^/]+/locations/[^/]+/jobs/[^/]+)/executions", call.path)
        if run_executions and call.method == "GET":
            return self._list_run_executions(run_executions[1], call.query)
        got_trigger = re.fullmatch(r"/v1/projects/([^/]+)/locations/([^/]+)/triggers/([^/:]+)", call.path)
        if got_trigger and call.method == "GET":
            return 200, {"id": f"uuid-{got_trigger[3]}", "name": got_trigger[3]}, {}
        trigger = re.fullmatch(r"/v1/projects/([^/]+)/locations/([^/]+)/triggers/([^/]+):run", call.path)
        if trigger and call.method == "POST":
            build_id = f"build-{number}"
            build = {
                "id": build_id,
                "name": f"projects/{trigger[1]}/locations/{trigger[2]}/builds/{build_id}",
                "buildTriggerId": f"uuid-{trigger[3]}",
                "status": "QUEUED",
                "createTime": now,
                "substitutions": (call.body.get("source") or {}).get("substitutions", {}),
                "source": call.body.get("source"),
            }
            with self._lock:
                self.builds.append(build)
            return (
                200,
                {
                    "name": f"projects/{trigger[1]}/locations/{trigger[2]}/operations/op-{number}",
                    "metadata": {
                        "@type": "type.googleapis.com/google.devtools.cloudbuild.v1.BuildOperationMetadata",
                        "build": build,
                    },
                },
                {},
            )
        builds = re.fullmatch(r"/v1/projects/([^/]+)/locations/([^/]+)/builds", call.path)
        if builds and call.method == "GET":
            # Like the real API: documented fields only (substitutions are not filterable).
            match = re.fullmatch(r'trigger_id="([^"]+)"', call.query.get("filter", ""))
            if match is None:
                return _error(400, "INVALID_ARGUMENT", f"invalid filter: {call.query.get('filter')!r}")
            found = sorted(
                (
                    b
                    for b in self.builds
                    if b["buildTriggerId"] == match[1]
                    and b["name"].startswith(f"projects/{builds[1]}/locations/{builds[2]}/")
                ),
                key=lambda b: b["createTime"],
                reverse=True,
            )
            return 200, ({"builds": found} if found else {}), {}
        return _error(404, "NOT_FOUND", f"no such method: {call.method} {call.path}")

    def _list_run_executions(self, job: str, query: dict):
        """Cloud Run's executions.list: the job's executions, newest first, a page at a time.  Its
        only parameters are pageSize, pageToken and showDeleted (this stand-in deletes nothing);
        any other, a filter say, is refused as the real API refuses an unknown one."""
        unknown = set(query) - {"pageSize", "pageToken", "showDeleted"}
        if unknown:
            return _error(
                400, "INVALID_ARGUMENT", f"Invalid JSON payload received. Unknown name {sorted(unknown)[0]!r}"
            )
        size = int(query.get("pageSize") or RUN_EXECUTIONS_PAGE_SIZE)
        token = query.get("pageToken") or ""
        if (token and not re.fullmatch(r"from-[0-9]+", token)) or not 0 < size <= 1000:
            return _error(400, "INVALID_ARGUMENT", f"invalid pageToken or pageSize: {token!r}, {size}")
        start = int(token.removeprefix("from-")) if token else 0
        with self._lock:
            mine = [
                (i, e)
                for i, e in enumerate(self.run_executions)
                if e["name"].startswith(job + "/executions/") and e["name"] not in self.unlisted
            ]
        newest_first = [e for _, e in sorted(mine, key=lambda p: (_instant(p[1]["createTime"]), p[0]), reverse=True)]
        page = newest_first[start : start + size]
        answer: dict[str, Any] = {"executions": page} if page else {}
        if start + size < len(newest_first):
            answer["nextPageToken"] = f"from-{start + size}"
        return 200, answer, {}


def _container(override: dict) -> dict:
    """A container of an execution's task template, as a jobs.run container override set it.  Its
    env is the override's, in proto3 JSON: an empty value is left out."""
    env = [
        {"name": item["name"], **({"value": item["value"]} if item.get("value") else {})}
        for item in override.get("env") or []
    ]
    container: dict[str, Any] = {"name": override.get("name") or "job", "image": "fake-image", "env": env}
    if override.get("args"):
        container["args"] = override["args"]
    return container


def _instant(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def _utc_text(instant) -> str:
    return instant.isoformat().replace("+00:00", "Z")


def _error(code: int, status: str, message: str):
    return code, {"error": {"code": code, "message": message, "status": status}}, {}
