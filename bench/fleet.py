"""The schedule code at fleet size (issue 24 §7): start-up and one audit pass, at 100 and 1,000
Scheduler jobs, each with a schedule of its own.

Cloud Scheduler allows 1,000 jobs per region by default (5,000 at most).  Start-up is the
CPU a worker spends validating scheduler.yaml before it serves; the audit pass is one
/tasks/audit over every job, on loopback and at the benchmark's round-trip delay.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import textwrap
import time
from collections.abc import Sequence
from typing import Any

import yaml

from dedup.clock import ManualClock

FLEETS = (100, 1000)
JOBS_YAML = """
jobs:
  noop:
    kind: python
    target: bench.jobs:noop
    lease_seconds: 120
"""


def scheduler_document(count: int) -> dict[str, Any]:
    """``count`` Scheduler jobs with distinct schedules (minute, hour and weekday vary)."""
    return {
        "defaults": {
            "project": "acme-prod",
            "location": "us-central1",
            "attempt_deadline": "60s",
            "start_at": "2030-01-01T00:00:00Z",
        },
        "jobs": {
            f"fleet-{index}": {"target": "noop", "schedule": f"{index % 60} {index // 60 % 24} * * *"}
            for index in range(count)
        },
    }


def fleet_files(count: int, folder: str, document: dict[str, Any] | None = None) -> str:
    """jobs.yaml and scheduler.yaml (``document``, else ``count`` daily jobs) for a fleet, in
    ``folder``; the jobs file's path."""
    with open(os.path.join(folder, "scheduler.yaml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(document or scheduler_document(count), handle)
    path = os.path.join(folder, "jobs.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(textwrap.dedent(JOBS_YAML))
    return path


def measure_fleet(client: Any, counts: Sequence[int] = FLEETS) -> list[dict[str, Any]]:
    """For each fleet size: start-up CPU seconds, and one audit pass's wall seconds (a day of
    slots, none delivered: every one judged missed)."""
    from handlers import create_app

    rows = []
    for count in counts:
        with tempfile.TemporaryDirectory() as folder:
            jobs_file = fleet_files(count, folder)
            clock = ManualClock(datetime.datetime(2030, 1, 2, tzinfo=datetime.UTC))
            started = time.process_time()
            app = create_app(jobs_file=jobs_file, clock=clock, ndb_client=client)
            start_up = time.process_time() - started
            web = app.test_client()
            web.get("/api/v1/scheduler-jobs")  # the first request records the schedules
            began = time.perf_counter()
            answer = web.get("/tasks/audit", headers={"X-Appengine-Cron": "true"}).get_json()
            audit_seconds = time.perf_counter() - began
            rows.append(
                {
                    "jobs": count,
                    "start_up_cpu_s": start_up,
                    "audit_pass_s": audit_seconds,
                    "missed": len(answer["missed"]),
                }
            )
    return rows


# The audit's steady state: a pass every AUDIT_INTERVAL_SECONDS over per-minute Scheduler jobs,
# each with that interval's slots to judge (none delivered: each judged missed).
AUDIT_FLEETS = (1000, 5000)


def measure_audit(client: Any, counter: Any, counts: Sequence[int] = AUDIT_FLEETS) -> list[dict[str, Any]]:
    """For each fleet of per-minute Scheduler jobs: one steady-state audit pass (the one after the
    first), its wall seconds, and per Scheduler job its CPU milliseconds (this process: the app
    and NDB), its Datastore calls and its entity reads.  ``counter``: ``client``'s RpcCounter."""
    from handlers import create_app
    from schedules.config import AUDIT_INTERVAL_SECONDS

    rows = []
    for count in counts:
        with tempfile.TemporaryDirectory() as folder:
            document = scheduler_document(count)
            document["jobs"] = {
                f"minutely-{index}": {"target": "noop", "schedule": "* * * * *"} for index in range(count)
            }
            jobs_file = fleet_files(count, folder, document)
            # Just after the fleet's start_at: the first pass has a few slots a job, its marks are the fleet's.
            clock = ManualClock(datetime.datetime(2030, 1, 1, 0, 3, tzinfo=datetime.UTC))
            app = create_app(jobs_file=jobs_file, clock=clock, ndb_client=client)
            web, queue = app.test_client(), app.extensions["dedup"].dispatcher
            cron = {"X-Appengine-Cron": "true"}
            web.get("/tasks/audit", headers=cron)  # the first pass: every job's mark written
            queue.wait(600)  # and its shares, past the first 1,000 jobs (service.audits)
            clock.advance(AUDIT_INTERVAL_SECONDS)
            counter.wait_until_idle()
            counter.reset()
            began, cpu = time.perf_counter(), time.process_time()
            answer = web.get("/tasks/audit", headers=cron).get_json()
            shares = queue.wait(600)  # the shares it dispatched, on this process's threads
            cpu, wall = time.process_time() - cpu, time.perf_counter() - began
            counter.wait_until_idle()
            rows.append(
                {
                    "jobs": count,
                    "pass_s": wall,
                    "cpu_ms_per_job": cpu / count * 1000,
                    "calls_per_job": sum(counter.snapshot().values()) / count,
                    "reads_per_job": counter.billed()["reads"] / count,
                    "missed": len(answer["missed"]),
                    "shares": sorted(set(shares)),
                }
            )
    return rows


def render_audit(rows: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "## The audit at fleet size (bench/fleet.py, measure_audit)",
        "",
        "Per-minute Scheduler jobs, none delivered; the pass after the first, 15 minutes on (15 slots",
        "a job to judge, each missed), on loopback; past 1,000 jobs the pass dispatches the rest in",
        "shares, run here on the process's threads and counted with it. Per Scheduler job: this",
        "process's CPU (the app and NDB), Datastore calls and entity reads.",
        "",
        "| Scheduler jobs | pass, s | CPU ms / job | calls / job | reads / job |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['jobs']:,} | {row['pass_s']:.1f} | {row['cpu_ms_per_job']:.2f} "
            f"| {row['calls_per_job']:.3f} | {row['reads_per_job']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def render_fleet(loopback: list[dict[str, Any]], delayed: list[dict[str, Any]] | None, rtt_ms: float) -> str:
    lines = [
        "",
        "## At fleet size (bench/fleet.py)",
        "",
        "Scheduler jobs with a schedule each (daily, distinct times); one audit pass over a day of",
        "slots none of which was delivered (each judged missed and logged).",
        "",
        "| Scheduler jobs | start-up CPU, s | audit pass, loopback, s |"
        + (f" audit pass, {rtt_ms:g} ms round trip, s |" if delayed else ""),
        "|---|---|---|" + ("---|" if delayed else ""),
    ]
    for index, row in enumerate(loopback):
        line = f"| {row['jobs']:,} | {row['start_up_cpu_s']:.2f} | {row['audit_pass_s']:.1f} |"
        if delayed:
            line += f" {delayed[index]['audit_pass_s']:.1f} |"
        lines.append(line)
    return "\n".join(lines) + "\n"
