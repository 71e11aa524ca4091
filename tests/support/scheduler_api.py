"""Cloud Scheduler's API for ``python -m deploy scheduler plan|apply``: a stand-in per test
(devtools/cloud_scheduler_fake.py), named by DEDUP_SCHEDULER_API_BASE, and live jobs to start from."""

from __future__ import annotations

from typing import Any

import pytest

from devtools.cloud_scheduler_fake import CloudSchedulerFake

SCOPE = "projects/acme-prod/locations/us-central1"


@pytest.fixture
def scheduler_api(monkeypatch):
    fake = CloudSchedulerFake()
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", fake.url)
    yield fake
    fake.close()


def app_engine_job(name: str = "nightly", method: str = "POST", **fields: Any) -> dict[str, Any]:
    """A live App Engine job as another tool (or a hand) made it: what the plan finds."""
    return {
        "name": f"{SCOPE}/jobs/{name}",
        "schedule": "0 2 * * *",
        "timeZone": "Etc/UTC",
        "appEngineHttpTarget": {"httpMethod": method, "relativeUri": "/jobs/report", "appEngineRouting": {}},
        **fields,
    }
