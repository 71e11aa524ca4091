"""What a request may be, on every route: bodies over the limit (however sent) are 413,
a HEAD never does work, and a query parameter given twice is 400.  Nothing runs and
nothing is written for any of them."""

from __future__ import annotations

import datetime
import json
import os
import textwrap

import pytest
import requests

from dedup.keys import scheduled_run_key
from dedup.ledger import Ledger, RunDescription, RunPolicy
from devtools.gunicorn import GunicornServer
from handlers.request_limits import MAX_BODY_BYTES
from models import RunRecord
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers

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
    jobs = tmp_path_factory.mktemp("limits") / "jobs.yaml"
    jobs.write_text(textwrap.dedent(LIVE_JOBS))
    with GunicornServer(emulator, str(jobs), workers=1, threads=4, quiet=True) as running:
        yield running


def padded(document: dict, size: int) -> bytes:
    """Valid JSON of exactly ``size`` bytes: trailing whitespace, so a body cut short still parses."""
    text = json.dumps(document).encode()
    return text + b" " * (size - len(text))


def chunked(body: bytes, chunk_size: int):
    """A generator body: requests sends it with Transfer-Encoding: chunked and no Content-Length."""
    for start in range(0, len(body), chunk_size):
        yield body[start:start + chunk_size]


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
def test_a_chunked_body_over_the_limit_is_413_and_runs_nothing(server, datastore, ndb_client, tmp_path,
                                                               path, document, size, chunk_size):
    body = padded(document(str(tmp_path)), size)
    if chunk_size == 1:  # most of it in one chunk, the last bytes one at a time
        parts = [body[:-16]] + [body[i:i + 1] for i in range(len(body) - 16, len(body))]
        data = iter(parts)
    else:
        data = chunked(body, chunk_size)
    response = requests.post(f"{server.url}{path}", data=data, timeout=60,
                             headers={**scheduler_headers(job_name="big"), "Content-Type": "application/json"})
    assert response.status_code == 413, response.text
    assert response.json()["error"] == "RequestEntityTooLarge"
    assert os.listdir(tmp_path) == [] and records(ndb_client) == []


@pytest.mark.live
@pytest.mark.parametrize("path, document", ROUTES)
def test_a_body_over_the_limit_with_content_length_is_413_too(server, datastore, ndb_client, tmp_path,
                                                              path, document):
    body = padded(document(str(tmp_path)), int(1.6 * MIB))
    response = requests.post(f"{server.url}{path}", data=body, timeout=60,
                             headers={**scheduler_headers(job_name="big"), "Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"] == "RequestEntityTooLarge"
    assert os.listdir(tmp_path) == [] and records(ndb_client) == []


@pytest.mark.live
@pytest.mark.parametrize("path, document", ROUTES)
@pytest.mark.parametrize("chunk_size", [MIB, 8192])
def test_a_chunked_body_at_the_limit_arrives_whole(server, datastore, ndb_client, tmp_path, path, document,
                                                   chunk_size):
    body = padded(document(str(tmp_path)), MAX_BODY_BYTES)
    response = requests.post(f"{server.url}{path}", data=chunked(body, chunk_size), timeout=60,
                             headers={**scheduler_headers(job_name="big"), "Content-Type": "application/json"})
    assert response.status_code in (200, 201), response.text
    assert len(os.listdir(tmp_path)) == 1 and len(records(ndb_client)) == 1


@pytest.mark.live
def test_a_small_chunked_body_reaches_the_job_unchanged(server, datastore, tmp_path):
    body = json.dumps({"dir": str(tmp_path), "sleep": 0}).encode()
    response = requests.post(f"{server.url}/jobs/effect", data=chunked(body, 3), timeout=30,
                             headers=scheduler_headers(job_name="small"))
    assert response.status_code == 200 and response.json()["status"] == "completed"
    assert len(os.listdir(tmp_path)) == 1


# -- every route, in-process -----------------------------------------------------


@pytest.fixture
def client(make_client):
    return make_client(JOBS)


def routes(client) -> list[tuple[str, list[str]]]:
    """Every route of the app, with a concrete path and the methods it serves."""
    values = {"job_id": "invoice", "run_id": "0" * 64}
    found = []
    for rule in client.app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = rule.rule
        for name in rule.arguments:
            path = path.replace(f"<{name}>", values[name])
        found.append((path, sorted(rule.methods - {"HEAD", "OPTIONS"})))
    return found


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


@pytest.mark.parametrize("query", ["job=a&job=b", "x=1&x=1", "status=completed&status=failed",
                                   "project=alpha-project&project=alpha-project", "cursor=&cursor="])
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
            response = client.request(path, method=method, body=b" " * (MAX_BODY_BYTES + 1),
                                      headers=scheduler_headers(), status="*")
            assert response.status_int == 413, (method, path, response.status)
    assert job_targets.EFFECTS == []
    assert len(records(ndb_client)) == 1
