"""A Flask app of your own, its Cloud Scheduler route made exactly-once by the library
(docs/library.md): `pip install "cloud-scheduler-dedup[flask]"`, one import, one decorator."""

from flask import Flask

from dedup.adapters.flask import exactly_once
from dedup.deliveries import Deliveries, ScheduledRun

app = Flask(__name__)
reports = Deliveries(job_id="nightly-report")
SENT: list[str] = []  # stands in for the downstream: what was sent, by key


@app.post("/tasks/nightly-report")
@exactly_once(reports)
def nightly_report(run: ScheduledRun) -> dict[str, object]:
    # Runs once per scheduled execution, however often Cloud Scheduler delivers it; pass
    # run.run_id downstream as the idempotency key of whatever the report sends.
    SENT.append(run.run_id)
    return {"sent": True, "attempt": run.attempt}
