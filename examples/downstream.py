"""An example downstream service: "enforce idempotency at the most downstream service".

A CRM stand-in that an ``http`` job calls.  It takes the run key the job
forwards in ``Idempotency-Key`` and guards its mutating endpoint with the
same idempotency guard as the scheduler target, so each scheduled sync is
applied once even when the call reaches it several times: a takeover after
a lost lease, a retry after a timeout whose request had in fact arrived.

Serve it with ``gunicorn examples.downstream_main:app`` (``make run`` does,
on port 8081).
"""

from __future__ import annotations

import datetime

from flask import Flask, g, jsonify, request
from google.cloud import ndb

from dedup.adapters.flask_guard import Fingerprint, idempotent, install_guard, unscoped
from dedup.clock import Clock, SystemClock
from dedup.ledger import Ledger
from handlers import NdbContextMiddleware
from handlers.errors import register as register_error_handlers
from handlers.request_limits import limit_requests


class SyncBatch(ndb.Model):
    """One applied sync: what the service's (non-idempotent) change leaves behind."""

    idempotency_key = ndb.StringProperty()
    schedule_time = ndb.StringProperty()
    attempt = ndb.IntegerProperty()
    applied = ndb.DateTimeProperty(tzinfo=datetime.UTC)


class SyncCounter(ndb.Model):
    applied = ndb.IntegerProperty(default=0)


def create_downstream_app(clock: Clock | None = None, ndb_client: ndb.Client | None = None) -> Flask:
    clock = clock or SystemClock()
    app = Flask(__name__)
    install_guard(app, Ledger(clock))
    register_error_handlers(app)
    limit_requests(app)  # the guard reads the body: bound it, however it is sent

    @app.post("/hooks/sync")
    @idempotent(
        "crm-sync",
        # The fields that make two calls the same request.  The attempt
        # number and id differ between a first call and a takeover's, so
        # they stay out; so do manual-run parameters, which the scheduler
        # target has already matched against the key (minus the names its
        # job leaves out of the fingerprint, which may differ here).
        fingerprint=Fingerprint.fields("job_id", "schedule_time", "body"),
        # Its one caller is the dedup app, whose keys are run ids (SHA-256, one per run):
        # nothing to tell callers apart by, and nothing another caller could guess.
        scope=unscoped,
    )
    def apply_sync():
        payload = request.get_json(silent=True) or {}

        @ndb.transactional()
        def bump() -> int:
            counter = SyncCounter.get_by_id("total") or SyncCounter(id="total")
            counter.applied += 1
            counter.put()
            return counter.applied

        total = bump()
        SyncBatch(
            idempotency_key=g.idempotency.key,
            schedule_time=payload.get("schedule_time"),
            attempt=payload.get("attempt"),
            applied=clock.now(),
        ).put()
        return jsonify({"applied": True, "sync_number": total, "key": g.idempotency.key}), 201

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client or ndb.Client())  # type: ignore[method-assign]  # Flask's middleware hook, typed as a method
    return app
