"""Where the app trusts headers anyone could send, it serves only requests addressed to a loopback host name.

That is DEDUP_AUTH=none, and appengine off App Engine: with GAE_ENV unset,
or ``localdev`` as dev_appserver (make devserver) sets it, nothing strips
client-sent ``X-Appengine-*`` markers, so anyone could deliver as cron or act
as the signed-in admin.  A web page can reach a local server through DNS
rebinding: its own name resolves to 127.0.0.1, so the browser sends the
page's name as ``Host`` (and as ``Origin``, so the cross-site rule passes);
anyone on the network sends some other ``Host`` too.  Only the ``Host``
tells: a name that is not loopback is refused (401, a fixed message), before
anything is read or written, on every route.  On App Engine
(``GAE_ENV=standard``) its front end strips the markers and nothing changes;
``iap`` and ``oidc`` verify signatures, so they serve any ``Host`` anywhere.
"""

from __future__ import annotations

import http.client

import pytest
import webtest

from handlers import create_app
from handlers.auth import NOT_LOOPBACK, AuthConfigError, AuthSettings, is_loopback_host
from models import RunRecord
from tests.support.callers import (  # noqa: F401 - fixtures
    AUDIENCE,
    CALLER,
    OFF_GAE,
    OPERATOR,
    app_with,
    as_person,
    iap,
    iap_environ,
    issuer,
    nothing_written,
    oidc_app,
)
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.live import serving
from tests.support.manual_runs import start
from tests.support.problems import code_and_message
from tests.support.routes import every_route

LOOPBACK = [
    "localhost",
    "localhost:8080",
    "LOCALHOST:80",
    "dev.localhost",  # RFC 6761: every *.localhost is loopback
    "127.0.0.1",
    "127.0.0.1:8080",
    "127.1.2.3:9",
    "[::1]",
    "[::1]:8080",
    " localhost ",
    "localhost.",  # the absolute form of the name
    "localhost.:8080",
    "a-b.dev.localhost:65535",
    "",  # no Host (HTTP/1.0): no browser, so no rebinding
]
NOT_LOOPBACK_HOSTS = [
    "localhost:65536",
    "localhost:\u00b2",  # a digit to str.isdigit, not to a port
    "localhost:\u0661",
    "evil.example/.localhost",
    "a b.localhost",
    "..localhost",
    "evil.example\x00.localhost",
    "\x0blocalhost",
    "localhost\xa0",
    "l\u0131ocalhost",
    "[::1%25eth0]",
    "127.1",
    "2130706433",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "127.000.0.1",
    "127.0.0.1.",
    "evil@localhost",
    "[::ffff:127.0.0.1]",
    "evil.example",
    "evil.example:8080",
    "localhost.evil.example",  # a name that only starts like one
    "127.0.0.1.nip.io",  # resolves to loopback, but the name is the attacker's
    "evil-localhost",
    "0.0.0.0",
    "10.0.0.1",
    "192.168.1.2:8080",
    "[::2]",
    "[::ffff:7f00:1]",  # IPv4-mapped 127.0.0.1: not ::1, refused as the strict reading
    "[::1",
    "::1]",
    "localhost:8080:9",
    "localhost\r\nX-Evil: 1",
    "[localhost]",
    "localhost:http",
    "localhost:",
    "[::1]x",
    "::1",  # an IPv6 address unbracketed is no Host
    "%6c%6f%63%61%6c%68%6f%73%74",  # percent-encoded "localhost"
]


# Everything a forger could claim: App Engine's internal callers, and the signed-in admin (an operator here).
# Together they are refused wherever they are trusted (tests/test_internal_markers.py); what is served is
# the internal callers' markers alone.
SIGNED_IN = {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": OPERATOR}
INTERNAL = {
    **scheduler_headers(),
    "X-Appengine-Cron": "true",
    "X-AppEngine-QueueName": "default",
    "X-Appengine-User-Ip": "0.1.0.2",
}
FORGED = {**INTERNAL, **SIGNED_IN}
# The local App Engine mode as make devserver runs it (dev_appserver sets GAE_ENV=localdev).
DEVSERVER = {**OFF_GAE, "GAE_ENV": "localdev", "DEDUP_AUTH": "appengine", "DEDUP_OPERATORS": OPERATOR}
# Every mode that trusts forgeable headers, off App Engine.
LOCAL_MODES = {
    "none": lambda iap: {"DEDUP_AUTH": "none"},
    "appengine, GAE_ENV unset": lambda iap: {**OFF_GAE, "DEDUP_AUTH": "appengine", "DEDUP_OPERATORS": OPERATOR},
    "appengine, localdev (make devserver)": lambda iap: DEVSERVER,
    "appengine,iap, localdev": lambda iap: iap_environ(iap, **OFF_GAE, GAE_ENV="localdev"),
}
PRODUCTION = {"GAE_ENV": "standard", "DEDUP_AUTH": "appengine", "DEDUP_OPERATORS": OPERATOR}


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_names_are_loopback(host):
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", NOT_LOOPBACK_HOSTS)
def test_every_other_name_is_not(host):
    assert not is_loopback_host(host)


@pytest.mark.parametrize(
    "environ, trusts",
    [
        ({"DEDUP_AUTH": "none"}, True),
        ({"DEDUP_AUTH": "none", "GAE_ENV": "localdev"}, True),
        ({**OFF_GAE, "DEDUP_AUTH": "appengine"}, True),
        (DEVSERVER, True),
        (
            {
                **OFF_GAE,
                "DEDUP_AUTH": "appengine,oidc",
                "GAE_ENV": "localdev",
                "DEDUP_OIDC_AUDIENCE": "https://a",
                "DEDUP_OIDC_ALLOWED_EMAILS": CALLER,
            },
            True,
        ),
        (PRODUCTION, False),
        ({"GAE_ENV": "standard"}, False),  # the default mode on App Engine: appengine
        ({"GAE_ENV": "standard", "DEDUP_AUTH": "appengine,iap", "DEDUP_IAP_AUDIENCE": "/projects/1/apps/p"}, False),
        ({"DEDUP_AUTH": "iap", "DEDUP_IAP_AUDIENCE": "/projects/1/apps/p"}, False),
        ({"DEDUP_AUTH": "oidc", "DEDUP_OIDC_AUDIENCE": "https://a", "DEDUP_OIDC_ALLOWED_EMAILS": CALLER}, False),
    ],
)
def test_which_settings_trust_forgeable_headers(environ, trusts):
    assert AuthSettings.from_environ(environ).trusts_forgeable_headers is trusts


@pytest.mark.parametrize("gae_env", ["localdev", "flex", "1"])
def test_only_app_engine_standard_is_app_engine(gae_env):
    """dev_appserver's GAE_ENV=localdev strips nothing: appengine needs the same explicit setting as anywhere else."""
    with pytest.raises(AuthConfigError, match="GAE_ENV not standard"):
        AuthSettings.from_environ({"GAE_ENV": gae_env, "DEDUP_AUTH": "appengine"})


@pytest.fixture(params=list(LOCAL_MODES))
def local_app(request, datastore, ndb_client, jobs_file, clock, iap):
    return app_with(LOCAL_MODES[request.param](iap), datastore, ndb_client, jobs_file, clock)


@pytest.mark.sample(2)
def test_forged_markers_from_any_other_name_are_refused_on_every_route_and_nothing_is_written(local_app, ndb_client):
    for path, methods in every_route(local_app.app):
        for method in methods:
            for host in NOT_LOOPBACK_HOSTS:
                response = local_app.request(path, method=method, headers={**FORGED, "Host": host}, expect_errors=True)
                assert response.status_int == 401, (method, path, host, response.status)
                assert code_and_message(response.json) == {"error": "Unauthenticated", "message": NOT_LOOPBACK}, (
                    method,
                    path,
                    host,
                )
                assert "evil" not in response.text
    assert nothing_written(ndb_client)


@pytest.mark.sample(2)
def test_a_delivery_from_a_loopback_name_is_still_served(local_app):
    for number, host in enumerate(LOOPBACK):
        headers = {**INTERNAL, **scheduler_headers(schedule_time=f"2025-10-17T23:{number:02}:00Z"), "Host": host}
        response = local_app.post("/jobs/invoice", headers=headers, status=200)
        assert response.json["duplicate"] is False, host


@pytest.fixture
def devserver_app(datastore, ndb_client, jobs_file, clock):
    return app_with(DEVSERVER, datastore, ndb_client, jobs_file, clock)


def test_under_make_devserver_the_signed_in_admin_is_served_on_loopback_only(devserver_app):
    started = start(devserver_app, headers={**SIGNED_IN, "Host": "localhost:8080"}, status=201)
    assert started.json["requested_by"] == f"user:{OPERATOR}"
    devserver_app.get("/api/v1/runs", headers={**SIGNED_IN, "Host": "127.0.0.1:8080"}, status=200)
    devserver_app.get("/admin/", headers={**SIGNED_IN, "Host": "localhost:8080"}, status=200)
    for host in ("rebound.example:8080", "192.168.1.2:8080", "127.0.0.1.nip.io:8080"):
        devserver_app.get("/api/v1/runs", headers={**SIGNED_IN, "Host": host}, status=401)
        start(devserver_app, token="rebound", headers={**SIGNED_IN, "Host": host}, status=401)


def test_on_app_engine_any_host_is_served(datastore, ndb_client, jobs_file, clock):
    """GAE_ENV=standard: App Engine's front end stripped client-sent markers, and routes by any Host it serves."""
    settings = AuthSettings.from_environ(PRODUCTION)
    app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=ndb_client, auth=settings))
    for number, host in enumerate(["acme-prod.appspot.com", "dedup.example.com:443", "evil.example"]):
        headers = {**INTERNAL, **scheduler_headers(schedule_time=f"2025-10-17T23:{number:02}:00Z"), "Host": host}
        assert app.post("/jobs/invoice", headers=headers, status=200).json["duplicate"] is False
        app.get("/api/v1/runs", headers={**SIGNED_IN, "Host": host}, status=200)


def test_signed_evidence_is_served_from_any_host(datastore, ndb_client, jobs_file, clock, iap, oidc_app, issuer):
    """iap and oidc verify signatures: nothing there is forgeable, so off App Engine too any Host is served."""
    iap_only = iap_environ(iap, DEDUP_AUTH="iap")
    iap_app = app_with(iap_only, datastore, ndb_client, jobs_file, clock)
    iap_app.get("/api/v1/runs", headers={**as_person(iap, OPERATOR), "Host": "evil.example"}, status=200)
    token = {"Authorization": f"Bearer {issuer.token(audience=AUDIENCE, email=CALLER)}"}
    response = oidc_app.post("/jobs/invoice", headers={**scheduler_headers(), **token, "Host": "evil.example"})
    assert response.status_int == 200


# Host spellings a client can put on the wire (http.client refuses the others).
WIRE_SPELLINGS = [h for h in NOT_LOOPBACK_HOSTS if h.isascii() and h.isprintable() and h == h.strip()]


def raw_request(port, method, path, headers):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", "0")
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


@pytest.mark.live
def test_over_http_on_gunicorn(emulator, tmp_path):
    """As a browser would arrive: the rebound name in Host, its own Origin, on the real server."""
    with serving(emulator, tmp_path, JOBS) as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        headers = {**scheduler_headers(), "Host": f"rebound.example:{port}", "Origin": f"http://rebound.example:{port}"}
        connection.request("POST", "/jobs/invoice", headers=headers)
        refused = connection.getresponse()
        assert refused.status == 401 and NOT_LOOPBACK in refused.read().decode()
        connection.request("POST", "/jobs/invoice", headers=scheduler_headers())  # Host: 127.0.0.1:port
        served = connection.getresponse()
        assert served.status == 200, served.read()
        connection.close()


@pytest.mark.live
def test_the_local_app_engine_mode_on_gunicorn(datastore, ndb_client, tmp_path):
    """make devserver's settings on a real gunicorn: every route, every spelling a client can send."""
    with serving(datastore, tmp_path, JOBS, extra_env=DEVSERVER) as server:
        app = create_app(jobs_file=server.jobs_file, ndb_client=ndb_client, auth=AuthSettings.from_environ(DEVSERVER))
        for path, methods in every_route(app):
            for method in methods:
                for host in WIRE_SPELLINGS + [f"rebound.example:{server.port}"]:
                    status, body = raw_request(server.port, method, path, {**FORGED, "Host": host})
                    assert (status, NOT_LOOPBACK in body) == (401, True), (method, path, host, status)
        with ndb_client.context():
            assert RunRecord.query().fetch() == []
        status, body = raw_request(
            server.port, "POST", "/jobs/invoice", {**INTERNAL, "Host": f"127.0.0.1:{server.port}"}
        )
        assert status == 200, body


@pytest.mark.live
def test_app_engine_on_gunicorn_serves_any_host(emulator, tmp_path):
    with serving(emulator, tmp_path, JOBS, extra_env=PRODUCTION) as server:
        status, body = raw_request(server.port, "POST", "/jobs/invoice", {**INTERNAL, "Host": "acme-prod.appspot.com"})
        assert status == 200, body
