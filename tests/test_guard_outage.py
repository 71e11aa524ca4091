"""Issue 22 §3: with Datastore unreachable, a guarded endpoint answers the documented JSON 500
``InternalError`` with ``Retry-After``, whatever error pages its app has (the project's own
payments example has none: it answered Flask's HTML 500), and never a 503; on gunicorn."""

from __future__ import annotations

import pytest
import requests

from devtools.gunicorn import GunicornServer

pytestmark = pytest.mark.live


def test_the_guarded_example_answers_json_500_with_retry_after_when_datastore_is_down(emulator, tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs: {}\n")
    unreachable = {"DATASTORE_EMULATOR_HOST": "127.0.0.1:1"}  # nothing listens on port 1
    with GunicornServer(
        emulator,
        str(jobs),
        workers=1,
        threads=2,
        app="examples.guarded_payments:app",
        extra_env=unreachable,
        quiet=True,
    ) as server:
        answer = requests.post(
            f"{server.url}/payments",
            json={"amount": 10, "currency": "EUR"},
            headers={"Idempotency-Key": "k-1", "X-Tenant": "t-1"},
            timeout=90,
        )
    assert answer.status_code == 500 and answer.headers["Content-Type"] == "application/problem+json"
    assert answer.json()["error"] == "InternalError" and "retry the same request" in answer.json()["message"]
    assert answer.json()["type"] == "/problems/internal-error" and answer.json()["retryable"] is True
    assert answer.headers["Retry-After"] == "1"
