"""An App Engine app's nightly report route (examples/library_app_engine/README.md)."""

from flask import Flask
from reports import send_nightly_report

app = Flask(__name__)


@app.get("/tasks/nightly-report")
def nightly_report():
    send_nightly_report()
    return {"sent": True}
