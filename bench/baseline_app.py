"""The same jobs served without the ledger: the baseline `make bench` compares against."""

from __future__ import annotations

import os

from flask import Flask, jsonify

from handlers import NdbContextMiddleware
from jobs import RunContext
from jobs.config import load_jobs
from settings import jobs_file

jobs = load_jobs(jobs_file(os.environ))
app = Flask(__name__)


@app.post("/jobs/<job_id>")
def run_without_dedup(job_id: str):
    context = RunContext(
        run_id="-", attempt_id="-", attempt=1, job_id=job_id, scheduler_job_name=None, schedule_time=None
    )
    return jsonify({"result": jobs[job_id].runner.run(context)})


app.wsgi_app = NdbContextMiddleware(app.wsgi_app)  # type: ignore[method-assign]  # Flask's middleware hook, typed as a method
