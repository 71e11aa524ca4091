"""What a request may be, on every route: bodies over the limit (however sent) are 413,
a HEAD never does work, and a query parameter given twice is 400.  Nothing runs and
nothing is written for any of them."""

from __future__ import annotations

import io
import json
import os

import pytest
import requests
from werkzeug.test import EnvironBuilder, run_wsgi_app

from dedup.keys import scheduled_run_key
from dedup.ledger import Ledger, RunDescription, RunPolicy
from handlers.request_limits import MAX_BODY_BYTES
from models import RunRecord
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.live import serving
from tests.support.routes import every_route

LIVE_JOBS = """
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 30
"""
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server(emulator, tmp_path_factory):
    with serving(emulator, tmp_path_factory.mktemp("limits"), LIVE_JOBS, workers=1, threads=4, quiet=True) as running:
        yield running


def padded(document: dict, size: int) -> bytes:
    """Valid JSON of exactly ``size`` bytes: trailing whitespace, so a body cut short still parses."""
    text = json.dumps(document).encode()
    return text + b" " * (size - len(text))


def chunked(body: bytes, chunk_size: int):
    """A generator body: requests sends it with Transfer-Encoding: chunked and no Content-Length."""
    for start in range(0, len(body), chunk_size):
        yield body[start : start + chunk_size]


def records(ndb_client) -> list[RunRecord]:
    with ndb_client.context():
        return RunRecord.query().fetch()


ROUTES = [
    ("/jobs/effect", lambda d: {"dir": d}),
    ("/api/v1/jobs/effect/runs", lambda d: {"clientToken": "big-1", "parameters": {"dir": d}}),
]
OVER_LIMIT = [
    pytest.param(MAX_BODY_BYTES + 1, MIB, id="one-byte-over-in-one-chunk"),
    pytest.param(int(1.6 * MIB), int(1.6 * MIB), id="1.6MiB-in-one-chunk"),
    pytest.param(int(1.6 * MIB), 8192, id="1.6MiB-in-8KiB-chunks"),
    pytest.param(MAX_BODY_BYTES + 1, 1, id="one-byte-over-in-tiny-chunks-at-the-end"),
]


@pytest.mark.live
@pytest.mark.parametrize("path, document", ROUTES)
@pytest.mark.parametrize("size, chunk_size", OVER_LIMIT)
def test_a_chunked_body_over_the_limit_is_413_and_runs_nothing(
    server, datastore, ndb_client, tmp_path, path, document, size, chunk_size
):
    body = padded(document(str(tmp_path)), size)
    if chunk_size == 1:  # most of it in one chunk, the last bytes one at a time
        parts = [body[:-16]] + [body[i : i + 1] for i in range(len(body) - 16, len(body))]
        data = iter(parts)
    else:
        data = chunked(body, chunk_size)
    response = requests.post(
        f"{server.url}{path}",
        data=data,
        timeout=60,
        headers={**scheduler_headers(scheduler_job_name="big"), "Content-Type": "application/json"},
    )
    assert response.status_code == 413, response.text
    assert response.json()["error"] == "RequestEntityTooLarge"
    assert os.listdir(tmp_path) == [] and records(ndb_client) == []


@pytest.mark.live
@pytest.mark.parametrize("path, document", ROUTES)
def test_a_body_over_the_limit_with_content_length_is_413_too(server, datastore, ndb_client, tmp_path, path, document):
    body = padded(document(str(tmp_path)), int(1.6 * MIB))
    response = requests.post(
        f"{server.url}{path}",
        data=body,
        timeout=60,
        headers={**scheduler_headers(scheduler_job_name="big"), "Content-Type": "application/json"},
    )
    assert response.status_code == 413 and response.json()["error"] == "RequestEntityTooLarge"
    assert os.listdir(tmp_path) == [] and records(ndb_client) == []


@pytest.mark.live
@pytest.mark.parametrize("path, document", ROUTES)
@pytest.mark.parametrize("chunk_size", [MIB, 8192])
def test_a_chunked_body_at_the_limit_arrives_whole(server, datastore, ndb_client, tmp_path, path, document, chunk_size):
    body = padded(document(str(tmp_path)), MAX_BODY_BYTES)
    response = requests.post(
        f"{server.url}{path}",
        data=chunked(body, chunk_size),
        timeout=60,
        headers={**scheduler_headers(scheduler_job_name="big"), "Content-Type": "application/json"},
    )
    assert response.status_code in (200, 201), response.text
    assert len(os.listdir(tmp_path)) == 1 and len(records(ndb_client)) == 1


@pytest.mark.live
def test_a_small_chunked_body_reaches_the_job_unchanged(server, datastore, tmp_path):
    body = json.dumps({"dir": str(tmp_path), "sleep": 0}).encode()
    response = requests.post(
        f"{server.url}/jobs/effect",
        data=chunked(body, 3),
        timeout=30,
        headers=scheduler_headers(scheduler_job_name="small"),
    )
    assert response.status_code == 200 and response.json()["status"] == "completed"
    assert len(os.listdir(tmp_path)) == 1


# -- every route, in-process -----------------------------------------------------


@pytest.fixture
def client(make_client):
    return make_client(JOBS)


def routes(client) -> list[tuple[str, list[str]]]:
    return every_route(client.app)


def expired_record(ndb_client, clock) -> None:
    """A record the cleanup task would delete: proof that a request did no cleanup."""
    key = scheduled_run_key("old-job", "2029-01-01T00:00:00Z")
    ledger = Ledger(clock)
    policy = RunPolicy(lease_seconds=10, retention_seconds=60)
    with ndb_client.context():
        claimed = ledger.claim_run(key.run_id, RunDescription(source="scheduler", job_id="invoice"), policy)
        ledger.complete_run(claimed.attempt, {}, policy)
    clock.advance(3600)


def test_the_route_list_covers_the_app(client):
    paths = {path for path, _ in routes(client)}
    assert {"/jobs/invoice", "/api/v1/jobs/invoice/runs", "/api/v1/runs", "/tasks/cleanup", "/admin/"} <= paths


def test_head_is_405_on_every_route_and_does_no_work(client, ndb_client, clock):
    expired_record(ndb_client, clock)
    for path, methods in routes(client):
        response = client.head(path, headers=scheduler_headers(), status=405)
        assert response.headers["Allow"] == ", ".join(methods), path
    assert job_targets.EFFECTS == []
    assert len(records(ndb_client)) == 1  # the cleanup did not run


def test_head_on_an_unknown_path_is_404(client):
    client.head("/no/such/page", status=404)


@pytest.mark.parametrize(
    "query",
    [
        "job=a&job=b",
        "x=1&x=1",
        "status=completed&status=failed",
        "project=alpha-project&project=alpha-project",
        "cursor=&cursor=",
    ],
)
def test_a_query_parameter_given_twice_is_400_on_every_route(client, ndb_client, clock, query):
    expired_record(ndb_client, clock)
    for path, methods in routes(client):
        for method in methods:
            response = client.request(f"{path}?{query}", method=method, headers=scheduler_headers(), status="*")
            assert response.status_int == 400, (method, path, response.text)
            assert response.json["error"] == "BadRequest" and "given 2 times" in response.json["message"]
    assert job_targets.EFFECTS == []
    assert len(records(ndb_client)) == 1


def test_a_body_over_the_limit_is_413_on_every_route(client, ndb_client, clock):
    expired_record(ndb_client, clock)
    for path, methods in routes(client):
        for method in methods:
            response = client.request(
                path, method=method, body=b" " * (MAX_BODY_BYTES + 1), headers=scheduler_headers(), status="*"
            )
            assert response.status_int == 413, (method, path, response.status)
    assert job_targets.EFFECTS == []
    assert len(records(ndb_client)) == 1


# -- bodies without a length, in-process (as gunicorn presents them) ----------------


class BrokenStream:
    """A chunked body whose framing breaks after some bytes (as gunicorn raises on a bad chunk)."""

    def __init__(self, good: bytes) -> None:
        self.good = io.BytesIO(good)

    def read(self, size: int = -1) -> bytes:
        data = self.good.read(size)
        if not data:
            raise OSError("Invalid chunk size")
        return data


def call_unframed(app, path: str, stream, transfer_encoding: str = "chunked", method: str = "POST"):
    """Call ``app`` with a body that has no Content-Length, as a server that de-chunks sends it."""
    environ = EnvironBuilder(path=path, method=method, headers=scheduler_headers()).get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ.update({"wsgi.input": stream, "wsgi.input_terminated": True, "HTTP_TRANSFER_ENCODING": transfer_encoding})
    body, status, headers = run_wsgi_app(app, environ, buffered=True)
    return int(status.split()[0]), json.loads(b"".join(body))


def guarded_apps(make_client, ndb_client, clock):
    """The scheduler target and the example downstream (another app using the guard)."""
    from examples.downstream import create_downstream_app

    main = make_client(JOBS).app
    downstream = create_downstream_app(clock=clock, ndb_client=ndb_client)
    return [(main, "/jobs/invoice"), (main, "/api/v1/jobs/invoice/runs"), (downstream, "/hooks/sync")]


def test_unframed_bodies_are_bounded_in_every_app_that_reads_one(make_client, ndb_client, clock):
    for app, path in guarded_apps(make_client, ndb_client, clock):
        status, body = call_unframed(app, path, io.BytesIO(b" " * int(1.6 * MIB)))
        assert status == 413 and body["error"] == "RequestEntityTooLarge", (path, status, body)
        status, body = call_unframed(app, path, BrokenStream(b'{"a": 1}'))
        assert status == 400 and "could not be read" in body["message"], (path, status, body)
        for coding in ("gzip, chunked", "deflate", "identity, chunked", "chunked, chunked"):
            status, body = call_unframed(app, path, io.BytesIO(b"\x1f\x8b compressed"), coding)
            assert status == 501 and "transfer coding" in body["message"], (path, coding, status, body)
    assert job_targets.EFFECTS == [] and records(ndb_client) == []


def test_the_example_downstream_follows_the_same_rules(ndb_client, clock, datastore):
    import webtest

    from examples.downstream import create_downstream_app

    app = webtest.TestApp(create_downstream_app(clock=clock, ndb_client=ndb_client))
    app.post("/hooks/sync", b" " * (MAX_BODY_BYTES + 1), headers={"Idempotency-Key": "k"}, status=413)
    app.head("/hooks/sync", status=405)
    app.post_json("/hooks/sync?a=1&a=2", {}, headers={"Idempotency-Key": "k"}, status=400)
    assert records(ndb_client) == []


@pytest.mark.live
def test_a_key_header_sent_twice_is_refused_on_gunicorn(server, datastore, ndb_client, tmp_path):
    import http.client
    import urllib.parse

    target = urllib.parse.urlsplit(server.url)
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
    body = json.dumps({"parameters": {"dir": str(tmp_path)}}).encode()
    connection.putrequest("POST", "/api/v1/jobs/effect/runs")
    for name, value in (
        ("Idempotency-Key", "first"),
        ("Idempotency-Key", "second"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
    ):
        connection.putheader(name, value)
    connection.endheaders(body)
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == 400 and "comma" in answer["message"]
    assert os.listdir(tmp_path) == [] and records(ndb_client) == []
