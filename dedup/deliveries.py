"""Exactly-once for a handler the library does not host: one framework-free call per delivery.

    deliveries = Deliveries(job_id="report")
    status, headers, body = deliveries.answer(request_headers, work).wsgi()

``answer`` keys the delivery by its Cloud Scheduler headers (and the scope: the target's query,
the X-Scheduler-Project and -Location headers, or the settings' ``project`` and ``location``),
claims it, runs ``work(run)`` once, and answers as the exactly-once app does
(``dedup.answers``): 200 done or duplicate, 409 with Retry-After while another attempt holds a
live lease, 422 for a permanent failure, 500 after releasing a retryable one, never 503.
``work`` receives the ``ScheduledRun``: its ``run_id`` is the key to pass downstream.

With ``callers=Callers(...)`` (dedup.callers), a delivery must carry a Google-signed ID token
for the handler's audience from one of the allowed service accounts, as a Scheduler job's
``oidcToken`` makes it; with ``callers=AppEngineCallers()`` (dedup.app_engine_markers), on App
Engine, it must be one of App Engine's own requests, as an App Engine-target Scheduler job's is.
Else 401 or 403, and nothing is recorded.  Without, serve the handler only where the platform
checks the caller (Cloud Run's invoker IAM, ``login: admin``).

A request that is no Cloud Scheduler delivery is refused (400, ``InvalidRequest``) before
anything is recorded: App Engine cron requests carry no schedule time, so a retry could not
be told from a new execution (give the job to Cloud Scheduler instead); a Cloud Tasks task
without the Scheduler headers is told to carry them (the slot it runs), as the app's own tasks do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from google.cloud import ndb

from dedup import fence_probe
from dedup.answers import Answer, answer
from dedup.callers import CallerCheck, FoldedHeaders
from dedup.claims import RunDescription, RunPolicy
from dedup.clock import Clock, SystemClock
from dedup.environment import EnvironmentSettingError, delivery_settings, environment_database
from dedup.errors import InvalidRunRequest
from dedup.keys import LOCATION_ID, PROJECT_ID, ScheduledRunKey, ahead_of_its_time, scheduled_run_key
from dedup.ledger import Ledger
from dedup.outcomes import Attempt, RunOutcome
from dedup.problems import MEDIA_TYPE, problem_document
from dedup.run_record import RunSource
from dedup.runner import run_once
from dedup.signed_tokens import CertificatesUnavailable
from dedup.steps import Steps, TakesSteps


@dataclasses.dataclass(frozen=True)
class ScheduledRun(TakesSteps):
    """What the work is told of the execution it runs: its key (pass ``run_id`` downstream as the
    idempotency key) and which attempt this is (1, then 2 after a release or a takeover)."""

    run_id: str
    attempt: int
    scheduler_job: str
    schedule_time: datetime.datetime
    project: str
    location: str
    # A Force run (console, gcloud scheduler jobs run): keyed apart from the slot its time names.
    force_run: bool = False
    # The run's steps (``run.step(name, call)``, dedup.steps) as the runner's attempt runs them.
    _steps: Steps | None = dataclasses.field(default=None, repr=False, compare=False)

    def steps(self) -> Steps:
        """The run's steps as this attempt runs them; without a runner (a view called directly, as
        in a unit test), ones kept in memory from the first call."""
        if self._steps is None:
            object.__setattr__(self, "_steps", Steps(self.run_id, self.attempt, None, None, SystemClock().now))
        assert self._steps is not None
        return self._steps


MIN_LEASE_SECONDS = 1  # shorter, a lease is over before the attempt that holds it has started
MAX_RETENTION_SECONDS = 10 * 365 * 86400  # the app's bound on any time it keeps (jobs.base.MAX_SECONDS)


@dataclasses.dataclass(frozen=True)
class DeliverySettings:
    """How the deliveries of one job are claimed and remembered.

    ``lease_seconds``: how long an attempt holds the run before a retry may take it over (renewed
    every third of it while the work runs, with ``heartbeat``); at least the Scheduler job's
    attemptDeadline.  ``retention_seconds``: how long a finished run is remembered, so a late
    retry is answered from its record.  ``project`` and ``location``: the scope, where the
    deliveries name none (a Scheduler job's id is unique only in its project and location)."""

    lease_seconds: float = 600
    retention_seconds: float = 7 * 86400
    heartbeat: bool = True
    project: str | None = None
    location: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> DeliverySettings:
        """The settings the process's DEDUP_* variables set, the defaults elsewhere (dedup.environment)."""
        found = delivery_settings(environ)
        try:
            return cls(**found)
        except ValueError as exc:
            raise EnvironmentSettingError(f"{exc} (as the DEDUP_* environment variables set it)") from exc

    def __post_init__(self) -> None:
        if not MIN_LEASE_SECONDS <= self.lease_seconds <= self.retention_seconds <= MAX_RETENTION_SECONDS:
            raise ValueError(
                f"lease_seconds must be at least {MIN_LEASE_SECONDS} and at most retention_seconds, which is at "
                f"most {MAX_RETENTION_SECONDS} (a record's expiry must be a date Datastore holds)"
            )
        if self.project is not None and not PROJECT_ID.fullmatch(self.project):
            raise ValueError(f"project {self.project!r} is not a Google Cloud project id")
        if self.location is not None and not LOCATION_ID.fullmatch(self.location):
            raise ValueError(f"location {self.location!r} is not a Cloud Scheduler location")


class Deliveries:
    """The deliveries of ``job_id`` (the name its records carry, as a jobs.yaml job's): one per
    process, shared by its threads.  ``client``: the Datastore client (default: one for the
    project of the environment, and DEDUP_DATABASE's database)."""

    def __init__(
        self,
        job_id: str,
        settings: DeliverySettings | None = None,
        *,
        callers: CallerCheck | None = None,
        client: ndb.Client | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.job_id = job_id
        self.settings = settings or DeliverySettings.from_environment()
        self.callers = callers
        self._client = client
        self._made = threading.Lock()
        self.ledger = Ledger(clock or SystemClock())

    @property
    def client(self) -> ndb.Client:
        """The Datastore client, made at first use (importing a handler module needs no
        credentials).  Its database's fence is then checked on a thread of its own; until it
        answers, and for a client given to Deliveries (whose owner checks it, as the app does with
        ``dedup.fence_probe.verify_in_background``), every write takes the transactional path."""
        with self._made:
            if self._client is None:
                made = self._client = ndb.Client(database=environment_database())
                fence_probe.verify_in_background(lambda: made)
            return self._client

    def answer(
        self,
        headers: Mapping[str, str],
        work: Callable[[ScheduledRun], Any],
        query: Mapping[str, str | Sequence[str]] | None = None,
        at: str | None = None,
    ) -> Answer:
        """Run ``work`` once for the delivery ``headers`` name (``query``: the target URL's query
        parameters, each a value or every value it was given; ``at``: its path, a problem's
        ``instance``), and what to answer it.  The caller is checked before anything is read.  ``work``
        returns a JSON-serialisable result, raises ``dedup.errors.PermanentJobError`` when a retry
        cannot help, or raises anything else to be retried."""
        folded = FoldedHeaders(headers)
        header = folded.get
        refused = self._refusal(folded, at)
        if refused is not None:
            return refused
        try:
            key = delivery_key(header, query or {}, self.settings)
        except InvalidRunRequest as exc:
            document = problem_document(400, "InvalidRequest", exc.message, at=at, field=exc.field)
            return Answer(400, {}, document, MEDIA_TYPE)
        with self._context():
            key = self._force_run_or_slot(key)
            outcome = self._run(key, work)
        said = answer(outcome, at=at)
        return dataclasses.replace(said, headers={**said.headers, "X-Dedup-Run-Id": outcome.run_id})

    def _refusal(self, headers: FoldedHeaders, at: str | None) -> Answer | None:
        """The answer to a caller ``callers`` does not admit (401, 403), or to a delivery whose
        token cannot be checked now (500: Scheduler retries it; never 503); None to go on."""
        if self.callers is None:
            return None
        try:
            refused = self.callers.refusal(headers)
        except CertificatesUnavailable:
            detail = "the ID tokens' signing keys could not be fetched: send the delivery again"
            return Answer(500, {}, problem_document(500, "InternalError", detail, at=at), MEDIA_TYPE)
        if refused is None:
            return None
        status, error, reason = refused
        challenge = {"WWW-Authenticate": 'Bearer realm="dedup"'} if status == 401 else {}  # the app's realm
        return Answer(status, challenge, problem_document(status, error, reason, at=at), MEDIA_TYPE)

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        """The client's NDB context: the caller's where it has one of the same database, else a
        new one; refused where the caller's is of another project, database or namespace (the
        records would land there)."""
        current = ndb.get_context(raise_context_error=False)
        if current is None:
            with self.client.context():
                yield
            return
        theirs, ours = current.client, self.client
        where = ("project", "database")
        if any(getattr(theirs, name, None) != getattr(ours, name, None) for name in where) or (
            current.get_namespace() != ours.namespace
        ):
            raise RuntimeError(
                "Deliveries.answer was called inside an NDB context of another client (project, database "
                "or namespace): call it outside that context, or give Deliveries that client"
            )
        if current.in_transaction():
            raise RuntimeError("Deliveries.answer was called inside a transaction: its writes would wait on it")
        yield

    def _force_run_or_slot(self, key: ScheduledRunKey) -> ScheduledRunKey:
        """The key a delivery runs under: a Force run's apart from the slot its time names, as the
        app keys it (dedup.keys.ahead_of_its_time).  A delivery just before its time (within the
        skew) is a retry of the Force run that carried the time if that run is remembered."""
        now = self.ledger.clock.now()
        if ahead_of_its_time(key, now) is not None:
            return key.as_force_run()
        if now < key.schedule_time:
            forced = self.ledger.lookup(key.as_force_run().run_id)
            if forced is not None and not forced.is_expired(now):
                return key.as_force_run()
        return key

    def _run(self, key: ScheduledRunKey, work: Callable[[ScheduledRun], Any]) -> RunOutcome:
        description = RunDescription(
            source=RunSource.FORCE_RUN if key.force_run else RunSource.SCHEDULER,
            job_id=self.job_id,
            scheduler_job_name=key.scheduler_job_name,
            schedule_time=key.schedule_time,
            project=key.project or None,
            location=key.location or None,
        )
        policy = RunPolicy(
            lease_seconds=self.settings.lease_seconds,
            retention_seconds=self.settings.retention_seconds,
            heartbeat=self.settings.heartbeat,
        )

        def run(attempt: Attempt) -> Any:
            return work(
                ScheduledRun(
                    attempt.run_id,
                    attempt.number,
                    key.scheduler_job_name,
                    key.schedule_time,
                    key.project,
                    key.location,
                    key.force_run,
                    attempt.held.steps if attempt.held is not None else None,
                )
            )

        return run_once(self.ledger, key.run_id, description, policy, run)


# What marks a Cloud Tasks delivery (HTTP target, then App Engine target).
TASK_HEADERS = ("X-CloudTasks-TaskName", "X-AppEngine-TaskName")


def delivery_key(
    header: Callable[[str], str | None], query: Mapping[str, str | Sequence[str]], settings: DeliverySettings
) -> ScheduledRunKey:
    """The key of a Cloud Scheduler delivery; InvalidRunRequest (naming the field) for anything else,
    a scope named twice in the query among it (which one names it is anyone's guess)."""
    scope: dict[str, str] = {}
    for name in ("project", "location"):
        given = query.get(name)
        values = [given] if isinstance(given, str) or given is None else list(given)
        if len(values) > 1:
            raise InvalidRunRequest(name, f"query parameter {name} given more than once")
        if values and values[0] is not None:
            scope[name] = values[0]
    if header("X-CloudScheduler-JobName") is None and header("X-Appengine-Cron") is not None:
        raise InvalidRunRequest(
            "X-Appengine-Cron",
            "an App Engine cron request carries no schedule time, so a retry cannot be told from a new "
            "execution: schedule the handler with Cloud Scheduler (an App Engine or HTTP target) instead "
            "of cron.yaml",
        )
    task = next((name for name in TASK_HEADERS if header(name) is not None), None)
    if header("X-CloudScheduler-JobName") is None and task is not None:
        raise InvalidRunRequest(
            task,
            "a Cloud Tasks task is no Cloud Scheduler delivery: give the task the slot it runs, as the "
            "X-CloudScheduler-JobName and X-CloudScheduler-ScheduleTime headers (its retries keep them, so "
            "they run under one key), or key the handler by the task's name with the idempotency guard",
        )
    return scheduled_run_key(
        header("X-CloudScheduler-JobName"),
        header("X-CloudScheduler-ScheduleTime"),
        query_project=scope.get("project"),
        query_location=scope.get("location"),
        header_project=header("X-Scheduler-Project"),
        header_location=header("X-Scheduler-Location"),
        configured_project=settings.project,
        configured_location=settings.location,
    )
