"""`make bench`: Datastore RPCs and latency per delivery outcome, with and without dedup.

Runs the Flask app in-process against a fresh Datastore emulator, counting
RPCs on the wire with a gRPC interceptor.  Latency includes Flask, NDB and
the emulator round trips on this machine; compare the rows, not the
absolute numbers, with production.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time

import werkzeug.test
from flask import Flask

from bench import memory, steps, warmup
from bench.fleet import (
    AUDIT_FLEETS,
    FLEETS,
    PAGE_FLEETS,
    measure_audit,
    measure_fleet,
    measure_pages,
    render_audit,
    render_fleet,
    render_pages,
)
from dedup import fence_check, fence_probe
from devtools.emulator import DatastoreEmulator
from devtools.rpc_counter import counting_client

BENCH_JOBS = """\
jobs:
  noop:
    kind: python
    target: bench.jobs:noop
    lease_seconds: 600
  half-second:
    kind: python
    target: bench.jobs:half_second
    lease_seconds: 60
  exclusive:
    kind: python
    target: bench.jobs:noop
    lease_seconds: 600
    overlap: forbid
"""
# The recorded results the docs quote (written with --record, make bench RECORD=1), and where
# every other run goes: an ignored file, so a trial run never rewrites a tracked one.
RESULTS_FILE = os.path.join(os.path.dirname(__file__), "results.md")
LAST_RUN_FILE = os.path.join(os.path.dirname(__file__), "last-run.md")
ORIGINAL = "original pattern"  # bench/original_pattern.py: two transactions, no fast path


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def answer_of(response) -> tuple[int, bool]:
    """A call's status and whether it was a replay (``Idempotent-Replayed``, or the original pattern's
    ``duplicate``); a bare status (a ledger call) is no replay."""
    if isinstance(response, int):
        return response, False
    body = response.get_json(silent=True)
    duplicate = isinstance(body, dict) and body.get("duplicate") is True
    return response.status_code, duplicate or response.headers.get("Idempotent-Replayed") == "true"


def measure(label: str, requests_: int, call, counter, expect_status: int, replayed: bool = False) -> dict:
    """``requests_`` calls one after another: RPCs, entities billed, round trips and latency per call.

    Each answer must have ``expect_status`` and be a replay exactly when ``replayed``: a row of
    duplicates whose job ran again, or of fresh runs answered from a record, stops the bench.

    Sequential round trips are counted on the wire (``RpcCounter.sequential_round_trips``)
    among the calls answered before the response was: a rollback sent without waiting is
    not on the answer's path.  The row reports the median request's count, as it does for
    latency: on a loaded machine a thread that sends two calls together can be descheduled
    between the sends, and one such request must not move the figure the design sets.
    """
    latencies, cpu, trips = [], [], []
    calls: collections.Counter[str] = collections.Counter()
    billed: collections.Counter[str] = collections.Counter()
    for index in range(requests_):
        counter.wait_until_idle()
        counter.reset()
        started, cpu_started = time.perf_counter(), time.process_time()
        response = call(index)
        answered = time.monotonic()
        latencies.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)  # this process's threads, gRPC's included
        status, was_replayed = answer_of(response)
        if status != expect_status or was_replayed != replayed:
            raise SystemExit(
                f"{label}: expected {expect_status}{' (a replay)' if replayed else ''}, got {status}"
                f"{' (a replay)' if was_replayed else ''}"
            )
        trips.append(counter.sequential_round_trips(until=answered))
        counter.wait_until_idle()
        calls.update(counter.snapshot())
        billed.update(counter.billed())
    return {
        "label": label,
        "requests": requests_,
        "rpcs": sum(calls.values()) / requests_,
        "breakdown": ", ".join(f"{name} {count / requests_:g}" for name, count in sorted(calls.items())),
        "trips": statistics.median(trips),
        "reads": billed["reads"] / requests_,
        "writes": billed["writes"] / requests_,
        "deletes": billed["deletes"] / requests_,
        "median": statistics.median(latencies),
        "p95": percentile(latencies, 0.95),
        "cpu": statistics.median(cpu),
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

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)  # type: ignore[method-assign]  # Flask's middleware hook, typed as a method
    return app


# The fleet sizes each group of fleet rows measures: its flag, its default, and what it measures.
FLEET_FLAGS = (
    ("--fleet", FLEETS, "the fleet rows measure (daily schedules: start-up, one audit pass)"),
    ("--audit-fleet", AUDIT_FLEETS, "the audit rows measure (per-minute schedules: one steady-state pass)"),
    ("--page-fleet", PAGE_FLEETS, "the page rows measure (5-minute schedules: the home page, a day's history)"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    written = parser.add_mutually_exclusive_group()
    written.add_argument("--no-write", action="store_true", help="print only; write no file")
    written.add_argument(
        "--record",
        action="store_true",
        help="write bench/results.md, the results the docs quote (default: bench/last-run.md, ignored by git)",
    )
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent duplicates of one execution")
    parser.add_argument("--throughput-requests", type=int, default=400, help="distinct runs per throughput row")
    for flag, default, measured in FLEET_FLAGS:
        parser.add_argument(flag, type=int, nargs="*", default=list(default), help=f"Scheduler job counts {measured}")
    parser.add_argument("--cleanup-records", type=int, default=5000, help="the expired backlog the cleanup row deletes")
    parser.add_argument(
        "--memory-runs",
        type=int,
        nargs="+",
        default=list(memory.CHECKPOINTS),
        help="the fresh runs after which a gunicorn worker's memory is read (bench/memory.py), ascending",
    )
    parser.add_argument(
        "--warmup-rounds", type=int, default=3, help="fresh gunicorn starts per case of the warmup section"
    )
    parser.add_argument("--step-runs", type=int, default=20, help="runs per case of the steps section (bench/steps.py)")
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0,
        help="also measure with this Datastore round trip (half each way, through devtools.latency_proxy)",
    )
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency", "throughput_requests", "cleanup_records", "warmup_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not math.isfinite(args.rtt_ms) or args.rtt_ms < 0:
        parser.error("--rtt-ms must be a finite number of milliseconds, 0 or more")
    for flag, _, _ in FLEET_FLAGS:
        if any(count < 1 for count in getattr(args, flag[2:].replace("-", "_"))):
            parser.error(f"{flag} takes Scheduler job counts of 1 or more")
    if not memory.well_ordered(tuple(args.memory_runs)):
        parser.error("--memory-runs takes positive counts of fresh runs in ascending order")
    args.output = None if args.no_write else RESULTS_FILE if args.record else LAST_RUN_FILE
    return args


def measure_fleet_on(emulator: DatastoreEmulator, datastore_host: str, counts: list[int]) -> list[dict]:
    """bench/fleet.py's rows, with an NDB client of the emulator at ``datastore_host``."""
    from google.cloud import ndb

    os.environ["DATASTORE_EMULATOR_HOST"] = datastore_host
    try:
        return measure_fleet(ndb.Client(project=emulator.project), counts)
    finally:
        os.environ["DATASTORE_EMULATOR_HOST"] = emulator.host


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import logging

    from devtools.latency_proxy import DelayingProxy

    logging.getLogger("dedup.requests").setLevel(logging.ERROR)  # one line per request is noise here
    logging.getLogger("dedup.audit").setLevel(logging.CRITICAL)  # and one per missed slot of a fleet
    with DatastoreEmulator(project="dedup-bench") as emulator:
        os.environ.update(emulator.env)
        os.environ.setdefault("DEDUP_AUTH", "none")  # measure the ledger, not token checks
        rows = measure_rows(emulator, emulator.host, args.requests)
        fleet = measure_fleet_on(emulator, emulator.host, args.fleet)
        emulator.reset()
        audit_client, audit_counter = counting_client(emulator.project, emulator.host)
        audits = measure_audit(audit_client, audit_counter, args.audit_fleet)
        emulator.reset()
        page_rows = measure_pages(audit_client, audit_counter, args.page_fleet)
        cleanup = measure_cleanup(emulator, emulator.host, args.cleanup_records)
        delayed = delayed_fleet = delayed_cleanup = None
        if args.rtt_ms:
            host, port = emulator.host.rsplit(":", 1)
            with DelayingProxy(host, int(port), args.rtt_ms / 2) as proxy:
                emulator.reset()
                delayed = measure_rows(emulator, proxy.host, args.requests, first_minute=100_000)
                emulator.reset()  # the fleet's marks and records: the delayed pass starts fresh
                delayed_fleet = measure_fleet_on(emulator, proxy.host, args.fleet)
                delayed_cleanup = measure_cleanup(emulator, proxy.host, args.cleanup_records)
            os.environ["DATASTORE_EMULATOR_HOST"] = emulator.host
        emulator.reset()
        live = measure_live(emulator, args.concurrency, args.throughput_requests)
        emulator.reset()
        warm_starts = warmup.measure(emulator, args.warmup_rounds)
        emulator.reset()
        step_trips = steps.measure(emulator, args.step_runs)
    checkpoints = tuple(args.memory_runs)
    worker_memory = memory.measure(checkpoints)  # on an emulator of its own, after this one has stopped

    report = (
        render(rows, args.requests, delayed, args.rtt_ms)
        + render_live(live, args.concurrency, args.throughput_requests)
        + warmup.section(warm_starts, args.warmup_rounds)
        + steps.section(step_trips, args.step_runs)
        + render_cleanup(cleanup, delayed_cleanup, args.rtt_ms)
        + render_fleet(fleet, delayed_fleet, args.rtt_ms)
        + render_audit(audits)
        + render_pages(page_rows)
        + memory.section(checkpoints, worker_memory)
    )
    print(report)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(report)
        print(f"written to {os.path.relpath(args.output)}")
    return 0


def measure_rows(emulator, datastore_host: str, requests_: int, first_minute: int = 0) -> list[dict]:
    """Each outcome's RPCs and latency, the app's NDB client reaching Datastore at ``datastore_host``.

    ``first_minute`` keeps the schedule times of a second pass apart from the first's.
    """
    os.environ["DATASTORE_EMULATOR_HOST"] = datastore_host
    from bench import original_pattern
    from bench.original_pattern import original_pattern_app
    from dedup.keys import ScheduledRunKey
    from dedup.ledger import RunDescription, RunPolicy
    from handlers import create_app

    client, counter = counting_client(emulator.project)
    # The app checks the fence on a thread of its own; the rows wait for its answer, as a
    # process serving traffic would have it.
    fence = fence_probe.verify(client)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(BENCH_JOBS)
    jobs_path = handle.name
    app = create_app(jobs_file=jobs_path, ndb_client=client)
    http = werkzeug.test.Client(app)
    state = app.extensions["dedup"]
    # In the past (the app's clock is the real one): a schedule time ahead of the clock is a
    # Force run, keyed apart from its slot (schedules.slots.force_run_reason).
    base = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(minutes=first_minute)

    def at(index: int) -> datetime.datetime:
        return base + datetime.timedelta(minutes=index)

    def deliver(schedule_time: datetime.datetime, job_name: str = "bench", to=http):
        headers = {"X-CloudScheduler-JobName": job_name, "X-CloudScheduler-ScheduleTime": schedule_time.isoformat()}
        return to.post("/jobs/noop", headers=headers)

    # Another instance (its own memory of completed runs).
    elsewhere = werkzeug.test.Client(create_app(jobs_file=jobs_path, ndb_client=client))

    # A manual run (POST /api/v1/jobs/<id>/runs, a client token).
    def manual(token: str):
        body = json.dumps({"clientToken": token})
        return http.post("/api/v1/jobs/noop/runs", data=body, content_type="application/json")

    guarded = werkzeug.test.Client(guarded_app(client, state.ledger.clock))
    # A team's own view behind the library's decorator (docs/library.md): its own Deliveries and ledger.
    library = werkzeug.test.Client(library_app(client, state.ledger.clock))

    def decorated(schedule_time: datetime.datetime):
        headers = {"X-CloudScheduler-JobName": "bench-lib", "X-CloudScheduler-ScheduleTime": schedule_time.isoformat()}
        return library.post("/report", headers=headers)

    def guard(key: str):
        return guarded.post("/orders", json={"sku": "a"}, headers={"Idempotency-Key": key})

    baseline = werkzeug.test.Client(plain_app(state.jobs["noop"], client))
    original = werkzeug.test.Client(original_pattern_app(state.jobs["noop"], client))
    tag = f"{first_minute}"
    # Warm up connections and every row's code paths before the first row is measured.
    for index in range(50):
        deliver(at(-1000 - index), "warmup")
        deliver(at(-1000 - index), "warmup", to=elsewhere)
        baseline.post("/plain")
        deliver(at(-1000 - index), "warmup-original", to=original)
        manual(f"warmup-{tag}-{index}")
        guard(f"warmup-{tag}-{index}")
        decorated(at(-2000 - index))
        http.post(
            "/jobs/exclusive",
            headers={
                "X-CloudScheduler-JobName": "warmup-x",
                "X-CloudScheduler-ScheduleTime": at(-1000 - index).isoformat(),
            },
        )

    rows = [measure("fresh run", requests_, lambda i: deliver(at(i)), counter, 200)]
    # Where the fence is not verified (dedup/fence_check.py), as production's Firestore backend may
    # answer, and as the Firestore emulator does (whose transactions also begin on their own).
    database = fence_check.database_of(client)
    for begins_in_read, days, label in (
        (True, 700, "fresh run, transactional path"),
        (False, 800, "... begun by BeginTransaction"),
    ):
        fence_check.record(database, fence_check.FenceCheck(fence_check.FenceMode.TRANSACTION, "bench", begins_in_read))
        start = base + datetime.timedelta(days=days)
        rows.append(
            measure(label, requests_, lambda i, s=start: deliver(s + datetime.timedelta(minutes=i)), counter, 200)
        )
    fence_check.record(database, fence)
    rows.append(measure("completed duplicate, this instance", requests_, lambda i: deliver(at(0)), counter, 200, True))
    rows.append(  # each delivery a run the other instance has not seen
        measure(
            "completed duplicate, another instance",
            requests_,
            lambda i: deliver(at(i), to=elsewhere),
            counter,
            200,
            True,
        )
    )
    # An attempt that holds a live lease and never finishes.
    held = base + datetime.timedelta(days=365)
    run_id = ScheduledRunKey("", "", "bench", held).run_id
    with client.context():
        state.ledger.claim_run(run_id, RunDescription("scheduler", "noop"), RunPolicy(3600, 7200))
    rows.append(measure("in-progress duplicate", requests_, lambda i: deliver(held), counter, 409))
    # Refused before the ledger is asked: a schedule time that is not RFC 3339.
    bad = {"X-CloudScheduler-JobName": "bench", "X-CloudScheduler-ScheduleTime": "yesterday"}
    rows.append(measure("bad input (400)", requests_, lambda i: http.post("/jobs/noop", headers=bad), counter, 400))
    # One heartbeat renewal of a running attempt (every third of the lease while a job runs): claimed as a
    # delivery claims, so each renewal is fenced on the version of the one before.
    renewing = base + datetime.timedelta(days=500)
    with client.context():
        owner = state.ledger.replay_or_claim(
            ScheduledRunKey("", "", "bench", renewing).run_id,
            RunDescription("scheduler", "noop"),
            RunPolicy(3600, 7200),
        ).attempt

        def renew(_: int) -> int:
            return 200 if state.ledger.renew_lease(owner, 3600).__class__.__name__ == "Renewed" else 409

        rows.append(measure("heartbeat renewal (each)", requests_, renew, counter, 200))

    # A slot whose run was released (a retryable failure): its retry claims over the record, an
    # update fenced on the version the lookup read.  The same path serves an expired record, a
    # reopened one and a takeover of a lost lease.
    released = base + datetime.timedelta(days=600)
    with client.context():
        for index in range(requests_):
            key = ScheduledRunKey("", "", "bench", released + datetime.timedelta(minutes=index))
            claimed = state.ledger.replay_or_claim(
                key.run_id, RunDescription("scheduler", "noop"), RunPolicy(600, 7200)
            )
            state.ledger.release_run(claimed.attempt, {"message": "busy"})
    rows.append(
        measure(
            "fresh run over a released record",
            requests_,
            lambda i: deliver(released + datetime.timedelta(minutes=i)),
            counter,
            200,
        )
    )

    def exclusive(schedule_time: datetime.datetime):
        headers = {"X-CloudScheduler-JobName": "bench-x", "X-CloudScheduler-ScheduleTime": schedule_time.isoformat()}
        return http.post("/jobs/exclusive", headers=headers)

    rows.append(measure("overlap: forbid, fresh run", requests_, lambda i: exclusive(at(i)), counter, 200))

    rows.append(measure("manual run", requests_, lambda i: manual(f"bench-{tag}-{i}"), counter, 201))
    rows.append(measure("manual run, retried", requests_, lambda i: manual(f"bench-{tag}-0"), counter, 200, True))
    rows.append(measure("guarded endpoint", requests_, lambda i: guard(f"order-{tag}-{i}"), counter, 201))
    rows.append(measure("guarded endpoint, retried", requests_, lambda i: guard(f"order-{tag}-0"), counter, 201, True))
    rows.append(measure("library view: fresh run", requests_, lambda i: decorated(at(i)), counter, 200))
    rows.append(measure("library view: completed duplicate", requests_, lambda i: decorated(at(0)), counter, 200, True))
    rows.append(measure("same job without dedup", requests_, lambda i: baseline.post("/plain"), counter, 200))
    rows.append(
        measure(f"{ORIGINAL}: fresh run", requests_, lambda i: deliver(at(i), "original", to=original), counter, 200)
    )
    rows.append(
        measure(
            f"{ORIGINAL}: completed duplicate",
            requests_,
            lambda i: deliver(at(0), "original", to=original),
            counter,
            200,
            True,
        )
    )
    with client.context():  # a run the original pattern finds leased
        original_pattern.claim(original_pattern.run_id_of("original", held.isoformat()), "holder")
    rows.append(
        measure(
            f"{ORIGINAL}: in-progress duplicate",
            requests_,
            lambda i: deliver(held, "original", to=original),
            counter,
            409,
        )
    )
    os.unlink(jobs_path)
    return rows


def guarded_app(client, clock) -> Flask:
    """An endpoint of one's own behind @idempotent (docs/manual-runs.md), on the bench's client."""
    from dedup.adapters.flask_guard import idempotent, install_guard
    from dedup.ledger import Ledger
    from handlers import NdbContextMiddleware

    app = Flask("guarded")
    install_guard(app, Ledger(clock))

    @app.post("/orders")
    @idempotent("orders")
    def create_order():
        return {"order": "o-1"}, 201

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, client)  # type: ignore[method-assign]  # Flask's middleware hook, typed as a method
    return app


def library_app(client, clock) -> Flask:
    """A Flask view of one's own made exactly-once by the library's decorator, as
    examples/library_flask_app.py is, on the bench's client (no downstream: the protocol's cost)."""
    from dedup.adapters.flask import exactly_once
    from dedup.deliveries import Deliveries, DeliverySettings, ScheduledRun

    app = Flask("library")
    deliveries = Deliveries("bench-library", DeliverySettings(), client=client, clock=clock)

    @app.post("/report")
    @exactly_once(deliveries)
    def report(run: ScheduledRun) -> dict[str, object]:
        return {"sent": True, "attempt": run.attempt}

    return app


def measure_live(emulator, concurrency: int, throughput_requests: int) -> dict:
    """Against gunicorn over HTTP, as App Engine serves it (2 workers x 8 threads)."""
    import concurrent.futures
    import threading

    import requests

    from devtools.gunicorn import GunicornServer

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(BENCH_JOBS)
    results: dict = {}
    try:
        with (
            GunicornServer(emulator, handle.name, quiet=True) as server,
            GunicornServer(emulator, handle.name, app="bench.baseline_app:app", quiet=True) as baseline,
            GunicornServer(emulator, handle.name, app="bench.original_pattern:served()", quiet=True) as original,
        ):
            session = requests.Session()
            barrier = threading.Barrier(concurrency)

            def duplicate(_):
                barrier.wait()
                started = time.perf_counter()
                response = requests.post(
                    f"{server.url}/jobs/half-second",
                    timeout=60,
                    headers={
                        "X-CloudScheduler-JobName": "contended",
                        "X-CloudScheduler-ScheduleTime": "2032-01-01T00:00:00Z",
                    },
                )
                return response.status_code, (time.perf_counter() - started) * 1000

            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                outcomes = list(pool.map(duplicate, range(concurrency)))
            latencies = [ms for _, ms in outcomes]
            results["contention"] = {
                "statuses": {
                    code: sum(1 for c, _ in outcomes if c == code) for code in sorted({c for c, _ in outcomes})
                },
                "median": statistics.median(latencies),
                "p95": percentile(latencies, 0.95),
                "max": max(latencies),
            }

            def throughput(url: str, label: str, pid: int) -> dict:
                # Keep-alive, as Cloud Scheduler's and Cloud Tasks' front ends reach an app: one
                # session per client thread, so no app's rate is capped by connection set-up.
                local = threading.local()

                def one(index: int) -> int:
                    client = getattr(local, "session", None) or requests.Session()
                    local.session = client
                    return client.post(
                        url,
                        timeout=60,
                        headers={
                            "X-CloudScheduler-JobName": f"tp-{label}",
                            "X-CloudScheduler-ScheduleTime": f"2033-01-01T00:00:00.{index:06d}Z",
                        },
                    ).status_code

                assert emulator.process is not None
                before = cpu_seconds(pid, emulator.process.pid)
                started = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(16) as pool:
                    codes = list(pool.map(one, range(throughput_requests)))
                elapsed = time.perf_counter() - started
                after = cpu_seconds(pid, emulator.process.pid)
                if set(codes) != {200}:
                    raise SystemExit(f"throughput {label}: unexpected statuses {sorted(set(codes))}")
                per_run = {part: (after[part] - before[part]) / throughput_requests * 1000 for part in after}
                return {"rate": throughput_requests / elapsed, "cpu_ms": per_run, "load": os.getloadavg()[0]}

            # Alternating rounds: the emulator's JVM swings between rounds (its JIT, its collector).
            assert server.process is not None and baseline.process is not None and original.process is not None
            for round_ in range(THROUGHPUT_ROUNDS):
                for key, served in (("with_dedup", server), ("original", original), ("without_dedup", baseline)):
                    assert served.process is not None
                    results.setdefault(key, []).append(
                        throughput(f"{served.url}/jobs/noop", f"{key}-{round_}", served.process.pid)
                    )
            session.close()
    finally:
        os.unlink(handle.name)
    return results


THROUGHPUT_ROUNDS = 3


def render_live(live: dict, concurrency: int, throughput_requests: int) -> str:
    contention = live["contention"]
    statuses = ", ".join(f"{count} x {code}" for code, count in contention["statuses"].items())
    return "\n".join(
        [
            "",
            "## Over HTTP, gunicorn 2 workers x 8 threads (gthread), as in app.yaml",
            "",
            f"{concurrency} concurrent deliveries of one execution (a 0.5 s job): {statuses}.",
            "",
            "| latency under contention | median ms | p95 ms | max ms |",
            "|---|---|---|---|",
            f"| {concurrency} duplicates | {contention['median']:.0f} | {contention['p95']:.0f} "
            f"| {contention['max']:.0f} |",
            "",
            *render_throughput(live, throughput_requests),
        ]
    )


THROUGHPUT_ROWS = (
    ("with_dedup", "with dedup"),
    ("original", ORIGINAL + " (two transactions)"),
    ("without_dedup", "without dedup (same job, no ledger)"),
)


def render_throughput(live: dict, throughput_requests: int) -> list[str]:
    """The throughput rounds: each app's median rate, and where each run's CPU went."""
    rows, cpu_of = [], {}
    for key, label in THROUGHPUT_ROWS:
        rounds = live[key]
        rate = statistics.median(r["rate"] for r in rounds)
        cpu = {part: statistics.median(r["cpu_ms"][part] for r in rounds) for part in rounds[0]["cpu_ms"]}
        cpu_of[key] = cpu["server"]
        rows.append(f"| {label} | {rate:.0f} | {cpu['server']:.1f} | {cpu['emulator']:.1f} | {cpu['client']:.1f} |")
    loads = [r["load"] for key, _ in THROUGHPUT_ROWS for r in live[key]]
    return [
        f"Throughput of distinct runs ({THROUGHPUT_ROUNDS} alternating rounds of {throughput_requests} runs of a "
        "no-op job per app, 16 keep-alive client threads; medians), and the CPU each run cost each process:",
        "",
        "| | runs / s | gunicorn CPU ms / run | emulator CPU ms / run | client CPU ms / run |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"gunicorn's CPU per run with dedup: {cpu_of['with_dedup'] / cpu_of['original']:.2f}x the original "
        f"pattern's, and {cpu_of['with_dedup'] - cpu_of['without_dedup']:.1f} ms more than the job without the "
        f"ledger. Load average during the rounds: {min(loads):.1f} to {max(loads):.1f} on "
        f"{os.cpu_count()} cores. The emulator's JVM and the client share those cores with gunicorn, so the "
        "rates say more of this machine than of production; compare the CPU per run.",
        "",
    ]


def cpu_seconds(server_pid: int, emulator_pid: int) -> dict[str, float]:
    """CPU seconds so far of the server's process tree, the emulator's, and this process (the client)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone since the listing
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick

    def tree(pid: int) -> float:
        return times.get(pid, 0.0) + sum(tree(child) for child in children.get(pid, []))

    own = os.times()
    return {"server": tree(server_pid), "emulator": tree(emulator_pid), "client": own.user + own.system}


def measure_cleanup(emulator, datastore_host: str, records: int) -> dict:
    """/tasks/cleanup's work (Ledger.clean_up) over a backlog of ``records`` expired records."""
    from google.cloud import ndb

    from dedup.clock import SystemClock
    from dedup.ledger import Ledger
    from models import RunRecord

    emulator.reset()
    os.environ["DATASTORE_EMULATOR_HOST"] = datastore_host
    try:
        client = ndb.Client(project=emulator.project)
        with client.context():
            now = datetime.datetime.now(datetime.UTC)
            old = now - datetime.timedelta(days=8)
            backlog = [
                RunRecord(
                    id=f"expired-{index:06d}",
                    source="scheduler",
                    job_id="noop",
                    status="completed",
                    attempt_id="a",
                    attempt=1,
                    lease_expires=old,
                    expire_at=now - datetime.timedelta(seconds=1),
                    created=old,
                    updated=old,
                    result={"rows": index},
                )
                for index in range(records)
            ]
            for start in range(0, records, 500):
                ndb.put_multi(backlog[start : start + 500])
            started = time.perf_counter()
            done = Ledger(SystemClock()).clean_up(budget_seconds=600)
            elapsed = time.perf_counter() - started
    finally:
        os.environ["DATASTORE_EMULATOR_HOST"] = emulator.host
    if done.deleted != records or done.more:
        raise SystemExit(f"cleanup: deleted {done.deleted} of {records}")
    return {"records": records, "seconds": elapsed, "per_second": records / elapsed, "batches": done.batches}


def render_cleanup(loopback: dict, delayed: dict | None, rtt_ms: float) -> str:
    from dedup.queries import CLEANUP_BATCH, CLEANUP_WORKERS
    from handlers.tasks import CLEANUP_BUDGET_SECONDS

    lines = [
        "",
        "## Cleanup without a TTL policy (/tasks/cleanup)",
        "",
        f"A backlog of {loopback['records']:,} expired records, deleted in batches of {CLEANUP_BATCH} "
        f"({loopback['batches']} batches; {CLEANUP_WORKERS} in flight beside the query), each deleted only if "
        f"unchanged since it was read. One call works for at most {CLEANUP_BUDGET_SECONDS} s.",
        "",
        "| Datastore round trip | records / s | so one call deletes at most |",
        "|---|---|---|",
    ]
    for label, row in (("loopback", loopback), (f"{rtt_ms:g} ms", delayed)):
        if row is not None:
            lines.append(f"| {label} | {row['per_second']:,.0f} | {row['per_second'] * CLEANUP_BUDGET_SECONDS:,.0f} |")
    return "\n".join(lines) + "\n"


def render(rows: list[dict], requests_: int, delayed: list[dict] | None = None, rtt_ms: float = 0) -> str:
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )
    lines = [
        "# make bench: Datastore RPCs, round trips, billed entities and latency per outcome",
        "",
        f"{requests_} sequential requests per row, in-process Flask app, Datastore emulator "
        "(Firestore in Datastore mode) on loopback.",
        f"Machine: {machine}. Measured {datetime.date.today().isoformat()}.",
        "",
        "Round trips: the longest chain of calls each sent after the one before was answered, among the calls "
        "answered before the response (counted on the wire; exact at a round-trip delay, below), for the "
        "median request. "
        "Entity reads count every key a lookup answers, found or missing; writes, every put.",
        "",
        "CPU: this process's CPU time per request (its threads, gRPC's included; the emulator's JVM is not).",
        "",
        "| outcome | RPCs / request | RPC breakdown | round trips | entity reads | entity writes "
        "| median ms | p95 ms | CPU ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['label']} | {row['rpcs']:g} | {row['breakdown'] or '-'} | {row['trips']:.1f} "
            f"| {row['reads']:g} | {row['writes']:g} | {row['median']:.2f} | {row['p95']:.2f} | {row['cpu']:.2f} |"
        )
    if delayed:
        lines += [
            "",
            f"## At {rtt_ms:g} ms Datastore round trip (`make bench RTT_MS={rtt_ms:g}`)",
            "",
            f"The same rows through `devtools/latency_proxy.py` ({rtt_ms / 2:g} ms each way, concurrent calls "
            "not serialised). Round trips counted on the wire, and as (median at this RTT - median at 0) / RTT.",
            "",
            "| outcome | median ms | p95 ms | round trips (counted) | round trips (from latency) |",
            "|---|---|---|---|---|",
        ]
        for fast, slow in zip(rows, delayed, strict=True):
            timed = (slow["median"] - fast["median"]) / rtt_ms
            lines.append(
                f"| {slow['label']} | {slow['median']:.2f} | {slow['p95']:.2f} | {slow['trips']:.1f} | {timed:.1f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
