"""Issue 37 §3: a worker binds the schedules before it serves, so no delivery waits for a fleet's.

gunicorn.conf.py's post_worker_init binds them in each worker (App Engine starts gunicorn in the
app's folder, where gunicorn reads that file); if Datastore cannot be reached then, the worker
starts all the same and the first request that needs them binds them.
"""

from __future__ import annotations

import logging
import textwrap

import pytest
from flask import Flask

from devtools.emulator import free_port
from devtools.gunicorn import GunicornServer
from devtools.rpc_counter import counting_client
from handlers import bind_schedules, create_app
from models.schedule_history import ScheduleHistory

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
"""
SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s}
jobs:
  invoice-hourly: {target: invoice, schedule: "0 * * * *"}
  invoice-nightly: {target: invoice, schedule: "0 2 * * *"}
"""
BOUND = {"acme-prod/us-central1/invoice-hourly", "acme-prod/us-central1/invoice-nightly"}


def files(tmp_path) -> str:
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    return str(tmp_path / "jobs.yaml")


@pytest.mark.live
def test_each_worker_binds_the_schedules_before_its_first_request(emulator, datastore, ndb_client, tmp_path):
    with GunicornServer(emulator, files(tmp_path), workers=2, quiet=True, extra_env={"DEDUP_AUTH": "none"}):
        # Served so far: the readiness probe only, a 404 of a job that does not exist.
        with ndb_client.context():
            recorded = {history.key.id() for history in ScheduleHistory.query().fetch()}
    assert recorded == BOUND


def test_binding_needs_the_app_and_says_when_it_bound(datastore, ndb_client, tmp_path):
    app = create_app(jobs_file=files(tmp_path), ndb_client=ndb_client)
    assert bind_schedules(app) is True
    with ndb_client.context():
        assert {history.key.id() for history in ScheduleHistory.query().fetch()} == BOUND
    assert bind_schedules(Flask("not-this-app")) is False  # a benchmark's app: nothing to bind


@pytest.mark.slow  # the history's write is tried for its patience (5 s) before the worker gives up
def test_a_worker_that_cannot_reach_datastore_starts_and_says_so(datastore, tmp_path, caplog):
    unreachable, _ = counting_client(datastore.project, f"127.0.0.1:{free_port()}")
    app = create_app(jobs_file=files(tmp_path), ndb_client=unreachable)
    with caplog.at_level(logging.WARNING, logger="service.state"):
        assert bind_schedules(app) is False
    assert "the first request binds them" in caplog.text


def test_a_worker_that_cannot_make_a_client_starts_and_says_so(datastore, ndb_client, tmp_path, caplog):
    """No credentials or no project: making the NDB client raises, and the worker starts all the same."""
    app = create_app(jobs_file=files(tmp_path), ndb_client=ndb_client)

    def no_client():
        raise RuntimeError("could not determine credentials")

    with caplog.at_level(logging.WARNING, logger="service.state"):
        assert app.extensions["dedup"].bind_schedules(no_client) is False
    assert "could not determine credentials" in caplog.text
