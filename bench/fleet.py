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


def fleet_files(count: int, folder: str) -> str:
    """jobs.yaml and scheduler.yaml for a fleet, in ``folder``; the jobs file's path."""
    with open(os.path.join(folder, "scheduler.yaml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(scheduler_document(count), handle)
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
