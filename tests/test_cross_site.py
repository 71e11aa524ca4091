"""No cross-site request can make the app act: Sec-Fetch-Site and Origin (the rule of Go's
CrossOriginProtection), and JSON endpoints take only application/json.  Scripts and
Scheduler, which send neither header, are not affected.  Nothing is written on refusal."""

from __future__ import annotations

import pytest

from handlers.cross_site import cross_site_problem
from models import RunRecord
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.routes import every_route

HOST = "localhost"  # webtest's Host, as Werkzeug spells it (no default port)

REFUSED = [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # a sibling subdomain is another origin
    {"Sec-Fetch-Site": "CROSS-SITE"},
    {"Sec-Fetch-Site": "something-new"},  # unknown: not one of the two trusted values
    {"Sec-Fetch-Site": "cross-site", "Origin": "http://localhost"},  # Sec-Fetch-Site decides
    {"Origin": "http://localhost@evil.example"},  # userinfo: the host is evil.example
    {"Origin": "ftp://localhost"},
    {"Origin": "https://evil.example"},
    {"Origin": "http://localhost:8080"},  # another port is another origin
    {"Origin": "http://localhost.evil.example"},
    {"Origin": "null"},  # a sandboxed frame, a file: page
    {"Origin": "not a url"},
    {"Origin": ""},
]
ALLOWED = [
    {},  # scripts, Cloud Scheduler, cron, Cloud Tasks: neither header
    {"Sec-Fetch-Site": "same-origin"},
    {"Sec-Fetch-Site": "none"},  # typed into the address bar, a bookmark
    {"Sec-Fetch-Site": " Same-Origin "},
    {"Origin": "http://localhost"},
    {"Origin": "http://localhost:80"},  # the default port, spelled out
    {"Origin": "HTTP://LOCALHOST"},
    {"Origin": "https://localhost:443"},
    {"Sec-Fetch-Site": "same-origin", "Origin": "https://evil.example"},  # a browser that sends both: the first
]


@pytest.fixture
def client(make_client):
    return make_client(JOBS)


def records(ndb_client):
    with ndb_client.context():
        return RunRecord.query().fetch()


def state_changing_routes(client):
    return [(method, path) for path, methods in every_route(client.app) for method in methods if method != "GET"]


@pytest.mark.sample(4)
@pytest.mark.parametrize("headers", REFUSED, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()))
def test_a_cross_site_request_is_403_on_every_state_changing_route(client, ndb_client, headers):
    routes = list(state_changing_routes(client))
    assert ("POST", "/jobs/invoice") in routes and ("POST", "/api/v1/jobs/invoice/runs") in routes
    for method, path in routes:
        response = client.request(
            path,
            method=method,
            body=b'{"clientToken": "t"}',
            headers={**scheduler_headers(), **headers},
            content_type="application/json",
            status="*",
        )
        assert response.status_int == 403, (method, path, response.status)
        assert response.json["error"] == "Forbidden" and "refused" in response.json["message"]
    assert records(ndb_client) == [] and job_targets.EFFECTS == []


@pytest.mark.parametrize("headers", ALLOWED, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()) or "none")
def test_same_origin_and_server_to_server_requests_are_served(client, headers):
    client.post("/jobs/invoice", headers={**scheduler_headers(), **headers}, status=200)
    client.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "t"}, headers=headers, status=201)


def test_reads_are_never_refused_as_cross_site(client):
    client.get("/api/v1/runs", headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, status=200)


def test_the_cleanup_cron_target_is_refused_cross_site_even_on_get(client, ndb_client):
    """An <img src=/tasks/cleanup> on another site must not run the cleanup."""
    client.get("/tasks/cleanup", headers={"Sec-Fetch-Site": "cross-site"}, status=403)
    client.get("/tasks/cleanup", headers={"X-Appengine-Cron": "true"}, status=200)  # cron sends neither header


@pytest.mark.parametrize(
    "host, origin",
    [
        ("[::1]:8080", "http://[::1]:8080"),
        ("app.example:443", "https://app.example"),
        ("app.example", "https://app.example:443"),
    ],
)
def test_hosts_compare_as_go_compares_them(host, origin):
    assert cross_site_problem("POST", {"Origin": origin}, host) is None
    assert cross_site_problem("POST", {"Origin": "http://[::2]:8080"}, host)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonx"],
)
def test_a_manual_run_takes_only_json(client, ndb_client, content_type):
    """What a cross-site form can send without a preflight is refused even from this origin."""
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post("/api/v1/jobs/invoice/runs", b'{"clientToken": "t"}', headers=headers, status=415)
    assert response.json["error"] == "UnsupportedMediaType"
    assert records(ndb_client) == [] and job_targets.EFFECTS == []
    client.post(
        "/api/v1/jobs/invoice/runs", b"{}", headers={"Content-Type": "application/json; charset=utf-8"}, status=201
    )


def test_the_rule_is_the_one_go_documents():
    assert cross_site_problem("POST", {"Sec-Fetch-Site": "cross-site"}, HOST)
    assert cross_site_problem("DELETE", {"Origin": "https://a.example"}, HOST)
    assert cross_site_problem("GET", {"Sec-Fetch-Site": "cross-site"}, HOST) is None
    assert cross_site_problem("OPTIONS", {"Origin": "https://a.example"}, HOST) is None
    assert cross_site_problem("POST", {}, HOST) is None


@pytest.mark.parametrize(
    ("path", "status"),
    [("/admin/", 200), ("/admin/jobs/invoice/run?token=t-1", 200), ("/admin/runs/" + "0" * 64, 404),
     ("/api/v1/runs", 200), ("/no/such/page", 404)],
)  # fmt: skip
def test_no_page_may_be_framed_by_another_site(client, path, status):
    """A confirmation page framed under a decoy would turn an operator's click into a
    same-origin POST, which the cross-site rule lets through: every answer refuses frames."""
    response = client.get(path, headers={"Accept": "text/html"}, status=status)
    assert response.headers["Content-Security-Policy"] == "frame-ancestors 'none'"
    assert response.headers["X-Frame-Options"] == "DENY"
