"""The Flask application: configuration, jobs and blueprints, built once at start-up."""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from flask import Flask, current_app
from google.cloud import ndb

from dedup.clock import Clock, SystemClock
from dedup.ledger import Ledger
from jobs.config import JobSpec, jobs_file_path, load_jobs

# Larger bodies than Cloud Scheduler can send are refused with 413 unread.
MAX_BODY_BYTES = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class AppState:
    jobs: Mapping[str, JobSpec]
    ledger: Ledger
    clock: Clock


def create_app(
    jobs_file: str | None = None,
    clock: Clock | None = None,
    ndb_client: ndb.Client | None = None,
) -> Flask:
    """Build the app; a bad jobs file raises JobsConfigError here, before serving."""
    from handlers import errors, runs_api, scheduler
    from handlers.guard import LEDGER_EXTENSION

    clock = clock or SystemClock()
    jobs = load_jobs(jobs_file or jobs_file_path(os.environ))
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.json.sort_keys = False
    ledger = Ledger(clock)
    app.extensions["dedup"] = AppState(jobs=jobs, ledger=ledger, clock=clock)
    app.extensions[LEDGER_EXTENSION] = ledger  # the guard's ledger: one ledger for everything
    errors.register(app)
    app.register_blueprint(scheduler.blueprint)
    app.register_blueprint(runs_api.blueprint)
    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client or ndb.Client())
    return app


def app_state() -> AppState:
    return current_app.extensions["dedup"]


class NdbContextMiddleware:
    """Give every request its own NDB context (Google's documented pattern for Flask)."""

    def __init__(self, wsgi_app, client: ndb.Client) -> None:
        self.wsgi_app = wsgi_app
        self.client = client

    def __call__(self, environ, start_response):
        with self.client.context():
            return self.wsgi_app(environ, start_response)
