"""`make bench`: Datastore RPCs and latency per delivery outcome, with and without dedup.

Runs the Flask app in-process against a fresh Datastore emulator, counting
RPCs on the wire with a gRPC interceptor.  Latency includes Flask, NDB and
the emulator round trips on this machine; compare the rows, not the
absolute numbers, with production.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

import werkzeug.test
from flask import Flask

from devtools.emulator import DatastoreEmulator
from devtools.rpc_counter import counting_client

BENCH_JOBS = """\
jobs:
  noop:
    kind: python
    target: bench.jobs:noop
    lease_seconds: 600
"""
RESULTS_FILE = os.path.join(os.path.dirname(__file__), "results.md")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def measure(label: str, requests_: int, call, counter, expect_status: int) -> dict:
    latencies = []
    counter.reset()
    for index in range(requests_):
        started = time.perf_counter()
        status = call(index)
        latencies.append((time.perf_counter() - started) * 1000)
        if status != expect_status:
            raise SystemExit(f"{label}: expected {expect_status}, got {status}")
    calls = counter.snapshot()
    return {
        "label": label,
        "requests": requests_,
        "rpcs": sum(calls.values()) / requests_,
        "breakdown": ", ".join(f"{name} {count / requests_:g}" for name, count in sorted(calls.items())),
        "median": statistics.median(latencies),
        "p95": percentile(latencies, 0.95),
    }


def plain_app(job, ndb_client) -> Flask:
    """The same job behind Flask and an NDB context, without the ledger."""
    from handlers import NdbContextMiddleware
    from jobs import RunContext

    app = Flask("baseline")

    @app.post("/plain")
    def plain():
        context = RunContext("-", "-", 1, "noop", "bench", None)
        return {"result": job.runner.run(context)}

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--no-write", action="store_true", help="print only; do not update bench/results.md")
    args = parser.parse_args()

    with DatastoreEmulator(project="dedup-bench") as emulator:
        os.environ.update(emulator.env)
        os.environ.setdefault("DEDUP_AUTH", "none")  # measure the ledger, not token checks
        from handlers import create_app
        from dedup.ledger import RunDescription, RunPolicy

        client, counter = counting_client(emulator.project)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
            handle.write(BENCH_JOBS)
        app = create_app(jobs_file=handle.name, ndb_client=client)
        os.unlink(handle.name)
        http = werkzeug.test.Client(app)
        state = app.extensions["dedup"]
        base = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)

        def deliver(schedule_time: datetime.datetime, job_name: str = "bench") -> int:
            return http.post("/jobs/noop", headers={
                "X-CloudScheduler-JobName": job_name,
                "X-CloudScheduler-ScheduleTime": schedule_time.isoformat(),
            }).status_code

        def at(index: int) -> datetime.datetime:
            return base + datetime.timedelta(minutes=index)

        # Warm up connections and code paths.
        for index in range(20):
            deliver(at(-100 - index), "warmup")

        rows = [measure("fresh run", args.requests, lambda i: deliver(at(i)), counter, 200)]
        rows.append(measure("completed duplicate", args.requests, lambda i: deliver(at(0)), counter, 200))
        # An attempt that holds a live lease and never finishes.
        held = datetime.datetime(2031, 1, 1, tzinfo=datetime.timezone.utc)
        from dedup.keys import ScheduledRunKey

        run_id = ScheduledRunKey("", "", "bench", held).run_id
        with client.context():
            state.ledger.claim_run(run_id, RunDescription("scheduler", "noop"), RunPolicy(3600, 7200))
        rows.append(measure("in-progress duplicate", args.requests, lambda i: deliver(held), counter, 409))
        baseline = werkzeug.test.Client(plain_app(state.jobs["noop"], client))
        rows.append(measure("same job without dedup", args.requests,
                            lambda i: baseline.post("/plain").status_code, counter, 200))

    report = render(rows, args.requests)
    print(report)
    if not args.no_write:
        with open(RESULTS_FILE, "w", encoding="utf-8") as handle:
            handle.write(report)
        print(f"written to {os.path.relpath(RESULTS_FILE)}")
    return 0


def render(rows: list[dict], requests_: int) -> str:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"
    lines = [
        "# make bench: Datastore RPCs and latency per delivery outcome",
        "",
        f"{requests_} sequential requests per row, in-process Flask app, Datastore emulator "
        "(Firestore in Datastore mode) on loopback.",
        f"Machine: {machine}. Measured {datetime.date.today().isoformat()}.",
        "",
        "| outcome | RPCs / request | RPC breakdown | median ms | p95 ms |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['label']} | {row['rpcs']:g} | {row['breakdown'] or '-'} | "
                     f"{row['median']:.2f} | {row['p95']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
