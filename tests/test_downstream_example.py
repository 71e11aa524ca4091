"""The guard at the most downstream service: an http job's key applied once there."""

from __future__ import annotations

import threading
import time

import pytest
from werkzeug.serving import make_server

from examples.downstream import SyncBatch, SyncCounter, create_downstream_app
from tests.support import POLL_SECONDS
from tests.support.deliveries import scheduler_headers


class LateFirstAnswers:
    """Test-only WSGI wrapper: the first ``count`` answers leave ``seconds`` late.

    The service has done its work by then: the caller's timeout loses an
    answer to a request that took effect.
    """

    def __init__(self, app, seconds: float, count: int) -> None:
        self.app, self.seconds, self.count = app, seconds, count
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        with self.lock:
            late = self.count > 0
            self.count -= 1
        body = list(self.app(environ, start_response))
        if late:
            time.sleep(self.seconds)
        return body


@pytest.fixture
def downstream(datastore, ndb_client, clock):
    app = create_downstream_app(clock=clock, ndb_client=ndb_client)
    slow = LateFirstAnswers(app.wsgi_app, seconds=0, count=0)
    app.wsgi_app = slow
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", slow
    server.shutdown()


@pytest.fixture
def client(make_client, downstream):
    url, _ = downstream
    return make_client(f"""
        jobs:
          sync-crm:
            kind: http
            url: {url}/hooks/sync
            timeout_seconds: 1
            lease_seconds: 30
    """)


def applied(ndb_client):
    with ndb_client.context():
        counter = SyncCounter.get_by_id("total")
        return (counter.applied if counter else 0), SyncBatch.query().fetch()


def deliver(client, status="*"):
    return client.post("/jobs/sync-crm", b"full", headers=scheduler_headers(scheduler_job_name="crm"), status=status)


def test_a_scheduled_sync_is_applied_once_downstream(client, ndb_client):
    first = deliver(client, status=200)
    assert first.json["result"]["status"] == 201
    deliver(client, status=200)
    count, batches = applied(ndb_client)
    assert count == 1
    assert batches[0].idempotency_key == first.json["run_id"]


def test_a_retry_after_a_timeout_whose_call_took_effect_is_not_applied_twice(client, ndb_client, downstream):
    _, late = downstream
    late.seconds, late.count = 2.0, 1
    # Our call times out after 1 s, but the downstream has applied the change.
    timed_out = deliver(client, status=500)
    assert "timed out" in timed_out.json["message"]
    # Scheduler's retry calls again with the same key: the downstream answers from its record.
    done = deliver(client, status=200)
    assert done.json["result"]["status"] == 201
    count, batches = applied(ndb_client)
    assert count == 1 and len(batches) == 1
    assert batches[0].idempotency_key == done.json["run_id"]


def test_the_downstream_refuses_the_key_with_another_request(downstream, datastore):
    import requests

    url, _ = downstream
    headers = {"Idempotency-Key": "k-1", "Content-Type": "application/json"}
    first = requests.post(
        f"{url}/hooks/sync", json={"job_id": "a", "schedule_time": "t1", "attempt": 1}, headers=headers
    )
    takeover = requests.post(
        f"{url}/hooks/sync", json={"job_id": "a", "schedule_time": "t1", "attempt": 2}, headers=headers
    )
    other = requests.post(
        f"{url}/hooks/sync", json={"job_id": "a", "schedule_time": "t2", "attempt": 1}, headers=headers
    )
    missing = requests.post(f"{url}/hooks/sync", json={"job_id": "a"})
    assert first.status_code == 201
    assert takeover.status_code == 201 and takeover.headers["Idempotent-Replayed"] == "true"
    assert takeover.json() == first.json()
    assert other.status_code == 422 and other.json()["differing"] == ["schedule_time"]
    assert missing.status_code == 400 and "Idempotency-Key" in missing.json()["message"]
