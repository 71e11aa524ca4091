"""What tests need to start manual runs: a jobs file, a start, a run held open at a gate."""

from __future__ import annotations

import json
import threading

from tests import job_targets

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 60
    fingerprint_exclude: [region]
  refund:
    kind: python
    target: tests.job_targets:record
  values:
    kind: python
    target: tests.job_targets:echo_parameter
  flaky:
    kind: python
    target: tests.job_targets:scripted_failures
  slow:
    kind: python
    target: tests.job_targets:gated_parameter
    lease_seconds: 86000   # just under the 24 h token lifetime
"""


def start(client, job="invoice", token="tok-1", parameters=None, status="*", headers=None, body=None):
    if body is None:
        payload = {}
        if token is not None:
            payload["clientToken"] = token
        if parameters is not None:
            payload["parameters"] = parameters
        body = json.dumps(payload)
    return client.post(
        f"/api/v1/jobs/{job}/runs", body, headers=headers or {}, content_type="application/json", status=status
    )


def start_slow(client, gate, results, **kwargs):
    thread = threading.Thread(
        target=lambda: results.append(start(client, job="slow", parameters={"gate": gate}, **kwargs))
    )
    thread.start()
    for _ in range(200):
        if gate in job_targets.STARTED and job_targets.STARTED[gate].wait(0.05):
            return thread
        threading.Event().wait(0.05)
    raise AssertionError("the job never started")
