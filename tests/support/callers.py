"""Apps behind each caller verification mode, a token issuer, and the check that a refusal wrote nothing."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import webtest

from handlers import create_app
from handlers.auth import AuthSettings
from models import RunRecord
from tests import job_targets
from tests.support.deliveries import JOBS
from tests.support.oidc import IapIssuer, TokenIssuer

AUDIENCE = "https://dedup.example.com/jobs"
CALLER = "scheduler-invoker@acme-prod.iam.gserviceaccount.com"
IAP_AUDIENCE = "/projects/123456789012/apps/acme-prod"
OPERATOR = "alice@example.com"
VIEWER = "bob@example.com"
ADMIN = {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": "carol@example.com"}


@pytest.fixture(scope="module")
def issuer():
    running = TokenIssuer()
    yield running
    running.close()


@pytest.fixture(scope="module")
def iap():
    running = IapIssuer()
    yield running
    running.close()


def iap_environ(iap, **extra):
    """The shipped pairing for people and scripts: App Engine's markers and IAP's assertion."""
    return {
        "DEDUP_AUTH": "appengine,iap",
        "DEDUP_IAP_AUDIENCE": IAP_AUDIENCE,
        "DEDUP_IAP_CERTS_URL": iap.certs_url,
        "DEDUP_OPERATORS": OPERATOR,
        **extra,
    }


def as_person(iap, email, **claims):
    """The header IAP adds for a request from ``email`` (a claim given as None is left out)."""
    assertion = iap.assertion(
        audience=IAP_AUDIENCE, email=email, extra=claims or None, drop=[k for k, v in claims.items() if v is None]
    )
    return {"X-Goog-IAP-JWT-Assertion": assertion}


# In-process tests play App Engine's front end: they send its markers themselves.
OFF_GAE = {"DEDUP_APPENGINE_OFF_GAE": "trust-forgeable-headers"}


def app_with(environ, datastore, ndb_client, jobs_file, clock):
    settings = AuthSettings.from_environ({**OFF_GAE, **environ})
    return webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=ndb_client, auth=settings))


@pytest.fixture
def appengine_app(datastore, ndb_client, jobs_file, clock):
    return app_with({"DEDUP_AUTH": "appengine"}, datastore, ndb_client, jobs_file, clock)


@pytest.fixture
def oidc_app(datastore, ndb_client, jobs_file, clock, issuer):
    return app_with(
        {
            "DEDUP_AUTH": "oidc",
            "DEDUP_OIDC_AUDIENCE": AUDIENCE,
            "DEDUP_OIDC_ALLOWED_EMAILS": f"{CALLER}, other@acme-prod.iam.gserviceaccount.com",
            "DEDUP_OIDC_CERTS_URL": issuer.certs_url,
        },
        datastore,
        ndb_client,
        jobs_file,
        clock,
    )


@pytest.fixture
def iap_app(datastore, ndb_client, jobs_file, clock, iap):
    return app_with(iap_environ(iap), datastore, ndb_client, jobs_file, clock)


def settle(app) -> list[int]:
    """Wait for the work the app dispatched (its in-process queue) to be done; what each task answered."""
    return app.app.extensions["dedup"].dispatcher.wait(30)


@contextlib.contextmanager
def held(app) -> Iterator[None]:
    """The in-process queue holds the tasks dispatched inside the block until it ends, as a queue
    whose workers are busy does: what is sent meanwhile (a double click) finds the work queued,
    not done, however fast the queue's threads are."""
    dispatcher = app.app.extensions["dedup"].dispatcher
    gate, attempt = threading.Event(), dispatcher._attempt
    dispatcher._attempt = lambda *args: (gate.wait(30), attempt(*args))
    try:
        yield
    finally:
        del dispatcher._attempt
        gate.set()


def without_retries(app) -> None:
    """The in-process queue answers each task once, as Cloud Tasks' first attempt does: what a
    released run leaves for the queue to retry stays to be seen (tests/test_dispatch.py retries)."""
    from dispatch.in_process import RetryParameters

    app.app.extensions["dedup"].dispatcher.retry = RetryParameters(task_retry_limit=0, task_age_limit=0)


def nothing_written(ndb_client):
    with ndb_client.context():
        return RunRecord.query().fetch() == [] and job_targets.EFFECTS == []


def slot_confirmation(app, page, schedule_time: str, headers=None):
    """The confirmation form of the run link a dashboard page shows for the slot at ``schedule_time``."""
    import urllib.parse

    link = next(
        a for a in page.html.select("a.run-slot, a#run-again") if schedule_time in urllib.parse.unquote(a["href"])
    )
    return app.get(link["href"], headers=headers or {}).forms["confirm"]
