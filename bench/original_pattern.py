"""The original design's plain pattern, kept as `make bench`'s baseline: two NDB transactions, no fast path.

A delivery claims its run in one transaction (read the record; a completed
run is replayed, a live lease refused, anything else claimed), runs the job,
and records the result in a second transaction that checks the attempt
fence.  Every answer, a duplicate's too, pays a transaction: a fresh run is
six sequential round trips, a completed duplicate three.  The app's ledger
(dedup/ledger.py) keeps these guarantees and more at five, and one or none.
"""

from __future__ import annotations

import datetime
import hashlib
import uuid

from flask import Flask, request
from google.cloud import ndb

from handlers import NdbContextMiddleware

LEASE = datetime.timedelta(minutes=10)


class OriginalRun(ndb.Model):
    """One execution, as the plain pattern records it."""

    status = ndb.StringProperty()  # in_progress | completed
    attempt_id = ndb.StringProperty()
    lease_expires = ndb.DateTimeProperty(tzinfo=datetime.UTC)
    result = ndb.JsonProperty()


def run_id_of(job_name: str, schedule_time: str) -> str:
    """The run's key: the Scheduler job name and the schedule time as delivered."""
    return hashlib.sha256(f"{len(job_name)}:{job_name}{schedule_time}".encode()).hexdigest()


def claim(run_id: str, attempt_id: str) -> OriginalRun | str:
    """``"claimed"``, ``"busy"`` (a live lease), or the completed record to replay."""

    def transaction() -> OriginalRun | str:
        now = datetime.datetime.now(datetime.UTC)
        record = OriginalRun.get_by_id(run_id)
        if record is not None and record.status == "completed":
            return record
        if record is not None and record.lease_expires > now:
            return "busy"
        OriginalRun(id=run_id, status="in_progress", attempt_id=attempt_id, lease_expires=now + LEASE).put()
        return "claimed"

    return ndb.transaction(transaction)


def finish(run_id: str, attempt_id: str, result: object) -> bool:
    """Record the result if this attempt still owns the run."""

    def transaction() -> bool:
        record = OriginalRun.get_by_id(run_id)
        if record is None or record.attempt_id != attempt_id or record.status != "in_progress":
            return False
        record.status, record.result = "completed", result
        record.put()
        return True

    return ndb.transaction(transaction)


def original_pattern_app(job, ndb_client: ndb.Client | None = None) -> Flask:
    """``POST /jobs/<any>`` runs ``job`` once per Scheduler job name and schedule time."""
    from jobs import RunContext

    app = Flask("original-pattern")

    @app.post("/jobs/<job_id>")
    def deliver(job_id: str):
        name = request.headers.get("X-CloudScheduler-JobName", "")
        schedule_time = request.headers.get("X-CloudScheduler-ScheduleTime", "")
        run_id = run_id_of(name, schedule_time)
        attempt_id = uuid.uuid4().hex
        claimed = claim(run_id, attempt_id)
        if claimed == "busy":
            return {"status": "in_progress"}, 409
        if isinstance(claimed, OriginalRun):
            return {"result": claimed.result, "duplicate": True}
        result = job.runner.run(RunContext(run_id, attempt_id, 1, job_id, name, None))
        if not finish(run_id, attempt_id, result):
            return {"status": "stale"}, 409
        return {"result": result, "duplicate": False}

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)  # type: ignore[method-assign]  # Flask's middleware hook, typed as a method
    return app


def served() -> Flask:
    """The plain pattern serving DEDUP_JOBS_FILE's ``noop`` job, for gunicorn
    (``bench.original_pattern:served()``): the memory benchmark runs it beside the app."""
    import os

    from jobs.config import load_jobs
    from settings import jobs_file

    return original_pattern_app(load_jobs(jobs_file(os.environ))["noop"])
