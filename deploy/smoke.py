"""``python -m deploy smoke``: force one Cloud Scheduler delivery, and say what the app saw of it.

That Cloud Scheduler's App Engine requests pass ``login: admin`` and carry the marker the app
admits them by (``X-Appengine-User-Ip: 0.1.0.2``) is observed, not documented: were it wrong,
every delivery would be refused and every run lost, with nothing but 401s in a log to say so.
So after a first deploy the smoke runs a Scheduler job now (``jobs.run``; a throwaway job, made
by ``jobs.create`` and removed by ``jobs.delete`` whatever happens, unless one is named), reads
the app's closing line of the delivery in Cloud Logging (``entries.list``; handlers/logs.py writes
it, with the principal, the job name and schedule time the run is keyed on, and the outcome) and
App Engine's request log (which holds the requests refused before the app saw them), and prints
what the app saw.  It fails when the delivery was refused (401, 403), keyed wrongly (400, a key
under another job), failed, or never came.

Both APIs are called with Application Default Credentials at configurable base URLs (local
stand-ins in tests, devtools/google_fakes.py; the real services by default).
"""

from __future__ import annotations

import dataclasses
import datetime
import secrets
import shlex
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from dedup.errors import InvalidRunRequest, PermanentJobError, RetryableJobError
from dedup.keys import scheduled_run_key
from jobs.kinds.google_api import GoogleApi

LOGGING_API_BASE = "https://logging.googleapis.com"
LOGGING_BASE_SETTING = "DEDUP_LOGGING_API_BASE"
DEFAULT_TARGET = "ledger-digest"  # it reads the ledger and keeps a count: one run more changes nothing else
THROWAWAY_PREFIX = "dedup-smoke-"
THROWAWAY_SCHEDULE = "0 0 1 1 *"  # once a year: the job lives for one smoke, and runs when told to
MIN_ATTEMPT_DEADLINE, MAX_ATTEMPT_DEADLINE = 15, 600  # an App Engine target's, on automatic scaling
SCHEDULER_PRINCIPAL = "appengine:ip:0.1.0.2"  # what the app names a caller by that marker
REQUEST_LOGGER = "dedup.requests"  # handlers/logs.py's closing line of each request
REQUEST_LOG = "appengine.googleapis.com%2Frequest_log"  # App Engine's line of each request, refused or not
REFUSED = (401, 403)
# The entries read from this much before the run: a clock here ahead of Google's must not hide them.
CLOCK_SKEW = datetime.timedelta(seconds=30)
PAGE_SIZE = 100


class SmokeFailure(Exception):
    """The smoke failed; the message says what was seen and what it means."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A Scheduler job's App Engine request: where it goes and what it carries."""

    name: str  # projects/P/locations/L/jobs/ID
    method: str
    relative_uri: str
    service: str
    headers: Mapping[str, str]

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> Target:
        target = job.get("appEngineHttpTarget")
        if not isinstance(target, dict):
            kinds = [k for k in ("httpTarget", "pubsubTarget") if k in job] or ["no target"]
            raise SmokeFailure(
                f"{job.get('name')} has {', '.join(kinds)}, not an App Engine target: the smoke checks "
                "the deliveries of App Engine-target jobs (python -m deploy scheduler apply makes them)"
            )
        return cls(
            name=str(job["name"]),
            method=str(target.get("httpMethod") or "POST"),
            relative_uri=str(target.get("relativeUri") or "/"),
            service=str((target.get("appEngineRouting") or {}).get("service") or "default"),
            headers=dict(target.get("headers") or {}),
        )

    @property
    def job_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def path(self) -> str:
        """The path as the app logs it (decoded, without the query)."""
        return urllib.parse.unquote(urllib.parse.urlsplit(self.relative_uri).path)

    def run_ids(self, schedule_time: str) -> set[str]:
        """The run ids this job's delivery at ``schedule_time`` may be keyed on: the slot's, a Force run's.

        Derived as /jobs/<job_id> derives them, from the URL's scope, the scope headers and
        the job id; empty when they do not make a key."""
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.relative_uri).query))
        headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            key = scheduled_run_key(
                self.job_id,
                schedule_time,
                query_project=query.get("project"),
                query_location=query.get("location"),
                header_project=headers.get("x-scheduler-project"),
                header_location=headers.get("x-scheduler-location"),
            )
        except InvalidRunRequest:
            return set()
        return {key.run_id, key.as_force_run().run_id}


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request to the job's path, as a log line tells it: the app's own, or App Engine's."""

    from_app: bool  # False: App Engine's request log, which says nothing of how the app keyed it
    timestamp: str
    method: str
    path: str
    status: int
    outcome: str | None = None
    principal: str | None = None
    scheduler_job: str | None = None
    schedule_time: str | None = None
    run_id: str | None = None
    attempt: int | None = None
    source: str | None = None

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> Seen | None:
        line = entry.get("jsonPayload") or {}
        request = entry.get("protoPayload") or {}
        timestamp = str(entry.get("timestamp", ""))
        if line.get("logger") == REQUEST_LOGGER and isinstance(line.get("status"), int):
            return cls(
                from_app=True,
                timestamp=timestamp,
                method=str(line.get("method", "")),
                path=str(line.get("path", "")),
                status=line["status"],
                **{field: line.get(field) for field in _APP_FIELDS},
            )
        if str(request.get("@type", "")).endswith("RequestLog") and isinstance(request.get("status"), int):
            resource = str(request.get("resource", ""))
            return cls(
                from_app=False,
                timestamp=timestamp,
                method=str(request.get("method", "")),
                path=urllib.parse.unquote(urllib.parse.urlsplit(resource).path),
                status=request["status"],
            )
        return None

    def lines(self, target: Target) -> list[str]:
        """What the app saw, for a person."""
        if not self.from_app:
            return [
                f"App Engine's request log: {self.method} {target.relative_uri} {self.status} at {self.timestamp} "
                "(the app wrote no line of it)"
            ]
        answer = f"{self.status} {self.outcome or ''}".strip()
        keyed = (
            f"X-CloudScheduler-JobName: {self.scheduler_job}, X-CloudScheduler-ScheduleTime: {self.schedule_time} "
            f"(run {self.run_id}, {self.source})"
            if self.scheduler_job
            else "nothing (the delivery was answered before it was keyed)"
        )
        return [
            f"the app saw: {self.method} {self.path} at {self.timestamp}",
            f"  principal: {self.principal or 'none (refused before it was identified)'}",
            f"  keyed on:  {keyed}",
            f"  answer:    {answer}" + (f", attempt {self.attempt}" if self.attempt else ""),
        ]


_APP_FIELDS = ("outcome", "principal", "scheduler_job", "schedule_time", "run_id", "attempt", "source")


def throwaway_job(
    project: str, location: str, service: str, target_job: str, lease_seconds: float, now: datetime.datetime
) -> dict[str, Any]:
    """A Scheduler job for one smoke: POST /jobs/<target_job> with its scope, never retried.

    Its attempt deadline is the target's lease (within what an App Engine target may take), as
    ``scheduler validate`` asks of every job."""
    deadline = int(min(max(lease_seconds, MIN_ATTEMPT_DEADLINE), MAX_ATTEMPT_DEADLINE))
    job_id = f"{THROWAWAY_PREFIX}{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    return {
        "name": f"projects/{project}/locations/{location}/jobs/{job_id}",
        "description": "python -m deploy smoke: one forced delivery, then deleted",
        "schedule": THROWAWAY_SCHEDULE,
        "timeZone": "Etc/UTC",
        "attemptDeadline": f"{deadline}s",
        "retryConfig": {"retryCount": 0},
        "appEngineHttpTarget": {
            "httpMethod": "POST",
            "appEngineRouting": {"service": service},
            "relativeUri": f"/jobs/{target_job}?" + urllib.parse.urlencode({"project": project, "location": location}),
        },
    }


def log_filter(project: str, target: Target, since: datetime.datetime) -> str:
    """The app's closing lines and App Engine's request lines of the target's path since ``since``.

    The path is compared exactly on this side too (``:`` is a substring match)."""
    path = _quoted(target.path)
    return " AND ".join(
        [
            'resource.type="gae_app"',
            f"resource.labels.module_id={_quoted(target.service)}",
            f'timestamp>="{since.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")}"',
            f'(jsonPayload.logger="{REQUEST_LOGGER}" OR logName="projects/{project}/logs/{REQUEST_LOG}")',
            f"(jsonPayload.path={path} OR protoPayload.resource:{path})",
        ]
    )


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def verdict(seen: list[Seen], target: Target, settled: bool) -> Seen | None:
    """The request that answers the smoke, or None to keep reading.

    The app's line of this job's delivery; else a line of the app that answered a request on
    the path before keying it (refused, no such job, unkeyable headers); else App Engine's line
    of a request it refused itself, once ``settled`` (the app's line, had it written one, had
    time to arrive).  Deliveries keyed under other Scheduler jobs are someone else's: waited past.
    """
    mine = [s for s in seen if s.from_app and s.scheduler_job == target.job_id]
    unkeyed = [s for s in seen if s.from_app and s.scheduler_job is None and s.status >= 400]
    refused = [s for s in seen if not s.from_app and s.status in REFUSED]
    return next(iter(mine or unkeyed or (refused if settled else [])), None)


def judge(seen: Seen, target: Target) -> str | None:
    """Why the delivery shows a failure, or None when it was admitted, keyed as it should be, and run."""
    job = target.job_id
    every = "every scheduled delivery is refused the same way, and its run lost"
    if not seen.from_app:
        where = (
            "login: admin (app.yaml) did not let Cloud Scheduler's request through"
            if seen.status == 401
            else "the App Engine firewall (python -m deploy firewall allows 0.1.0.2) or login: admin refused it"
        )
        return f"refused: App Engine answered {seen.status} before the app saw the request: {where}; {every}"
    if seen.status in REFUSED:
        who = f"the caller {seen.principal}" if seen.principal else "a caller it could not identify"
        return (
            f"refused: the app answered {seen.status} to {who}: Cloud Scheduler's request did not carry what "
            f"DEDUP_AUTH admits (in appengine mode: X-Appengine-User-Ip: 0.1.0.2, no one signed in); {every}"
        )
    if seen.scheduler_job is None:
        if seen.status == 400:
            return (
                "keyed wrongly: the app answered 400: the delivery lacked or garbled X-CloudScheduler-JobName or "
                "X-CloudScheduler-ScheduleTime (a schedule in unix-cron sends both), or its scope"
            )
        return f"the app answered {seen.status} before keying the delivery (is {target.path} a job it declares?)"
    if seen.outcome == "job_mismatch":
        return (
            f"keyed under another job: the key of {job}'s delivery for {seen.schedule_time} belongs to a run "
            "of another job of the app (422 job_mismatch): two targets share a Scheduler job name and scope"
        )
    if seen.schedule_time is None or seen.run_id not in target.run_ids(seen.schedule_time):
        return (
            f"keyed wrongly: run {seen.run_id} is not the key of {job}'s delivery for {seen.schedule_time} "
            f"(from {target.relative_uri} and the job's headers)"
        )
    if seen.status >= 500:
        return f"delivered and keyed as it should be, but the run failed: {seen.status} {seen.outcome or ''}".strip()
    return None


class Smoke:
    """One forced delivery of a Scheduler job, read back from Cloud Logging."""

    def __init__(
        self,
        scheduler: GoogleApi,
        logging: GoogleApi,
        project: str,
        location: str,
        say: Callable[[str], None],
        warn: Callable[[str], None],
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.scheduler, self.logging = scheduler, logging
        self.project, self.location = project, location
        self.say, self.warn, self.clock, self.sleep = say, warn, clock, sleep

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    def named(self, job_id: str, timeout: float, poll: float) -> Seen:
        """Run an existing App Engine-target job."""
        job = self._call("GET", f"v1/{self.parent}/jobs/{job_id}", f"read the Scheduler job {job_id}")
        return self._run_and_read(Target.of(job), timeout, poll)

    def throwaway(self, target_job: str, lease_seconds: float, service: str, timeout: float, poll: float) -> Seen:
        """Create a job that calls /jobs/<target_job>, run it, and delete it whatever happens."""
        job = throwaway_job(self.project, self.location, service, target_job, lease_seconds, self.clock())
        created = self._call("POST", f"v1/{self.parent}/jobs", "create the throwaway Scheduler job", body=job)
        target = Target.of(created)
        self.say(f"created {target.name} ({target.method} {target.relative_uri} on {service}); deleted when done")
        try:
            seen = self._run_and_read(target, timeout, poll)
        except BaseException:
            self._delete(target, failing=True)
            raise
        self._delete(target, failing=False)
        return seen

    def _run_and_read(self, target: Target, timeout: float, poll: float) -> Seen:
        since = self.clock() - CLOCK_SKEW
        self._call("POST", f"v1/{target.name}:run", f"run {target.name}", body={})
        self.say(
            f"ran {target.name} (jobs.run): reading what the app saw of {target.method} {target.path} "
            f"in Cloud Logging, for up to {timeout:g}s"
        )
        seen = self._read(target, since, timeout, poll)
        for line in seen.lines(target):
            self.say(line)
        failure = judge(seen, target)
        if failure:
            raise SmokeFailure(failure)
        if seen.principal != SCHEDULER_PRINCIPAL:
            self.warn(f"note: admitted as {seen.principal}, not by Cloud Scheduler's marker ({SCHEDULER_PRINCIPAL})")
        self.say(f"ok: delivered, admitted as {seen.principal}, keyed on {target.job_id} and its schedule time")
        return seen

    def _read(self, target: Target, since: datetime.datetime, timeout: float, poll: float) -> Seen:
        query = log_filter(self.project, target, since)
        deadline = time.monotonic() + timeout
        seen: list[Seen] = []
        refusal_seen = False
        while True:
            seen = self._entries(query, target) or seen
            out_of_time = time.monotonic() >= deadline
            found = verdict(seen, target, settled=refusal_seen or out_of_time)
            if found is not None:
                return found
            if out_of_time:
                raise SmokeFailure(self._nothing(seen, target, timeout))
            refusal_seen = verdict(seen, target, settled=True) is not None
            self.sleep(max(0.0, min(poll, deadline - time.monotonic())))

    def _entries(self, query: str, target: Target) -> list[Seen] | None:
        """The requests on the target's path so far; None when Logging could not be read this time."""
        body: dict[str, Any] = {
            "resourceNames": [f"projects/{self.project}"],
            "filter": query,
            "orderBy": "timestamp asc",
            "pageSize": PAGE_SIZE,
        }
        found: list[Seen] = []
        while True:
            try:
                page = self.logging.call("POST", "v2/entries:list", body=body)
            except RetryableJobError as exc:  # quota (60 reads a minute), a blip: read again next time
                self.warn(f"Cloud Logging: {exc}; reading again")
                return None
            except PermanentJobError as exc:
                raise SmokeFailure(f"cannot read Cloud Logging (roles/logging.viewer): {exc}") from None
            found += [s for s in map(Seen.of, page.get("entries") or []) if s is not None and s.path == target.path]
            if not page.get("nextPageToken"):
                return found
            body["pageToken"] = page["nextPageToken"]

    def _nothing(self, seen: list[Seen], target: Target, timeout: float) -> str:
        others = sorted({s.scheduler_job for s in seen if s.from_app and s.scheduler_job})
        if others:
            return (
                f"keyed under another job: in {timeout:g}s the app saw deliveries on {target.path} keyed under "
                f"{', '.join(others)}, none under {target.job_id}"
            )
        front = [s for s in seen if not s.from_app]
        if front:
            return (
                f"App Engine logged {front[0].method} {target.relative_uri} ({front[0].status}), but no line of the "
                f"app's came in {timeout:g}s: does it log JSON (DEDUP_LOG_FORMAT, GAE_ENV)?"
            )
        return (
            f"no delivery of {target.job_id} reached {target.path} on {target.service} in {timeout:g}s: "
            f"see the job's last attempt (gcloud scheduler jobs describe {target.job_id} "
            f"--location={self.location} --project={self.project}) and the app's logs"
        )

    def _delete(self, target: Target, failing: bool) -> None:
        try:
            self._call("DELETE", f"v1/{target.name}", f"delete {target.name}")
        except SmokeFailure as exc:
            by_hand = shlex.join(
                [
                    *("gcloud", "scheduler", "jobs", "delete", target.job_id),
                    f"--location={self.location}",
                    f"--project={self.project}",
                ]
            )
            if not failing:
                raise SmokeFailure(f"{exc}; delete it: {by_hand}") from None
            self.warn(f"{exc}; delete it: {by_hand}")
            return
        self.say(f"deleted {target.name}")

    def _call(self, method: str, path: str, doing: str, body: Any = None) -> dict[str, Any]:
        try:
            return self.scheduler.call(method, path, body=body)
        except (PermanentJobError, RetryableJobError) as exc:
            raise SmokeFailure(f"Cloud Scheduler: could not {doing}: {exc}") from None
