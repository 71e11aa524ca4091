"""A Cloud Run function of your own, made exactly-once by the library (docs/library.md):
`pip install "cloud-scheduler-dedup[functions]"`; served by `functions-framework --target
nightly_report`, as Cloud Run functions serve it."""

import functions_framework
from flask import Request

from dedup.adapters.flask import exactly_once
from dedup.deliveries import Deliveries, ScheduledRun

reports = Deliveries(job_id="nightly-report")


@functions_framework.http
@exactly_once(reports)
def nightly_report(run: ScheduledRun, request: Request) -> dict[str, object]:
    # Runs once per scheduled execution, however often Cloud Scheduler delivers it; pass
    # run.run_id downstream as the idempotency key of whatever the report sends.
    return {"sent": True, "attempt": run.attempt}
