"""Caller verification: spoofable headers never grant access; App Engine markers and
Google-signed ID tokens do.  Every endpoint is covered; a rejected request writes nothing.
(Roles and IAP: tests/test_roles.py and tests/test_iap.py.)"""

from __future__ import annotations

import dataclasses
import hmac
import os
import subprocess
import sys
from typing import ClassVar

import pytest
import webtest

from dedup.signed_tokens import InvalidToken
from handlers import create_app
from handlers.access import Principal, Role
from handlers.auth import (
    MODES,
    VERIFIERS,
    Admission,
    AppEngineMarkers,
    AuthConfigError,
    AuthSettings,
    CallerGate,
    Rejection,
    Verifier,
    mode_names,
)
from settings import Settings
from tests.support.callers import (  # noqa: F401 - fixtures
    ADMIN,
    AUDIENCE,
    CALLER,
    OFF_GAE,
    app_with,
    appengine_app,
    issuer,
    nothing_written,
    oidc_app,
)
from tests.support.deliveries import JOBS, scheduler_headers

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
    ("GET", "/"),
]


@pytest.mark.parametrize("method, path", ENDPOINTS)
def test_spoofed_scheduler_headers_are_rejected_in_appengine_mode(appengine_app, ndb_client, method, path):
    response = appengine_app.request(
        path,
        method=method,
        headers=scheduler_headers(**{"User-Agent": "AppEngine-Google; (+http://code.google.com/appengine)"}),
        status=401,
    )
    assert response.json["error"] == "Unauthenticated"
    assert "X-CloudScheduler-* headers alone are not trusted" in response.json["message"]
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
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


def test_the_admin_marker_is_a_person_who_never_delivers(appengine_app, ndb_client):
    # A signed-in admin is a person: App Engine counts project Viewers as admins.
    response = appengine_app.post("/jobs/invoice", headers=scheduler_headers(**ADMIN), status=403)
    assert response.json["error"] == "Forbidden"
    assert "user:carol@example.com" in response.json["message"]
    assert nothing_written(ndb_client)


def test_the_admin_marker_counts_only_when_trusted(datastore, ndb_client, jobs_file, clock):
    # One rule for the admin marker: DEDUP_APPENGINE_TRUSTED says whether it names anyone, on every route.
    trusted = app_with({"DEDUP_AUTH": "appengine"}, datastore, ndb_client, jobs_file, clock)
    trusted.get("/admin/", headers=ADMIN, status=200)
    trusted.get("/api/v1/runs", headers=ADMIN, status=200)
    left_out = app_with(
        {"DEDUP_AUTH": "appengine", "DEDUP_APPENGINE_TRUSTED": "cron,queue,ip:0.1.0.2"},
        datastore,
        ndb_client,
        jobs_file,
        clock,
    )
    for path in ("/admin/", "/api/v1/runs", "/admin/runs/" + "0" * 64, "/api/v1/runs/" + "0" * 64):
        assert left_out.get(path, headers=ADMIN, status=401).json["error"] == "Unauthenticated"
    left_out.post("/jobs/invoice", headers=scheduler_headers(**{"X-Appengine-Cron": "true"}), status=200)


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Appengine-User-Is-Admin": "1"},  # no email: nobody to name
        {"X-Appengine-User-Is-Admin": "0", "X-Appengine-User-Email": "carol@example.com"},
        {"X-Appengine-User-Email": "carol@example.com"},
        {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": "not an email"},
        {"X-Appengine-User-Is-Admin": "true", "X-Appengine-User-Email": "carol@example.com"},
    ],
)
def test_a_signed_in_user_needs_both_markers(appengine_app, headers):
    appengine_app.get("/admin/", headers=headers, status=401)


@pytest.mark.parametrize(
    "marker",
    [
        {"X-Appengine-Cron": "false"},
        {"X-Appengine-User-Is-Admin": "0"},
        {"X-Appengine-User-Ip": "10.0.0.1"},
        {"X-Appengine-User-Ip": "0.1.0.3"},
    ],
)
def test_near_misses_are_rejected(appengine_app, ndb_client, marker):
    appengine_app.post("/jobs/invoice", headers=scheduler_headers(**marker), status=401)
    assert nothing_written(ndb_client)


def test_the_trusted_marker_set_is_configurable(datastore, ndb_client, jobs_file, clock):
    app = app_with(
        {"DEDUP_AUTH": "appengine", "DEDUP_APPENGINE_TRUSTED": "cron, ip:0.1.0.2"},
        datastore,
        ndb_client,
        jobs_file,
        clock,
    )
    app.post("/jobs/invoice", headers=scheduler_headers(**{"X-Appengine-User-Ip": "0.1.0.2"}), status=200)
    app.post("/jobs/invoice", headers=scheduler_headers(**{"X-AppEngine-QueueName": "default"}), status=401)
    app.get("/admin/", headers=ADMIN, status=401)  # admin left out too


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


def test_a_verified_but_unlisted_caller_is_403_and_writes_nothing(oidc_app, ndb_client, issuer):
    # Any Google account can mint a token for any audience: verified is not allowed.
    intruder = "intruder@acme-prod.iam.gserviceaccount.com"
    token = issuer.token(audience=AUDIENCE, email=intruder)
    response = oidc_app.post("/jobs/invoice", headers=scheduler_headers(**bearer(token)), status=403)
    assert response.json["error"] == "Forbidden"
    assert response.json["message"].startswith(f"serviceAccount:{intruder} may not do this")
    assert AUDIENCE not in response.text and CALLER not in response.text
    oidc_app.get("/api/v1/runs", headers=bearer(token), status=403)
    assert nothing_written(ndb_client)


@pytest.mark.parametrize(
    "environ, words",
    [
        ({}, "DEDUP_AUTH is not set"),
        ({"DEDUP_AUTH": "sometimes"}, "must be one of"),
        ({"DEDUP_AUTH": "appengine,sometimes"}, "must be one of"),
        ({"DEDUP_AUTH": "appengine,appengine"}, "names a mode twice"),
        ({"DEDUP_AUTH": "none,appengine"}, "combines with no other mode"),
        ({"DEDUP_AUTH": " , "}, "DEDUP_AUTH is not set"),
        ({"DEDUP_AUTH": "none", "GAE_ENV": "standard"}, "refused on App Engine"),
        ({"DEDUP_AUTH": "oidc", "DEDUP_OIDC_ALLOWED_EMAILS": CALLER}, "DEDUP_OIDC_AUDIENCE"),
        ({"DEDUP_AUTH": "oidc", "DEDUP_OIDC_AUDIENCE": AUDIENCE}, "DEDUP_OIDC_ALLOWED_EMAILS"),
        ({**OFF_GAE, "DEDUP_AUTH": "appengine", "DEDUP_APPENGINE_TRUSTED": "cron,everyone"}, "unknown"),
    ],
)
def test_bad_settings_stop_the_app(environ, words):
    with pytest.raises(AuthConfigError, match=words):
        AuthSettings.from_environ(environ)


def test_app_engine_defaults_to_appengine_mode():
    assert AuthSettings.from_environ({"GAE_ENV": "standard"}).mode == "appengine"


@pytest.mark.slow
def test_the_app_refuses_none_on_app_engine_at_start_up():
    env = {**os.environ, "DEDUP_AUTH": "none", "GAE_ENV": "standard"}
    completed = subprocess.run(
        [sys.executable, "-c", "import main"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode != 0
    assert "DEDUP_AUTH=none is for local development; it is refused on App Engine" in completed.stderr


def test_signed_in_admins_may_read_but_not_run(appengine_app, ndb_client):
    appengine_app.get("/admin/", headers=ADMIN, status=200)
    appengine_app.get("/api/v1/runs", headers=ADMIN, status=200)
    appengine_app.post("/jobs/invoice", headers=scheduler_headers(**ADMIN), status=403)
    refused = appengine_app.post_json("/api/v1/jobs/invoice/runs", {}, headers=ADMIN, status=403)
    assert "needs an operator (DEDUP_OPERATORS)" in refused.json["message"]
    assert nothing_written(ndb_client)


def test_the_root_sends_a_viewer_to_the_dashboard_and_refuses_the_rest(appengine_app, ndb_client):
    home = appengine_app.get("/", headers=ADMIN, status=302)
    assert home.headers["Location"] == "/admin/" and home.json["runs"] == "/api/v1/runs"
    assert home.follow(headers=ADMIN).status_code == 200
    # Cloud Scheduler aimed at / instead of /jobs/<job_id> is told it may not read runs.
    refused = appengine_app.get("/", headers=scheduler_headers(**{"X-Appengine-Cron": "true"}), status=403)
    assert "needs a viewer" in refused.json["message"]
    assert appengine_app.get("/", status=401).json["error"] == "Unauthenticated"
    assert nothing_written(ndb_client)


def test_every_route_declares_the_role_it_needs(appengine_app):
    from handlers.access import Role

    app = appengine_app.app
    declared = {
        endpoint: view.required_role.value
        for endpoint, view in app.view_functions.items()
        if endpoint != "static" and isinstance(getattr(view, "required_role", None), Role)
    }
    from handlers.access import needs_no_caller

    # None forgotten: every view declares a role, but for those open to anyone (tests/test_warmup.py).
    opened = sorted(e for e, view in app.view_functions.items() if needs_no_caller(view))
    assert opened == ["warmup.warmup"]
    assert sorted(declared) == sorted(e for e in app.view_functions if e not in ("static", *opened))
    assert declared == {
        "scheduler.deliver": "deliver",
        "tasks.cleanup_expired_runs": "deliver",
        "tasks.audit_missed_executions": "deliver",
        "tasks.run_dispatched_slot": "deliver",
        "tasks.run_dispatched_manual_run": "deliver",
        "tasks.audit_dispatched_share": "deliver",
        "admin.history": "view",
        "admin.search": "view",
        "runs_api.start_manual_run": "operate",
        "runs_api.list_runs": "view",
        "runs_api.get_run": "view",
        "runs_api.settle_run_step": "operate",
        "dashboard_actions.settle_run_step": "operate",
        "runs_api.openapi_description": "view",
        "runs_api.status": "view",
        "home.index": "view",
        "admin.dashboard": "view",
        "admin.run_page": "view",
        "dashboard_actions.run_now": "operate",
        "dashboard_actions.retry_run": "operate",
        "executions.list_executions": "view",
        "executions.run_slot": "operate",
        "schedule_actions.list_scheduler_jobs": "view",
        "schedule_actions.pause_scheduler_job": "operate",
        "schedule_actions.resume_scheduler_job": "operate",
        "dashboard_actions.run_slot": "operate",
        "dashboard_actions.confirm_run_slot": "operate",
        "dashboard_actions.confirm_run_now": "operate",
        "dashboard_actions.confirm_retry": "operate",
        "dashboard_actions.confirm_bulk_run": "operate",
        "dashboard_actions.bulk_run": "operate",
        "dashboard_actions.confirm_pause": "operate",
        "dashboard_actions.confirm_resume": "operate",
        "dashboard_actions.pause_scheduler_job": "operate",
        "dashboard_actions.resume_scheduler_job": "operate",
        "problem_pages.problem_type_page": "view",
    }


@dataclasses.dataclass(frozen=True)
class KeySettings(Settings):
    """The settings with the made-up mode's variable: a new mode's is a field of ``Settings``
    (settings.py), read in ``Settings.from_environ``."""

    test_key: str = dataclasses.field(default="", metadata={"variable": "DEDUP_TEST_KEY"})

    @classmethod
    def from_environ(cls, environ):
        return dataclasses.replace(super().from_environ(environ), test_key=environ.get("DEDUP_TEST_KEY", ""))


def key_settings(environ, registry):
    return AuthSettings.from_settings(KeySettings.from_environ(environ), registry)


@dataclasses.dataclass(frozen=True)
class SharedKey(Verifier):
    """``key``, a made-up mode: all a new mode is (its own module in handlers/auth/, its variable in
    settings.py, and a line in VERIFIERS)."""

    mode: ClassVar[str] = "key"
    key: str = ""

    @classmethod
    def from_settings(cls, settings, selection):
        if not getattr(settings, "test_key", ""):
            raise AuthConfigError("DEDUP_AUTH=key needs DEDUP_TEST_KEY")
        return cls(key=settings.test_key)

    @property
    def wanted(self):
        return "an X-Test-Key header"

    def identify(self, headers):
        sent = headers.get("X-Test-Key")
        if sent is None:
            return None
        if not hmac.compare_digest(sent.encode(), self.key.encode()):
            raise InvalidToken("the key does not match")
        return Principal(name="key:ci", granted=frozenset({Role.DELIVER}))


def test_a_new_mode_is_one_class_its_variables_and_one_registration_line(datastore, ndb_client, jobs_file, clock):
    registry = (*VERIFIERS, SharedKey)  # the registration line
    assert mode_names(registry) == (*MODES, "key")
    with pytest.raises(AuthConfigError, match="must be one of appengine, iap, oidc, none$"):
        AuthSettings.from_environ({"DEDUP_AUTH": "key"})  # not in the shipped registry
    with pytest.raises(AuthConfigError, match="must be one of appengine, iap, oidc, none, key$"):
        key_settings({"DEDUP_AUTH": "kee"}, registry)
    with pytest.raises(AuthConfigError, match="needs DEDUP_TEST_KEY"):
        key_settings({"DEDUP_AUTH": "key"}, registry)  # the mode checks its own settings
    environ = {**OFF_GAE, "DEDUP_AUTH": "appengine,key", "DEDUP_TEST_KEY": "s3cret"}
    settings = key_settings(environ, registry)
    assert settings.mode == "appengine,key" and settings.verifier(SharedKey).key == "s3cret"
    app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=ndb_client, auth=settings))
    app.post("/jobs/invoice", headers=scheduler_headers(**{"X-Test-Key": "s3cret"}), status=200)
    wrong = app.post("/jobs/invoice", headers=scheduler_headers(**{"X-Test-Key": "guess"}), status=401)
    assert wrong.json["message"] == "the key does not match"
    unsigned = app.post("/jobs/invoice", headers=scheduler_headers(), status=401)
    assert unsigned.json["message"].endswith(
        "or an X-Test-Key header (X-CloudScheduler-* headers alone are not trusted)"
    )


def test_what_a_mode_supersedes_is_data_on_its_class():
    """The gate names no mode: iap's precedence over App Engine's signed-in admin is a declaration any mode can make."""

    @dataclasses.dataclass(frozen=True)
    class FrontKey(SharedKey):
        mode: ClassVar[str] = "front"
        supersedes_people_of: ClassVar[frozenset[str]] = frozenset({"appengine"})

    def settings(verifier, **environ):
        environ = {**OFF_GAE, "DEDUP_AUTH": f"appengine,{verifier.mode}", "DEDUP_TEST_KEY": "s3cret", **environ}
        return key_settings(environ, (*VERIFIERS, verifier))

    admin_and_key = {**ADMIN, "X-Test-Key": "s3cret", "Host": "localhost"}
    beside = CallerGate(settings(SharedKey)).admit(admin_and_key, Role.VIEW)
    assert isinstance(beside, Admission) and beside.principal.name == "user:carol@example.com"
    # Beside the superseding mode the admin is no one: only key:ci, which may not view.
    superseded = CallerGate(settings(FrontKey, DEDUP_APPENGINE_TRUSTED="admin")).admit(admin_and_key, Role.VIEW)
    assert isinstance(superseded, Rejection) and (superseded.status, superseded.principal) == (403, "key:ci")
    # And by default the superseded admin marker is not trusted, as behind IAP.
    assert "admin" in settings(SharedKey).verifier(AppEngineMarkers).trusted_markers
    assert "admin" not in settings(FrontKey).verifier(AppEngineMarkers).trusted_markers
    with pytest.raises(AuthConfigError, match="registered twice"):
        mode_names((*VERIFIERS, SharedKey, SharedKey))


def test_an_oidc_mode_built_without_an_audience_fails_no_request_and_admits_no_token():
    """from_settings refuses an empty audience; the keyword form may build one: it then names no
    caller without a token and refuses any token, as a 401, never a 500."""
    from handlers.auth.oidc import GoogleIdTokens

    verifier = GoogleIdTokens(allowed_emails=frozenset({CALLER}))
    assert verifier.identify({}) is None
    with pytest.raises(InvalidToken):
        verifier.identify({"Authorization": "Bearer a.b.c"})
