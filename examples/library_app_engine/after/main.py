"""An App Engine app's nightly report route (examples/library_app_engine/README.md)."""

from flask import Flask
from reports import send_nightly_report

from dedup.adapters.flask import AppEngineCallers, Deliveries, ScheduledRun, exactly_once

app = Flask(__name__)
nightly = Deliveries("nightly-report", callers=AppEngineCallers())


@app.get("/tasks/nightly-report")
@exactly_once(nightly)
def nightly_report(run: ScheduledRun):
    send_nightly_report(idempotency_key=run.run_id)
    return {"sent": True}
