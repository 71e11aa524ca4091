"""A Flask app of your own, its Cloud Scheduler route made exactly-once by the library
(docs/library.md): `pip install "cloud-scheduler-dedup[flask]"`, one import, one decorator.
Served as Cloud Run serves it: `gunicorn --bind :$PORT library_flask_app:app`."""

import os

import requests
from flask import Flask

from dedup.adapters.flask import exactly_once
from dedup.deliveries import Deliveries, ScheduledRun

app = Flask(__name__)
reports = Deliveries(job_id="nightly-report")  # its lease, scope and database: DEDUP_* variables
REPORTS_URL = os.environ.get("REPORTS_URL", "https://reports.example.com/v1/reports")


@app.post("/tasks/nightly-report")
@exactly_once(reports)
def nightly_report(run: ScheduledRun) -> dict[str, object]:
    # Runs once per scheduled execution, however often Cloud Scheduler delivers it. The run's
    # key goes downstream as the idempotency key: an attempt that lost its lease sends the same.
    sent = requests.post(
        REPORTS_URL,
        json={"night": run.schedule_time.isoformat()},
        headers={"Idempotency-Key": run.run_id},
        timeout=60,
    )
    sent.raise_for_status()  # an error answer releases the run, and Scheduler's retry runs it
    return {"report": sent.json()["id"], "attempt": run.attempt}
