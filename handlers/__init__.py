"""The Flask application: configuration, jobs and blueprints, built once at start-up."""

from __future__ import annotations

import logging
import os
import threading

from flask import Flask, Response, g, request
from flask.json.provider import DefaultJSONProvider
from google.cloud import ndb

import settings as settings_module
from dedup import fence_probe
from dedup.adapters.flask_guard import install_guard
from dedup.clock import Clock, SystemClock
from dedup.finished_cache import FinishedRuns
from dedup.ledger import Ledger
from dispatch import Dispatcher
from dispatch.cloud_tasks import CloudTasksDispatcher
from dispatch.in_process import InProcessDispatcher
from handlers.access import needs_no_caller, role_of
from handlers.answers import note_outcome
from handlers.auth import Admission, AuthSettings, CallerGate
from handlers.problems import TYPES_BY_ERROR
from handlers.state import AppState, current_principal
from jobs.config import load_jobs
from schedules.config import SchedulerJob, load_app_schedules, scheduler_file_path
from schedules.history import TrackedSchedules
from schedules.scheduler_api import SchedulerApi
from settings import CACHE_SHARE_OF_MEMORY as CACHE_SHARE_OF_MEMORY
from settings import MAX_FINISHED_CACHE_ENTRIES as MAX_FINISHED_CACHE_ENTRIES
from settings import MAX_FINISHED_CACHE_MIB as MAX_FINISHED_CACHE_MIB
from settings import MAX_WAITERS_LIMIT as MAX_WAITERS_LIMIT
from settings import SettingError as SettingError
from settings import Settings


def create_app(
    jobs_file: str | None = None,
    clock: Clock | None = None,
    ndb_client: ndb.Client | None = None,
    auth: AuthSettings | None = None,
    max_waiters: int | None = None,
    scheduler_file: str | None = None,
    dispatcher: Dispatcher | None = None,
    settings: Settings | None = None,
) -> Flask:
    """Build the app; a bad jobs file or setting raises here, before serving.

    ``max_waiters`` bounds the requests of this process that wait at once
    (``Prefer: wait``); default DEDUP_MAX_WAITERS, else DEFAULT_MAX_WAITERS.
    ``scheduler_file``: the Scheduler jobs that target the app (default
    DEDUP_SCHEDULER_FILE, else the scheduler.yaml beside the jobs file; absent: none).
    ``dispatcher``: where work is dispatched (default: the Cloud Tasks queue DEDUP_TASKS_QUEUE
    names, else this process's threads, as under ``make run``).
    ``settings``: every setting (default: ``Settings.from_environ(os.environ)``, the one reading of
    the environment, here; a bad one raises ``SettingError``); the arguments above take precedence
    over them, as ``auth`` over the caller verification they hold.
    """
    from dedup.runner import WaitSlots
    from handlers import (
        admin,
        dashboard_actions,
        errors,
        executions,
        for_people,
        logs,
        metrics,
        problem_pages,
        problems,
        runs_api,
        schedule_actions,
        scheduler,
        tasks,
        tracing,
        warmup,
    )
    from handlers.cross_site import refuse_cross_site_requests
    from handlers.request_limits import limit_requests

    settings = settings or Settings.from_environ(os.environ)
    clock = clock or SystemClock()
    gate = CallerGate(auth or AuthSettings.from_settings(settings))
    tracing.configure_tracing(settings)
    metrics.configure_metrics(settings)
    jobs_path = jobs_file or settings.jobs_file
    jobs = load_jobs(jobs_path, settings.request_timeout)
    required = scheduler_file is not None or settings.scheduler_file is not None
    schedules = load_app_schedules(
        scheduler_file_path(scheduler_file or settings.scheduler_file, jobs_path), jobs, required
    )
    wait_slots = WaitSlots(max_waiters if max_waiters is not None else settings.max_waiters)
    app = Flask(__name__)
    assert isinstance(app.json, DefaultJSONProvider)  # Flask's own, which sorts keys unless told not to
    app.json.sort_keys = False
    finished = FinishedRuns(
        max_entries=settings.finished_cache_entries,
        max_bytes=settings.finished_cache_bytes,
    )
    ledger = Ledger(clock, finished)
    # Guarded keys are per principal: one caller never gets another's stored answer.
    install_guard(
        app,
        ledger,
        wait_slots,
        caller=lambda: current_principal().name,
        on_outcome=note_outcome,  # the request's log line names it
        problem_types=TYPES_BY_ERROR,  # the app's types beside the library's (a bad_request_error of its own)
    )
    scheduler_api = SchedulerApi(settings.scheduler_api_base)

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
        tracked_schedules=TrackedSchedules(schedules, clock, file_pause, app_jobs=jobs),
        scheduler_api=scheduler_api,
        dispatcher=dispatcher or CloudTasksDispatcher.from_settings(settings) or InProcessDispatcher(),
        project=settings.project,
        night=settings.night,
    )
    in_process = app.extensions["dedup"].dispatcher
    if isinstance(in_process, InProcessDispatcher):
        in_process.app = app
        if settings.on_app_engine:
            logging.getLogger(__name__).warning(
                "DEDUP_TASKS_QUEUE is unset: catch-up work runs on this instance's threads, where App Engine "
                "may stop it; set it to queue.yaml's queue (docs/schedules.md, Dispatched work)"
            )
    errors.register(app)
    for_people.install(app)
    tracing.install_tracing(app)  # first: every later step, and every log line, is inside the request's span
    logs.install_request_logging(app)
    metrics.install_metrics(app)  # the 409s, by the fields the request's log line names

    @app.before_request
    def verify_caller() -> Response | None:
        # The role is the view's own (@requires); a view without one is for internal callers only.
        # A request no route takes needs only a verified caller: routing answers it (404, 405).
        view = None if request.routing_exception is not None else app.view_functions.get(request.endpoint or "")
        if needs_no_caller(view) and not gate.loopback_rule.refuses(request.headers):
            return None  # /_ah/warmup: App Engine's, from an address no marker covers (handlers/warmup.py)
        needed = None if request.routing_exception is not None else role_of(view)
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
    app.register_blueprint(warmup.blueprint)
    # Flask's documented hook for WSGI middleware, typed as a method.
    contexts = NdbContextMiddleware(app.wsgi_app, ndb_client, settings.database)
    app.wsgi_app = contexts  # type: ignore[method-assign]
    # Whether the database refuses a stale version, proved once per process off the request path;
    # until it answers (and wherever it does not hold) fenced writes go through transactions.
    fence_probe.verify_in_background(lambda: contexts.client)
    return app


def bind_schedules(app: Flask) -> bool:
    """Bind ``app``'s schedules before it serves (gunicorn.conf.py's post_worker_init, in each
    worker): True when bound, False when Datastore could not be reached (the first request
    binds them then).  An app that is not this one (a benchmark's) has nothing to bind."""
    state = app.extensions.get("dedup") if isinstance(app, Flask) else None
    contexts = getattr(app, "wsgi_app", None)
    if not isinstance(state, AppState) or not isinstance(contexts, NdbContextMiddleware):
        return False
    return state.bind_schedules(lambda: contexts.client)  # made inside: no credentials stops no worker


def warm_worker(app: Flask) -> bool:
    """Do a worker's first-request work before it serves (gunicorn.conf.py's post_worker_init, after
    binding the schedules): True when warmed here.  Nothing stops a worker starting."""
    from handlers import warmup

    contexts = getattr(app, "wsgi_app", None)
    if not isinstance(app, Flask) or not isinstance(contexts, NdbContextMiddleware):
        return False
    try:
        client = contexts.client
    except Exception as exc:  # no credentials, no project: the first request finds out
        logging.getLogger(__name__).warning("this worker was not warmed: %r", exc)
        return False
    return warmup.warm(app, client) is not None


# The settings' rules are settings.py's; these names are kept for the callers that import them here.
whole_number_setting = settings_module.whole_number_setting
max_waiters_from_environ = settings_module.max_waiters
database_from_environ = settings_module.database_of
finished_cache_entries_from_environ = settings_module.finished_cache_entries
finished_cache_bytes_from_environ = settings_module.finished_cache_bytes


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
