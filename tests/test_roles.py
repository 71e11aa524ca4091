"""Principals and roles: who may deliver, view and operate, with the defaults said and tested.

The defaults: internal callers (App Engine's markers, DEDUP_OIDC_ALLOWED_EMAILS) deliver
and nothing else; every person a Google front end admitted (a signed-in admin, an IAP
identity) views while DEDUP_VIEWERS is unset; only DEDUP_OPERATORS operate.  A refusal
for want of a role is a 403 that writes nothing.
"""

from __future__ import annotations

import logging

import pytest

from dedup.callers import normal_email
from handlers.access import AccessPolicy, Member, Principal, Role
from handlers.auth import AppEngineMarkers, AuthConfigError, AuthSettings, IapAssertions
from tests import job_targets
from tests.support.callers import (  # noqa: F401 - fixtures
    ADMIN,
    AUDIENCE,
    CALLER,
    OFF_GAE,
    OPERATOR,
    VIEWER,
    app_with,
    as_person,
    iap,
    iap_app,
    iap_environ,
    issuer,
    nothing_written,
    oidc_app,
)
from tests.support.deliveries import scheduler_headers
from tests.support.manual_runs import start
from tests.support.problems import code_and_message

READS = ["/admin/", "/api/v1/runs", "/api/v1/runs/" + "0" * 64, "/admin/runs/" + "0" * 64]


def person(email: str, *, admitted: bool = True, hosted_domain: str = "") -> Principal:
    return Principal.person(email, admitted=admitted, hosted_domain=hosted_domain)


def test_an_operator_starts_reads_and_is_named_on_the_record(iap_app, iap, caplog):
    caplog.set_level(logging.INFO, logger="dedup.requests")
    created = start(iap_app, headers=as_person(iap, OPERATOR), status=201).json
    assert created["requested_by"] == "user:alice@example.com"
    shown = iap_app.get(f"/api/v1/runs/{created['run_id']}", headers=as_person(iap, OPERATOR), status=200).json
    assert shown["requested_by"] == "user:alice@example.com"
    assert shown["attempts"][0]["requested_by"] == "user:alice@example.com"
    listed = iap_app.get("/api/v1/runs", headers=as_person(iap, VIEWER), status=200).json["runs"]
    assert [run["requested_by"] for run in listed] == ["user:alice@example.com"]
    page = iap_app.get(f"/admin/runs/{created['run_id']}", headers=as_person(iap, VIEWER), status=200)
    assert "user:alice@example.com" in page.text
    logged = [r for r in caplog.records if getattr(r, "path", "").endswith("/runs") and r.status == 201]
    assert [r.principal for r in logged] == ["user:alice@example.com"]


def test_a_viewer_reads_but_cannot_act(iap_app, iap, ndb_client):
    for path in READS[:2]:
        iap_app.get(path, headers=as_person(iap, VIEWER), status=200)
    refused = start(iap_app, headers=as_person(iap, VIEWER), status=403)
    assert code_and_message(refused.json) == {
        "error": "Forbidden",
        "message": "user:bob@example.com may not do this: "
        "starting and retrying runs needs an operator (DEDUP_OPERATORS)",
    }
    assert nothing_written(ndb_client)


def test_a_scheduled_delivery_names_its_internal_caller(iap_app, iap):
    iap_app.post("/jobs/invoice", headers=scheduler_headers(**{"X-Appengine-User-Ip": "0.1.0.2"}), status=200)
    runs = iap_app.get("/api/v1/runs", headers=as_person(iap, VIEWER), status=200).json["runs"]
    assert [run["requested_by"] for run in runs] == ["appengine:ip:0.1.0.2"]


def test_internal_callers_deliver_and_do_nothing_else(iap_app, ndb_client):
    cron = {"X-Appengine-Cron": "true"}
    for path in READS[:2]:
        assert iap_app.get(path, headers=cron, status=403).json["message"].startswith("appengine:cron may not")
    start(iap_app, headers=cron, status=403)
    assert nothing_written(ndb_client)


def test_admins_are_not_operators_unless_listed(datastore, ndb_client, jobs_file, clock, iap):
    plain = app_with({"DEDUP_AUTH": "appengine"}, datastore, ndb_client, jobs_file, clock)
    start(plain, headers=ADMIN, status=403)
    listed = app_with(
        {"DEDUP_AUTH": "appengine", "DEDUP_OPERATORS": "carol@example.com"}, datastore, ndb_client, jobs_file, clock
    )
    assert start(listed, headers=ADMIN, status=201).json["requested_by"] == "user:carol@example.com"


def test_setting_viewers_limits_who_reads(datastore, ndb_client, jobs_file, clock, iap):
    app = app_with(iap_environ(iap, DEDUP_VIEWERS="domain:example.org"), datastore, ndb_client, jobs_file, clock)
    for path in READS:
        refused = app.get(path, headers=as_person(iap, VIEWER), status=403)
        assert "needs a viewer or an operator" in refused.json["message"]
        app.get(path, headers=ADMIN, status=401)  # behind IAP the unsigned admin headers name no one
    app.get("/api/v1/runs", headers=as_person(iap, "dan@example.org"), status=200)
    app.get("/api/v1/runs", headers=as_person(iap, OPERATOR), status=200)  # operators always read


def test_an_empty_viewer_list_leaves_only_operators(datastore, ndb_client, jobs_file, clock, iap):
    app = app_with(iap_environ(iap, DEDUP_VIEWERS=""), datastore, ndb_client, jobs_file, clock)
    app.get("/api/v1/runs", headers=as_person(iap, VIEWER), status=403)
    app.get("/api/v1/runs", headers=as_person(iap, OPERATOR), status=200)


def test_an_oidc_caller_delivers_and_operates_only_when_listed(datastore, ndb_client, jobs_file, clock, issuer):
    script = "ci@acme-prod.iam.gserviceaccount.com"
    environ = {
        "DEDUP_AUTH": "oidc",
        "DEDUP_OIDC_AUDIENCE": AUDIENCE,
        "DEDUP_OIDC_ALLOWED_EMAILS": CALLER,
        "DEDUP_OIDC_CERTS_URL": issuer.certs_url,
        "DEDUP_OPERATORS": f"serviceAccount:{script}",
    }
    app = app_with(environ, datastore, ndb_client, jobs_file, clock)

    def bearer(email):
        return {"Authorization": f"Bearer {issuer.token(audience=AUDIENCE, email=email)}"}

    app.post("/jobs/invoice", headers=scheduler_headers(**bearer(CALLER)), status=200)
    app.get("/api/v1/runs", headers=bearer(CALLER), status=403)  # a token is never "admitted"
    start(app, headers=bearer(CALLER), status=403)
    assert start(app, headers=bearer(script), status=201).json["requested_by"] == f"serviceAccount:{script}"
    app.post("/jobs/invoice", headers=scheduler_headers(**bearer(script)), status=403)


def test_local_development_grants_everything(datastore, ndb_client, jobs_file, clock):
    app = app_with({"DEDUP_AUTH": "none"}, datastore, ndb_client, jobs_file, clock)
    assert start(app, status=201).json["requested_by"] == "local"
    app.get("/admin/", status=200)


@pytest.mark.parametrize(
    "entry, email, matches",
    [
        ("alice@example.com", "alice@example.com", True),
        ("Alice@Example.COM", "alice@example.com", True),
        ("alice@example.com", "alice@example.com.evil.test", False),
        ("alice@example.com", "malice@example.com", False),
        ("user:alice@example.com", "alice@example.com", True),
        ("user:alice@example.com", "bob@example.com", False),
        ("serviceAccount:ci@p.iam.gserviceaccount.com", "ci@p.iam.gserviceaccount.com", True),
        ("ci@p.iam.gserviceaccount.com", "ci@p.iam.gserviceaccount.com", True),
    ],
)
def test_members_match_as_iam_writes_them(entry, email, matches):
    assert Member.parse(entry, "DEDUP_OPERATORS").matches(person(email)) is matches


@pytest.mark.parametrize(
    "hosted_domain, email, matches",
    [
        ("example.com", "bob@example.com", True),
        ("example.com", "bob@example-alias.com", True),  # a secondary domain of the same Workspace
        ("", "bob@example.com", False),  # a consumer account at that address: no hd, not the domain
        ("sub.example.com", "bob@sub.example.com", False),
        ("evilexample.com", "bob@evilexample.com", False),
        ("example.com.evil.test", "bob@example.com", False),
    ],
)
def test_domain_members_match_the_hosted_domain_a_token_vouches_for(hosted_domain, email, matches):
    principal = person(email, hosted_domain=hosted_domain)
    assert Member.parse("domain:example.com", "DEDUP_OPERATORS").matches(principal) is matches


def test_a_consumer_account_at_the_domain_is_not_the_domain(datastore, ndb_client, jobs_file, clock, issuer, iap):
    app = app_with(iap_environ(iap, DEDUP_OPERATORS="domain:example.com"), datastore, ndb_client, jobs_file, clock)
    start(app, headers=as_person(iap, "mallory@example.com", hd=None), status=403)
    start(app, headers=as_person(iap, "dan@example.com"), token="t2", status=201)  # hd: example.com
    app.get("/admin/", headers={"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": "dan@example.com"},
            status=401)  # behind IAP the unsigned header alone is no one  # fmt: skip
    oidc = {
        "DEDUP_AUTH": "oidc",
        "DEDUP_OIDC_AUDIENCE": AUDIENCE,
        "DEDUP_OIDC_ALLOWED_EMAILS": CALLER,
        "DEDUP_OIDC_CERTS_URL": issuer.certs_url,
        "DEDUP_OPERATORS": "domain:example.com",
    }
    by_token = app_with(oidc, datastore, ndb_client, jobs_file, clock)
    token = issuer.token(audience=AUDIENCE, email="mallory@example.com")  # no hd claim
    start(by_token, headers={"Authorization": f"Bearer {token}"}, token="t3", status=403)
    signed = issuer.token(audience=AUDIENCE, email="dan@example.com", extra={"hd": "example.com"})
    start(by_token, headers={"Authorization": f"Bearer {signed}"}, token="t4", status=201)


def test_unsigned_admin_headers_never_add_to_an_iap_identity(iap_app, iap, ndb_client):
    forged = {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": OPERATOR}
    refused = start(iap_app, headers={**as_person(iap, VIEWER), **forged}, status=403)
    assert refused.json["message"].startswith("user:bob@example.com may not do this")
    assert start(iap_app, headers={"X-Goog-IAP-JWT-Assertion": "a.b.c", **forged}, status=401)
    assert start(iap_app, headers=forged, status=401)  # the admin marker is off by default behind IAP
    assert nothing_written(ndb_client)


def test_two_credentials_naming_two_people_are_refused(datastore, ndb_client, jobs_file, clock, iap, issuer):
    environ = {
        **iap_environ(iap),
        "DEDUP_AUTH": "iap,oidc",
        "DEDUP_OIDC_AUDIENCE": AUDIENCE,
        "DEDUP_OIDC_ALLOWED_EMAILS": CALLER,
        "DEDUP_OIDC_CERTS_URL": issuer.certs_url,
    }
    app = app_with(environ, datastore, ndb_client, jobs_file, clock)
    other = {"Authorization": f"Bearer {issuer.token(audience=AUDIENCE, email=VIEWER)}"}
    refused = start(app, headers={**as_person(iap, OPERATOR), **other}, status=401)
    assert refused.json["message"] == "the credentials name different people"
    # A script's own token for IAP (another audience) beside IAP's assertion is ignored.
    for_iap = {"Authorization": f"Bearer {issuer.token(audience='123-abc.apps.googleusercontent.com', email=OPERATOR)}"}
    start(app, headers={**as_person(iap, OPERATOR), **for_iap}, status=201)
    start(app, headers=for_iap, token="t2", status=401)  # without IAP's assertion it is just a bad token
    assert len(job_targets.EFFECTS) == 1


def test_a_route_that_does_not_exist_is_404_for_any_verified_caller(iap_app, iap):
    iap_app.get("/admin/nope", headers=as_person(iap, VIEWER), status=404)
    iap_app.post("/admin/search", headers=as_person(iap, OPERATOR), status=405)
    iap_app.get("/admin/nope", status=401)  # but only for a verified one


def test_a_refused_principal_is_logged(iap_app, iap, caplog):
    caplog.set_level(logging.INFO, logger="dedup.requests")
    start(iap_app, headers=as_person(iap, VIEWER), status=403)
    assert [r.principal for r in caplog.records if getattr(r, "status", None) == 403] == ["user:bob@example.com"]


@pytest.mark.parametrize("email", ["\u212aate@example.com", "al\u0131ce@example.com", "alice@ex\u00e4mple.com"])
def test_non_ascii_emails_name_nobody(email):
    assert normal_email(email.encode().decode("unicode_escape")) is None


def test_user_and_service_account_members_never_match_the_other_kind():
    sa = "ci@p.iam.gserviceaccount.com"
    assert not Member("user", sa).matches(person(sa))
    assert not Member("serviceAccount", "alice@example.com").matches(person("alice@example.com"))


@pytest.mark.parametrize(
    "raw, words",
    [
        ("alice", "does not hold an email"),
        ("alice@", "does not hold an email"),
        ("@example.com", "does not hold an email"),
        ("alice@example", "does not hold an email"),
        ("alice @example.com", "does not hold an email"),
        ("alice@exa mple.com", "does not hold an email"),
        ("alice@example.com\n", None),  # surrounding whitespace is trimmed, like the commas' spaces
        ("alice\x00@example.com", "does not hold an email"),
        ("group:ops@example.com", "write EMAIL, user:EMAIL"),
        ("allUsers", "does not hold an email"),
        ("domain:", "domain:DOMAIN"),
        ("domain:*.example.com", "domain:DOMAIN"),
        ("domain:example", "domain:DOMAIN"),
        ("serviceAccount:alice@example.com", "ends with .gserviceaccount.com"),
        ("user:ci@p.iam.gserviceaccount.com", "write serviceAccount:"),
        ("a" * 250 + "@example.com", "does not hold an email"),
    ],
)
def test_bad_members_stop_the_app(raw, words):
    for setting in ("DEDUP_OPERATORS", "DEDUP_VIEWERS"):
        environ = {**OFF_GAE, "DEDUP_AUTH": "appengine", setting: f"ok@example.com, {raw}"}
        if words is None:
            AuthSettings.from_environ(environ)
            continue
        with pytest.raises(AuthConfigError, match=setting) as refused:
            AuthSettings.from_environ(environ)
        assert words in str(refused.value)


def test_appengine_mode_is_refused_off_app_engine_and_behind_a_load_balancer():
    with pytest.raises(AuthConfigError, match="only App Engine strips"):
        AuthSettings.from_environ({"DEDUP_AUTH": "appengine"})
    assert AuthSettings.from_environ({"DEDUP_AUTH": "appengine", "GAE_ENV": "standard"}).modes == ("appengine",)
    backend = "/projects/123456789012/global/backendServices/42"
    with pytest.raises(AuthConfigError, match="backend service"):
        AuthSettings.from_environ({"GAE_ENV": "standard", "DEDUP_AUTH": "appengine,iap", "DEDUP_IAP_AUDIENCE": backend})
    iap_only = AuthSettings.from_environ({"DEDUP_AUTH": "iap", "DEDUP_IAP_AUDIENCE": backend})
    assert iap_only.verifier(IapAssertions).iap_audience == backend


def test_the_defaults_as_documented():
    settings = AuthSettings.from_environ({**OFF_GAE, "DEDUP_AUTH": "appengine"})
    assert settings.verifier(AppEngineMarkers).trusted_markers == {
        "cron", "queue", "admin", "ip:0.1.0.2", "ip:0.1.0.1"
    }  # fmt: skip
    behind_iap = {**OFF_GAE, "DEDUP_AUTH": "appengine,iap", "DEDUP_IAP_AUDIENCE": "/projects/1/apps/p"}
    assert "admin" not in AuthSettings.from_environ(behind_iap).verifier(AppEngineMarkers).trusted_markers
    policy = AuthSettings.from_environ({**OFF_GAE, "DEDUP_AUTH": "appengine"}).access
    assert policy == AccessPolicy(operators=(), viewers=None)
    assert policy.roles_of(person("carol@example.com")) == {Role.VIEW}
    assert policy.roles_of(person("carol@example.com", admitted=False)) == frozenset()
    internal = Principal("appengine:cron", "appengine", granted=frozenset({Role.DELIVER}))
    assert policy.roles_of(internal) == {Role.DELIVER}


def test_a_viewer_sees_a_pause_but_no_pause_or_resume_form_and_cannot_post_one(
    datastore, ndb_client, jobs_file, clock, iap, tmp_path
):
    """The job card's Pause and Resume are for operators, as Run now is."""
    (tmp_path / "scheduler.yaml").write_text(
        "jobs:\n  invoice-hourly: {target: invoice, schedule: '0 * * * *', project: acme-prod, "
        "location: us-central1, attempt_deadline: 60s}\n"
    )
    site = app_with(iap_environ(iap), datastore, ndb_client, jobs_file, clock)
    seen = site.get("/admin/", headers=as_person(iap, VIEWER), status=200).text
    assert 'data-scheduler-job="invoice-hourly"' in seen and 'class="pause tap"' not in seen
    assert 'class="pause tap"' in site.get("/admin/", headers=as_person(iap, OPERATOR), status=200).text
    form = {"note": "mine", "project": "acme-prod", "location": "us-central1"}
    headers = {**as_person(iap, VIEWER), "Sec-Fetch-Site": "same-origin"}
    site.post("/admin/scheduler-jobs/invoice-hourly/pause", form, headers=headers, status=403)
    assert (
        site.get("/api/v1/scheduler-jobs", headers=as_person(iap, VIEWER)).json["scheduler_jobs"][0]["paused"] is False
    )
