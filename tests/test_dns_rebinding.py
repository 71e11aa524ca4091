"""DEDUP_AUTH=none serves only requests addressed to a loopback host name.

A web page can reach a local server through DNS rebinding: its own name
resolves to 127.0.0.1, so the browser sends the page's name as ``Host`` (and
as ``Origin``, so the cross-site rule passes).  Only the ``Host`` tells: a
name that is not loopback is refused (401, a fixed message), before anything
is read or written, on every route.
"""

from __future__ import annotations

import http.client

import pytest

from handlers.auth import NOT_LOOPBACK, is_loopback_host
from models import RunRecord
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.live import serving
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


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_names_are_loopback(host):
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", NOT_LOOPBACK_HOSTS)
def test_every_other_name_is_not(host):
    assert not is_loopback_host(host)


@pytest.fixture
def client(make_client):
    return make_client(JOBS)


def test_a_rebound_name_is_refused_on_every_route_and_nothing_is_written(client, ndb_client):
    for path, methods in every_route(client.app):
        for method in methods:
            response = client.request(
                path, method=method, headers={**scheduler_headers(), "Host": "evil.example"}, expect_errors=True
            )
            assert response.status_int == 401, (method, path, response.status)
            assert response.json == {"error": "Unauthenticated", "message": NOT_LOOPBACK}, (method, path)
            assert "evil" not in response.text
    assert job_targets.EFFECTS == []
    with ndb_client.context():
        assert RunRecord.query().fetch() == []


def test_localhost_is_still_served(client):
    response = client.post("/jobs/invoice", headers={**scheduler_headers(), "Host": "127.0.0.1:8080"}, status=200)
    assert response.json["duplicate"] is False


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
