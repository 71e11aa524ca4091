"""The Flask application: configuration, jobs and blueprints, built once at start-up."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping

from flask import Flask, Response, g, request
from flask.json.provider import DefaultJSONProvider
from google.cloud import ndb

from dedup import database, fence_probe
from dedup.clock import Clock, SystemClock
from dedup.finished_cache import FinishedRuns
from dedup.ledger import Ledger
from dispatch import Dispatcher
from dispatch.cloud_tasks import CloudTasksDispatcher
from dispatch.in_process import InProcessDispatcher
from handlers.access import role_of
from handlers.auth import Admission, AuthSettings, CallerGate
from handlers.idempotent import install_guard
from handlers.state import AppState, current_principal
from jobs.config import jobs_file_path, load_jobs
from schedules.config import SchedulerJob, load_app_schedules, scheduler_file_path
from schedules.history import TrackedSchedules
from schedules.scheduler_api import SchedulerApi


def create_app(
    jobs_file: str | None = None,
    clock: Clock | None = None,
    ndb_client: ndb.Client | None = None,
    auth: AuthSettings | None = None,
    max_waiters: int | None = None,
    scheduler_file: str | None = None,
    dispatcher: Dispatcher | None = None,
) -> Flask:
    """Build the app; a bad jobs file or setting raises here, before serving.

    ``max_waiters`` bounds the requests of this process that wait at once
    (``Prefer: wait``); default DEDUP_MAX_WAITERS, else DEFAULT_MAX_WAITERS.
    ``scheduler_file``: the Scheduler jobs that target the app (default
    DEDUP_SCHEDULER_FILE, else the scheduler.yaml beside the jobs file; absent: none).
    ``dispatcher``: where work is dispatched (default: the Cloud Tasks queue DEDUP_TASKS_QUEUE
    names, else this process's threads, as under ``make run``).
    """
    from dedup.runner import WaitSlots
    from handlers import (
        admin,
        dashboard_actions,
        errors,
        executions,
        for_people,
        logs,
        problem_pages,
        problems,
        runs_api,
        schedule_actions,
        scheduler,
        tasks,
        tracing,
    )
    from handlers.cross_site import refuse_cross_site_requests
    from handlers.request_limits import limit_requests

    clock = clock or SystemClock()
    gate = CallerGate(auth or AuthSettings.from_environ(os.environ))
    tracing.configure_tracing(os.environ)
    jobs_path = jobs_file or jobs_file_path(os.environ)
    jobs = load_jobs(jobs_path)
    required = scheduler_file is not None or bool(os.environ.get("DEDUP_SCHEDULER_FILE"))
    schedules = load_app_schedules(scheduler_file or scheduler_file_path(os.environ, jobs_path), jobs, required)
    wait_slots = WaitSlots(max_waiters if max_waiters is not None else max_waiters_from_environ(os.environ))
    app = Flask(__name__)
    assert isinstance(app.json, DefaultJSONProvider)  # Flask's own, which sorts keys unless told not to
    app.json.sort_keys = False
    finished = FinishedRuns(
        max_entries=finished_cache_entries_from_environ(os.environ),
        max_bytes=finished_cache_bytes_from_environ(os.environ),
    )
    ledger = Ledger(clock, finished)
    # Guarded keys are per principal: one caller never gets another's stored answer.
    install_guard(app, ledger, wait_slots, caller=lambda: current_principal().name)
    scheduler_api = SchedulerApi.from_environ(os.environ)

    def file_pause(job: SchedulerJob, pause: bool) -> None:
        """scheduler.yaml's paused, changed by this version: Cloud Scheduler made to match."""
        problem = scheduler_api.set_paused(job, pause)
        if problem:
            logging.getLogger(__name__).error("%s (scheduler.yaml's paused: %s)", problem, pause)

    app.extensions["dedup"] = AppState(
        jobs=jobs,
        clock=clock,
        ledger=ledger,
        wait_slots=wait_slots,
        tracked_schedules=TrackedSchedules(schedules, clock, file_pause),
        scheduler_api=scheduler_api,
        dispatcher=dispatcher or CloudTasksDispatcher.from_environ(os.environ) or InProcessDispatcher(),
    )
    in_process = app.extensions["dedup"].dispatcher
    if isinstance(in_process, InProcessDispatcher):
        in_process.app = app
        if os.environ.get("GAE_ENV") == "standard":
            logging.getLogger(__name__).warning(
                "DEDUP_TASKS_QUEUE is unset: catch-up work runs on this instance's threads, where App Engine "
                "may stop it; set it to queue.yaml's queue (docs/schedules.md, Dispatched work)"
            )
    errors.register(app)
    for_people.install(app)
    tracing.install_tracing(app)  # first: every later step, and every log line, is inside the request's span
    logs.install_request_logging(app)

    @app.before_request
    def verify_caller() -> Response | None:
        # The role is the view's own (@requires); a view without one is for internal callers only.
        # A request no route takes needs only a verified caller: routing answers it (404, 405).
        needed = (
            None if request.routing_exception is not None else role_of(app.view_functions.get(request.endpoint or ""))
        )
        admitted = gate.admit(request.headers, needed)
        if isinstance(admitted, Admission):
            g.principal, g.roles = admitted.principal, admitted.roles
            logs.note_run(principal=admitted.principal.name)
            return None
        if admitted.principal:
            logs.note_run(principal=admitted.principal)
        response = problems.problem(admitted.status, admitted.error, admitted.message)
        if admitted.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="dedup"'
        return response

    limit_requests(app)  # after verify_caller: a stranger learns only 401/403
    refuse_cross_site_requests(app)
    app.register_blueprint(scheduler.blueprint)
    app.register_blueprint(runs_api.blueprint)
    app.register_blueprint(executions.blueprint)
    app.register_blueprint(schedule_actions.blueprint)
    app.register_blueprint(tasks.blueprint)
    app.register_blueprint(admin.blueprint)
    app.register_blueprint(admin.home)
    app.register_blueprint(dashboard_actions.blueprint)
    app.register_blueprint(problem_pages.blueprint)
    # Flask's documented hook for WSGI middleware, typed as a method.
    contexts = NdbContextMiddleware(app.wsgi_app, ndb_client, database_from_environ(os.environ))
    app.wsgi_app = contexts  # type: ignore[method-assign]
    # Whether the database refuses a stale version, proved once per process off the request path;
    # until it answers (and wherever it does not hold) fenced writes go through transactions.
    fence_probe.verify_in_background(lambda: contexts.client)
    return app


MAX_WAITERS_LIMIT = 64


class SettingError(ValueError):
    """A bad DEDUP_* setting: the app refuses to start."""


def whole_number_setting(environ: Mapping[str, str], name: str, default: int, limit: int, zero_means: str) -> int:
    """A DEDUP_* setting that is a whole number from 0 to ``limit`` (unset: ``default``)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not re.fullmatch(r"[0-9]{1,7}", raw) or int(raw) > limit:
        raise SettingError(f"{name}={raw!r}: a whole number from 0 ({zero_means}) to {limit}")
    return int(raw)


def max_waiters_from_environ(environ: Mapping[str, str]) -> int:
    """DEDUP_MAX_WAITERS: keep it a small share of gunicorn's --threads."""
    from handlers.idempotent import DEFAULT_MAX_WAITERS

    return whole_number_setting(
        environ, "DEDUP_MAX_WAITERS", DEFAULT_MAX_WAITERS, MAX_WAITERS_LIMIT, "Prefer: wait is never honoured"
    )


def database_from_environ(environ: Mapping[str, str]) -> str | None:
    """DEDUP_DATABASE: the Datastore-mode database that holds the ledger (None: ``(default)``),
    by the rule the deploy CLI applies too (dedup/database.py)."""
    try:
        return database.client_database(environ)
    except database.DatabaseNameError as exc:
        raise SettingError(f"{database.SETTING}: {exc}") from None


MAX_FINISHED_CACHE_ENTRIES = 100_000
MAX_FINISHED_CACHE_MIB = 1024
# Of the instance's memory (App Engine's GAE_MEMORY_MB: 384 MB on an F1, 768 on an F2), what one
# worker's cache may take: a quarter, so app.yaml's two workers leave half for the requests.
CACHE_SHARE_OF_MEMORY = 4


def finished_cache_entries_from_environ(environ: Mapping[str, str]) -> int:
    """DEDUP_FINISHED_CACHE_ENTRIES: completed runs each process remembers."""
    from dedup.finished_cache import MAX_ENTRIES

    return whole_number_setting(
        environ, "DEDUP_FINISHED_CACHE_ENTRIES", MAX_ENTRIES, MAX_FINISHED_CACHE_ENTRIES, "no cache"
    )


def finished_cache_bytes_from_environ(environ: Mapping[str, str]) -> int:
    """DEDUP_FINISHED_CACHE_MIB: what each process's cache may hold, refused when it cannot fit the
    instance class (a quarter of GAE_MEMORY_MB, which App Engine sets to the class's memory)."""
    from dedup.finished_cache import MAX_BYTES

    mib = whole_number_setting(
        environ, "DEDUP_FINISHED_CACHE_MIB", MAX_BYTES // 2**20, MAX_FINISHED_CACHE_MIB, "no cache"
    )
    memory = environ.get("GAE_MEMORY_MB", "")
    if memory.isascii() and memory.isdigit() and mib * CACHE_SHARE_OF_MEMORY > int(memory):
        raise SettingError(
            f"DEDUP_FINISHED_CACHE_MIB={mib}: more than a quarter of this instance's {memory} MB "
            f"(GAE_MEMORY_MB) for one worker's cache; at most {int(memory) // CACHE_SHARE_OF_MEMORY}, "
            "or a larger instance_class in app.yaml"
        )
    return mib * 2**20


class NdbContextMiddleware:
    """Give every request its own NDB context (Google's documented pattern for Flask).

    The client is made on the first request, so building the app
    needs no credentials.
    """

    def __init__(self, wsgi_app, client: ndb.Client | None = None, database: str | None = None) -> None:
        """``database``: the Datastore-mode database the client made here uses (None: ``(default)``)."""
        self.wsgi_app = wsgi_app
        self._client = client
        self._database = database
        self._lock = threading.Lock()

    @property
    def client(self) -> ndb.Client:
        with self._lock:
            if self._client is None:
                self._client = ndb.Client(database=self._database)
            return self._client

    def __call__(self, environ, start_response):
        with self.client.context():
            return self.wsgi_app(environ, start_response)
