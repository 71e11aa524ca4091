"""A Cloud Run function of your own, made exactly-once by the library (docs/library.md):
`pip install "cloud-scheduler-dedup[functions]"`; served by `functions-framework --target
nightly_report`, as Cloud Run functions serve it."""

import os

import functions_framework
import requests
from flask import Request

from dedup.adapters.flask import exactly_once
from dedup.deliveries import Deliveries, ScheduledRun

reports = Deliveries(job_id="nightly-report")  # its lease, scope and database: DEDUP_* variables
REPORTS_URL = os.environ.get("REPORTS_URL", "https://reports.example.com/v1/reports")


@functions_framework.http
@exactly_once(reports)
def nightly_report(run: ScheduledRun, request: Request) -> dict[str, object]:
    # Runs once per scheduled execution, however often Cloud Scheduler delivers it; the run's
    # key goes downstream as the idempotency key.
    sent = requests.post(
        REPORTS_URL,
        json={"night": run.schedule_time.isoformat()},
        headers={"Idempotency-Key": run.run_id},
        timeout=60,
    )
    sent.raise_for_status()  # an error answer releases the run, and Scheduler's retry runs it
    return {"report": sent.json()["id"], "attempt": run.attempt}
