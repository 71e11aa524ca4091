"""Caller verification: spoofable headers never grant access; App Engine markers and
Google-signed ID tokens do.  Every endpoint is covered; a rejected request writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from handlers.auth import AuthConfigError, AuthSettings
from tests.support.callers import (  # noqa: F401 - fixtures
    AUDIENCE,
    CALLER,
    app_with,
    appengine_app,
    issuer,
    nothing_written,
    oidc_app,
)
from tests.support.deliveries import scheduler_headers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENDPOINTS = [
    ("POST", "/jobs/invoice"),
    ("GET", "/jobs/invoice"),
    ("POST", "/api/v1/jobs/invoice/runs"),
    ("POST", "/jobs/unknown"),
    ("GET", "/no/such/page"),
    ("GET", "/api/v1/runs"),
    ("GET", "/api/v1/runs/" + "0" * 64),
    ("GET", "/tasks/cleanup"),
]


@pytest.mark.parametrize("method, path", ENDPOINTS)
def test_spoofed_scheduler_headers_are_rejected_in_appengine_mode(appengine_app, ndb_client, method, path):
    response = appengine_app.request(
        path,
        method=method,
        headers=scheduler_headers(**{"User-Agent": "AppEngine-Google; (+http://code.google.com/appengine)"}),
        status=403,
    )
    assert response.json["error"] == "Forbidden"
    assert nothing_written(ndb_client)


@pytest.mark.parametrize(
    "marker",
    [
        {"X-Appengine-Cron": "true"},
        {"x-appengine-cron": "TRUE"},
        {"X-AppEngine-QueueName": "__cron"},
        {"X-Appengine-User-Ip": "0.1.0.2"},
        {"X-Appengine-User-Ip": "0.1.0.1"},
    ],
)
def test_each_app_engine_marker_is_accepted(appengine_app, marker):
    # On App Engine only App Engine can set these (it strips client-sent ones); here the test sends them.
    appengine_app.post("/jobs/invoice", headers=scheduler_headers(**marker), status=200)


def test_the_admin_marker_counts_only_when_chosen(appengine_app, datastore, ndb_client, jobs_file, clock):
    # App Engine does not document stripping a client-sent X-Appengine-User-Is-Admin.
    appengine_app.post("/jobs/invoice", headers=scheduler_headers(**{"X-Appengine-User-Is-Admin": "1"}), status=403)
    opted_in = app_with(
        {"DEDUP_AUTH": "appengine", "DEDUP_APPENGINE_TRUSTED": "admin"}, datastore, ndb_client, jobs_file, clock
    )
    opted_in.post("/jobs/invoice", headers=scheduler_headers(**{"X-Appengine-User-Is-Admin": "1"}), status=200)


@pytest.mark.parametrize(
    "marker",
    [
        {"X-Appengine-Cron": "false"},
        {"X-Appengine-User-Is-Admin": "0"},
        {"X-Appengine-User-Ip": "10.0.0.1"},
        {"X-Appengine-User-Ip": "0.1.0.3"},
    ],
)
def test_near_misses_are_rejected(appengine_app, marker):
    appengine_app.post("/jobs/invoice", headers=scheduler_headers(**marker), status=403)


def test_the_trusted_marker_set_is_configurable(datastore, ndb_client, jobs_file, clock):
    app = app_with(
        {"DEDUP_AUTH": "appengine", "DEDUP_APPENGINE_TRUSTED": "cron, ip:0.1.0.2"},
        datastore,
        ndb_client,
        jobs_file,
        clock,
    )
    app.post("/jobs/invoice", headers=scheduler_headers(**{"X-Appengine-User-Ip": "0.1.0.2"}), status=200)
    app.post("/jobs/invoice", headers=scheduler_headers(**{"X-AppEngine-QueueName": "default"}), status=403)


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def test_a_valid_token_is_accepted_and_certificates_are_cached(oidc_app, issuer):
    before = issuer.fetches
    for _ in range(3):
        oidc_app.post(
            "/jobs/invoice",
            headers=scheduler_headers(**bearer(issuer.token(audience=AUDIENCE, email=CALLER))),
            status=200,
        )
    assert issuer.fetches - before <= 1


@pytest.mark.parametrize("method, path", ENDPOINTS)
def test_spoofed_headers_without_a_token_are_401_in_oidc_mode(oidc_app, ndb_client, method, path):
    response = oidc_app.request(
        path, method=method, headers=scheduler_headers(**{"X-Appengine-Cron": "true"}), status=401
    )
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert nothing_written(ndb_client)


@pytest.mark.parametrize(
    "case, words",
    [
        ("expired", "expired"),
        ("wrong-audience", "audience"),
        ("wrong-issuer", "issuer"),
        ("unverified-email", "not verified"),
        ("unlisted-email", "not an allowed caller"),
        ("bad-signature", "signature"),
        ("malformed", "malformed"),
        ("basic-auth", "Bearer"),
    ],
)
def test_bad_tokens_are_401_and_write_nothing(oidc_app, ndb_client, issuer, case, words):
    token = {
        "expired": lambda: issuer.token(audience=AUDIENCE, email=CALLER, issued_ago=7200, lifetime=3600),
        "wrong-audience": lambda: issuer.token(audience="https://elsewhere.example.com", email=CALLER),
        "wrong-issuer": lambda: issuer.token(audience=AUDIENCE, email=CALLER, issuer="https://evil.example.com"),
        "unverified-email": lambda: issuer.token(audience=AUDIENCE, email=CALLER, email_verified=False),
        "unlisted-email": lambda: issuer.token(audience=AUDIENCE, email="intruder@acme-prod.iam.gserviceaccount.com"),
        "bad-signature": lambda: issuer.token(audience=AUDIENCE, email=CALLER, rogue=True),
        "malformed": lambda: "not.a.jwt",
        "basic-auth": lambda: None,
    }[case]()
    headers = bearer(token) if token else {"Authorization": "Basic dXNlcjpwYXNz"}
    response = oidc_app.post("/jobs/invoice", headers=scheduler_headers(**headers), status=401)
    assert response.json["error"] == "Unauthenticated"
    assert words.lower() in response.json["message"].lower()
    assert AUDIENCE not in response.text and CALLER not in response.text  # nothing configured is echoed
    assert nothing_written(ndb_client)


@pytest.mark.parametrize(
    "environ, words",
    [
        ({}, "DEDUP_AUTH is not set"),
        ({"DEDUP_AUTH": "sometimes"}, "must be one of"),
        ({"DEDUP_AUTH": "none", "GAE_ENV": "standard"}, "refused on App Engine"),
        ({"DEDUP_AUTH": "oidc", "DEDUP_OIDC_ALLOWED_EMAILS": CALLER}, "DEDUP_OIDC_AUDIENCE"),
        ({"DEDUP_AUTH": "oidc", "DEDUP_OIDC_AUDIENCE": AUDIENCE}, "DEDUP_OIDC_ALLOWED_EMAILS"),
        ({"DEDUP_AUTH": "appengine", "DEDUP_APPENGINE_TRUSTED": "cron,everyone"}, "unknown"),
    ],
)
def test_bad_settings_stop_the_app(environ, words):
    with pytest.raises(AuthConfigError, match=words):
        AuthSettings.from_environ(environ)


def test_app_engine_defaults_to_appengine_mode():
    assert AuthSettings.from_environ({"GAE_ENV": "standard"}).mode == "appengine"


def test_the_app_refuses_none_on_app_engine_at_start_up():
    env = {**os.environ, "DEDUP_AUTH": "none", "GAE_ENV": "standard"}
    completed = subprocess.run(
        [sys.executable, "-c", "import main"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode != 0
    assert "DEDUP_AUTH=none is for local development; it is refused on App Engine" in completed.stderr


def test_signed_in_admins_may_read_but_not_run(appengine_app):
    admin = {"X-Appengine-User-Is-Admin": "1"}
    appengine_app.get("/admin/", headers=admin, status=200)
    appengine_app.get("/api/v1/runs", headers=admin, status=200)
    appengine_app.post("/jobs/invoice", headers=scheduler_headers(**admin), status=403)
    appengine_app.post_json("/api/v1/jobs/invoice/runs", {}, headers=admin, status=403)


def test_exactly_the_dashboard_and_the_run_api_reads_are_marked_read_only(appengine_app):
    from handlers.auth import is_read_only

    app = appengine_app.app
    marked = sorted(endpoint for endpoint, view in app.view_functions.items() if is_read_only(view))
    assert marked == ["admin.dashboard", "admin.run_page", "runs_api.get_run", "runs_api.list_runs"]
