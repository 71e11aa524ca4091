"""The schedule code at fleet size (issue 24 §7): start-up and one audit pass, at 100 and 1,000
Scheduler jobs, each with a schedule of its own.

Cloud Scheduler allows 1,000 jobs per region by default (5,000 at most).  Start-up is the
CPU a worker spends validating scheduler.yaml before it serves; the audit pass is one
/tasks/audit over every job, on loopback and at the benchmark's round-trip delay.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import yaml

from dedup.clock import ManualClock

FLEETS = (20, 200, 1000, 5000)
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
            memory_before = resident_mib()
            started = time.process_time()
            app = create_app(jobs_file=jobs_file, clock=clock, ndb_client=client)
            start_up = time.process_time() - started
            web = app.test_client()
            web.get("/api/v1/scheduler-jobs")  # the first request records the schedules
            bound_mib = resident_mib() - memory_before
            began = time.perf_counter()
            answer = web.get("/tasks/audit", headers={"X-Appengine-Cron": "true"}).get_json()
            audit_seconds = time.perf_counter() - began
            rows.append(
                {
                    "jobs": count,
                    "start_up_cpu_s": start_up,
                    "bound_mib": bound_mib,
                    "audit_pass_s": audit_seconds,
                    "missed": len(answer["missed"]),
                }
            )
    return rows


def resident_mib() -> float:
    """This process's resident memory (VmRSS), in MiB: what an app and its bound schedules add to it."""
    with open("/proc/self/status", encoding="ascii") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:")) / 1024


def uniform_fleet(count: int, prefix: str, schedule: str) -> dict[str, Any]:
    """scheduler.yaml for ``count`` Scheduler jobs of one ``schedule``, all calling ``noop``."""
    return {
        **scheduler_document(count),
        "jobs": {f"{prefix}-{n}": {"target": "noop", "schedule": schedule} for n in range(count)},
    }


def measured(counter: Any, call: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """``call(*args)``'s result, its wall and CPU seconds (this process), and the Datastore calls and
    entity reads it made (``counter``'s, from idle to idle)."""
    counter.wait_until_idle()
    counter.reset()
    began, cpu = time.perf_counter(), time.process_time()
    result = call(*args)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - began
    counter.wait_until_idle()
    return {
        "result": result,
        "s": wall,
        "cpu_s": cpu,
        "calls": sum(counter.snapshot().values()),
        "reads": counter.billed()["reads"],
    }


CRON = {"X-Appengine-Cron": "true"}


def _audit_pass(web: Any, queue: Any) -> Any:
    """One /tasks/audit, and the shares it dispatched (run on this process's threads)."""
    answer = web.get("/tasks/audit", headers=CRON)
    queue.wait(600)
    return answer


def _status_of(site: Any, url: str) -> int:
    return int(site.get(url).status_code)


# The audit's steady state: a pass every AUDIT_INTERVAL_SECONDS over per-minute Scheduler jobs,
# each with that interval's slots to judge (none delivered: each judged missed).
AUDIT_FLEETS = (20, 200, 1000, 5000)


def measure_audit(client: Any, counter: Any, counts: Sequence[int] = AUDIT_FLEETS) -> list[dict[str, Any]]:
    """For each fleet of per-minute Scheduler jobs: one steady-state audit pass (the one after the
    first), its wall seconds, and per Scheduler job its CPU milliseconds (this process: the app
    and NDB), its Datastore calls and its entity reads.  ``counter``: ``client``'s RpcCounter."""
    from schedules.config import AUDIT_INTERVAL_SECONDS

    rows = []
    for count in counts:
        # Just after the fleet's start_at: the first pass has a few slots a job, its marks are the fleet's.
        start = datetime.datetime(2030, 1, 1, 0, 3, tzinfo=datetime.UTC)
        with audited_fleet(client, count, ("minutely", "* * * * *"), start) as (web, queue, clock):
            clock.advance(AUDIT_INTERVAL_SECONDS)
            cost = measured(counter, _audit_pass, web, queue)
            rows.append(
                {
                    "jobs": count,
                    "pass_s": cost["s"],
                    "cpu_ms_per_job": cost["cpu_s"] / count * 1000,
                    "calls_per_job": cost["calls"] / count,
                    "reads_per_job": cost["reads"] / count,
                }
            )
    return rows


# The operator's pages over a fleet of 5-minute Scheduler jobs (a day's 288 slots each), one
# jobs.yaml job behind them all: what a view costs as the fleet grows (issue 37 §1).
PAGE_FLEETS = (20, 200, 1000, 5000)
PAGES = (("home", "/admin/"), ("a day's history", "/admin/jobs/noop/history?day=2030-01-01"))


@contextlib.contextmanager
def audited_fleet(
    client: Any, count: int, schedule: tuple[str, str], now: datetime.datetime, completed: bool = False
) -> Iterator[tuple[Any, Any, ManualClock]]:
    """The app on ``count`` Scheduler jobs of one ``schedule`` (name prefix, cron) at ``now``, after
    an audit pass and its shares: its test client, its dispatcher and its clock.  ``completed``:
    every slot of ``now``'s day ran once, as its day summary says (``completed_day``)."""
    from handlers import create_app

    with tempfile.TemporaryDirectory() as folder:
        jobs_file = fleet_files(count, folder, uniform_fleet(count, *schedule))
        clock = ManualClock(now)
        app = create_app(jobs_file=jobs_file, clock=clock, ndb_client=client)
        web, queue = app.test_client(), app.extensions["dedup"].dispatcher
        if completed:
            completed_day(client, app.extensions["dedup"], now)
        web.get("/tasks/audit", headers=CRON)  # every job's mark written
        queue.wait(600)  # and its shares, past the first 1,000 jobs (service.audits)
        yield web, queue, clock


def completed_day(client: Any, state: Any, now: datetime.datetime) -> None:
    """Each Scheduler job's day summary of ``now``'s day as its runs would have noted it had every
    slot of the day until ``now`` completed at its first attempt (schedules.summaries.note_run),
    written directly: a healthy fleet's day without a day of deliveries.  The records the notes stand for are not
    written; no page reads a noted slot's record."""
    from google.cloud import ndb

    from dedup.keys import format_utc
    from models import RunStatus
    from models.slot_day import SlotDay
    from schedules.config import history_id
    from schedules.slots import slots_between
    from schedules.summaries import RunDigest

    day = now.date()
    start = datetime.datetime.combine(day, datetime.time(), datetime.UTC)
    second = datetime.timedelta(seconds=1)
    with client.context():
        scheduler_jobs = state.bound_schedules  # bound (their histories recorded), as the app's own
        for first in range(0, len(scheduler_jobs), 50):  # a commit's 10 MiB: 50 per-minute days at most
            days = []
            for job in scheduler_jobs[first : first + 50]:
                slots = slots_between([job], start, now, 24 * 60)
                digests = {
                    format_utc(s.schedule_time): RunDigest(
                        job.declared.target,
                        RunStatus.COMPLETED,
                        1,
                        s.schedule_time + second,
                        s.schedule_time + 120 * second,
                    ).stored()
                    for s in slots
                }
                bucket = SlotDay.fresh(SlotDay.key_for(history_id(job.declared), day), day)
                bucket.runs = digests
                days.append(bucket)
            ndb.put_multi(days)


# A fleet's day: none of its slots delivered (every row needs attention, every slot is looked up),
# or every one completed (each row's summaries speak for its slots).
PAGE_DAYS = (("none delivered", False), ("all completed", True))


def measure_pages(client: Any, counter: Any, counts: Sequence[int] = PAGE_FLEETS) -> list[dict[str, Any]]:
    """For each fleet, each day (PAGE_DAYS) and each page: its wall seconds, this process's CPU
    seconds, its Datastore calls and its entity reads, at the end of the day, audited (as
    cron.yaml's pass every 15 minutes has)."""

    rows = []
    for count in counts:
        end_of_day = datetime.datetime(2030, 1, 1, 23, 59, tzinfo=datetime.UTC)
        for day, completed in PAGE_DAYS:
            prefix = "healthy-5" if completed else "every-5"  # each day's Scheduler jobs, marks and summaries
            with audited_fleet(client, count, (prefix, "*/5 * * * *"), end_of_day, completed) as (site, _, _):
                for label, url in PAGES:
                    site.get(url)  # the schedules bound and the fence checked: what a process pays once
                    cost = measured(counter, _status_of, site, url)
                    rows.append({"jobs": count, "day": day, "page": label, "status": cost.pop("result"), **cost})
    return rows


def render_pages(rows: list[dict[str, Any]]) -> str:
    return _table(
        "The operator's pages at fleet size (bench/fleet.py, measure_pages)",
        "5-minute Scheduler jobs behind one jobs.yaml job, at the end of a day of slots none of which\n"
        "was delivered, or all of which completed (their day summaries written as the runs would have\n"
        "noted them), audited; on loopback, this process's CPU.",
        ("Scheduler jobs", "day", "page", "status", "s", "CPU s", "Datastore calls", "entity reads"),
        [
            (
                f"{r['jobs']:,}",
                r["day"],
                r["page"],
                r["status"],
                f"{r['s']:.2f}",
                f"{r['cpu_s']:.2f}",
                r["calls"],
                f"{r['reads']:,}",
            )
            for r in rows
        ],
    )


def render_audit(rows: list[dict[str, Any]]) -> str:
    return _table(
        "The audit at fleet size (bench/fleet.py, measure_audit)",
        "Per-minute Scheduler jobs, none delivered; the pass after the first, 15 minutes on (15 slots\n"
        "a job to judge, each missed), on loopback; past 1,000 jobs the pass dispatches the rest in\n"
        "shares, run here on the process's threads and counted with it. Per Scheduler job: this\n"
        "process's CPU (the app and NDB), Datastore calls and entity reads.",
        ("Scheduler jobs", "pass, s", "CPU ms / job", "calls / job", "reads / job"),
        [
            (
                f"{r['jobs']:,}",
                f"{r['pass_s']:.1f}",
                f"{r['cpu_ms_per_job']:.2f}",
                f"{r['calls_per_job']:.3f}",
                f"{r['reads_per_job']:.1f}",
            )
            for r in rows
        ],
    )


def _table(title: str, intro: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A section of the report: its title, what it measured, and a markdown table."""
    lines = ["", f"## {title}", "", intro, "", f"| {' | '.join(header)} |", "|---" * len(header) + "|"]
    lines += [f"| {' | '.join(str(cell) for cell in row)} |" for row in rows]
    return "\n".join(lines) + "\n"


def render_fleet(loopback: list[dict[str, Any]], delayed: list[dict[str, Any]] | None, rtt_ms: float) -> str:
    lines = [
        "",
        "## At fleet size (bench/fleet.py)",
        "",
        "Scheduler jobs with a schedule each (daily, distinct times); one audit pass over a day of",
        "slots none of which was delivered (each judged missed and logged). Memory: what building",
        "the app and its first request (which records the schedules) added to this process's RSS.",
        "",
        "| Scheduler jobs | start-up CPU, s | memory, MiB | audit pass, loopback, s |"
        + (f" audit pass, {rtt_ms:g} ms round trip, s |" if delayed else ""),
        "|---|---|---|---|" + ("---|" if delayed else ""),
    ]
    for index, row in enumerate(loopback):
        line = f"| {row['jobs']:,} | {row['start_up_cpu_s']:.2f} | {row['bound_mib']:.1f} | {row['audit_pass_s']:.1f} |"
        if delayed:
            line += f" {delayed[index]['audit_pass_s']:.1f} |"
        lines.append(line)
    return "\n".join(lines) + "\n"
