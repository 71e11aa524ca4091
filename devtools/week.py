"""`make screenshots`: a generated week of a 5-minute job with every fault, and a per-minute job's
night with an outage, and the pictures of them that docs/seeing-runs.md shows, taken from the app
as it serves them.

The week is delivered through the app itself (its Scheduler target, in process, on a clock
stepped slot by slot), so every record is one the protocol wrote: 2,016 slots of
``invoice-5min`` from Monday 2030-01-07, with duplicate deliveries, permanent failures,
released runs Scheduler's retry completes, deliveries too late to run, slots never
delivered, a two-hour pause, and a run stuck on the last day.  Beside it ``sync-1min`` runs every
minute of the night (22:00 to 07:00 UTC), from the night before the last day: that night it has
a 28-minute outage, 13 permanent failures, a run that hangs and a delivery too late to run.
``plan()`` and ``sync_plan()`` say what each slot should end as, so a test can hold every view to
them (tests/test_week.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dedup.clock import ManualClock
from dedup.errors import PermanentJobError, RetryableJobError

WEEK_START = datetime.datetime(2030, 1, 7, tzinfo=datetime.UTC)  # a Monday
SLOTS = 7 * 288
STEP = datetime.timedelta(minutes=5)
PAUSE = (datetime.timedelta(days=1, hours=2), datetime.timedelta(days=1, hours=4))  # Tuesday 02:00-04:00
SCOPE = "?project=acme-prod&location=us-central1"
JOBS = """
jobs:
  invoice:
    kind: python
    target: devtools.week:invoice
    lease_seconds: 60
    retention_seconds: 1209600
    max_delay_seconds: 600
  sync:
    kind: python
    target: devtools.week:sync
    lease_seconds: 60
    retention_seconds: 1209600
    max_delay_seconds: 60
"""
SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-07T00:00:00Z"}
jobs:
  invoice-5min:
    target: invoice
    schedule: "*/5 * * * *"
    retry: {retry_count: 2, min_backoff: 1m, max_retry_duration: 10m}
  sync-1min:
    target: sync
    schedule: "* 22-23,0-6 * * *"
    start_at: "{sync_start}"
"""
NIGHT = (datetime.timedelta(hours=-2), datetime.timedelta(hours=7))  # of the last day: 22:00 to 07:00
# The per-minute night's faults, by the time after the night's start (22:00): an outage of 28
# minutes (02:00 to 02:27), 13 permanent failures (03:00 to 03:12), a hang (04:00), a late delivery (05:00).
SYNC_FAULTS = {
    **{datetime.timedelta(hours=4, minutes=m): "undelivered" for m in range(28)},
    **{datetime.timedelta(hours=5, minutes=m): "permanent" for m in range(13)},
    datetime.timedelta(hours=6): "stuck",
    datetime.timedelta(hours=7): "late",
}
SHOTS = ("home", "home-phone", "last-night", "night-window", "night-window-phone", "failed-run")


@dataclasses.dataclass(frozen=True)
class SlotPlan:
    """What one slot of the week is made to go through, and what it should end as."""

    index: int
    schedule_time: datetime.datetime
    fault: str  # "", "duplicate", "permanent", "released", "late", "undelivered", "paused", "stuck"

    @property
    def ends_as(self) -> str:
        return {
            "": "completed",
            "duplicate": "completed",
            "released": "completed",
            "permanent": "failed",
            "late": "skipped",
            "undelivered": "missed",
            "paused": "paused",
            "stuck": "stuck",
        }[self.fault]

    @property
    def attempts(self) -> int:
        """The attempts its run takes: released once then completed, 2; too late to run, none."""
        return {"released": 2, "late": 0, "undelivered": 0, "paused": 0}.get(self.fault, 1)

    @property
    def duplicates(self) -> int:
        return 2 if self.fault == "duplicate" else 0


def plan(days: int = 7) -> list[SlotPlan]:
    """The week (or its first ``days``), slot by slot: a fault every few slots, none two ways at once."""
    slots = []
    for index in range(days * 288):
        when = WEEK_START + index * STEP
        since_start = when - WEEK_START
        fault = ""
        if PAUSE[0] <= since_start < PAUSE[1]:
            fault = "paused"
        elif index == days * 288 - 60:  # the last day's 19:00 (Sunday's): claimed, never finished
            fault = "stuck"
        elif index % 97 == 5:
            fault = "undelivered"
        elif index % 131 == 7:
            fault = "permanent"
        elif index % 173 == 11:
            fault = "released"
        elif index % 211 == 13:
            fault = "late"
        elif index % 7 == 3:
            fault = "duplicate"
        slots.append(SlotPlan(index, when, fault))
    return slots


@dataclasses.dataclass(frozen=True)
class SyncPlan:
    """One slot of ``sync-1min``: its time, its fault, and what it should end as."""

    schedule_time: datetime.datetime
    fault: str  # "", "undelivered", "permanent", "stuck", "late"

    @property
    def ends_as(self) -> str:
        return {"": "completed", "undelivered": "missed", "permanent": "failed", "stuck": "stuck", "late": "skipped"}[
            self.fault
        ]


def night_start(days: int = 7) -> datetime.datetime:
    """22:00 UTC before the last of ``days``: the night "last night" is when the week is over."""
    return WEEK_START + datetime.timedelta(days=days - 1) + NIGHT[0]


def sync_plan(days: int = 7) -> list[SyncPlan]:
    """``sync-1min``'s slots from the night before the last day to the week's end, oldest first."""
    start = night_start(days)
    end = WEEK_START + datetime.timedelta(days=days)
    slots, when = [], start
    while when < end:
        if when.hour >= 22 or when.hour < 7:
            slots.append(SyncPlan(when, SYNC_FAULTS.get(when - start, "")))
        when += datetime.timedelta(minutes=1)
    return slots


def last_night(days: int = 7) -> list[SyncPlan]:
    """``sync-1min``'s slots of last night (22:00 to 07:00 UTC, DEDUP_NIGHT's default)."""
    start = night_start(days)
    return [slot for slot in sync_plan(days) if slot.schedule_time < start + NIGHT[1] - NIGHT[0]]


# What the job does per slot, by job and schedule time: set by build_week, read by invoice() and sync().
FAULTS: dict[str, list[str]] = {}
_lock = threading.Lock()


def sync(context: Any) -> dict[str, Any]:
    """The per-minute job: it fails as ``sync_plan`` says."""
    key = "sync:" + (context.schedule_time.isoformat() if context.schedule_time else "")
    with _lock:
        steps = FAULTS.get(key) or []
        step = steps.pop(0) if steps else None
    if step == "permanent":
        raise PermanentJobError("the CRM refused the batch", details={"code": "REFUSED"})
    return {"synced": key}


def invoice(context: Any) -> dict[str, Any]:
    """The week's job: it fails as the plan says, attempt by attempt."""
    key = context.schedule_time.isoformat() if context.schedule_time else ""
    with _lock:
        steps = FAULTS.get(key) or []
        step = steps.pop(0) if steps else None
    if step == "permanent":
        raise PermanentJobError("the invoice was rejected", details={"code": "REJECTED"})
    if step == "retryable":
        raise RetryableJobError("the bank is busy")
    return {"invoiced": key}


def build_week(
    folder: Path, ndb_client: Any, days: int = 7, each_hour: Callable[[Any, ManualClock], None] | None = None
) -> tuple[Any, ManualClock]:
    """The app on the week's jobs and schedule, its records written by delivering the week (or its
    first ``days``: bench/pages.py compares pages over more and fewer records).  ``each_hour`` is
    called with the site and the clock before each hour's first slot is delivered (the audit's
    passes and a recount, in tests/test_summaries.py)."""
    import webtest  # type: ignore[import-untyped]  # a dev tool: webtest is a dev requirement

    from dedup.keys import format_utc
    from handlers import create_app

    folder.mkdir(parents=True, exist_ok=True)
    schedules = textwrap.dedent(SCHEDULES).replace("{sync_start}", format_utc(night_start(days)))
    (folder / "scheduler.yaml").write_text(schedules)
    (folder / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    clock = ManualClock(min(WEEK_START, night_start(days)) - datetime.timedelta(minutes=1))
    app = create_app(jobs_file=str(folder / "jobs.yaml"), clock=clock, ndb_client=ndb_client)
    site = webtest.TestApp(app)
    site.get("/api/v1/scheduler-jobs")
    paused = False
    nightly = iter(sync_plan(days))
    pending = next(nightly, None)

    def sync_until(until: datetime.datetime) -> None:
        """Deliver ``sync-1min``'s slots before ``until``, each as its plan says."""
        nonlocal pending
        while pending is not None and pending.schedule_time < until:
            _deliver_sync(site, clock, ndb_client, pending)
            pending = next(nightly, None)

    for slot in plan(days):
        sync_until(slot.schedule_time)
        if each_hour is not None and slot.index % 12 == 0:
            clock.advance((slot.schedule_time - clock.now()).total_seconds())
            each_hour(site, clock)
        clock.advance((slot.schedule_time + datetime.timedelta(seconds=4) - clock.now()).total_seconds())
        if slot.fault == "paused" and not paused:
            site.post_json("/api/v1/scheduler-jobs/invoice-5min/pause", {"note": "bank maintenance"})
            paused = True
        elif slot.fault != "paused" and paused:
            site.post_json("/api/v1/scheduler-jobs/invoice-5min/resume", {"catch_up": "none"})
            paused = False
        headers = {
            "X-CloudScheduler": "true",
            "X-CloudScheduler-JobName": "invoice-5min",
            "X-CloudScheduler-ScheduleTime": format_utc(slot.schedule_time),
        }

        def deliver(headers: dict[str, str] = headers) -> Any:
            return site.post(f"/jobs/invoice{SCOPE}", b"", headers=headers, status="*")

        with _lock:
            FAULTS[slot.schedule_time.isoformat()] = {"permanent": ["permanent"], "released": ["retryable"]}.get(
                slot.fault, []
            )
        if slot.fault in ("undelivered", "paused"):
            continue
        if slot.fault == "stuck":
            _hang(ndb_client, clock, "invoice", "invoice-5min", slot.schedule_time)
            continue
        if slot.fault == "late":
            clock.advance(20 * 60)  # delivered 20 minutes late: past max_delay_seconds
        deliver()
        if slot.fault == "released":  # Scheduler's retry, a minute on, completes it
            clock.advance(60)
            deliver()
        for _ in range(slot.duplicates):
            deliver()
    sync_until(WEEK_START + datetime.timedelta(days=days))
    # Monday 00:00:30, the week over: "last night" is Saturday 22:00 to Sunday 07:00, and Sunday the last day.
    clock.advance((WEEK_START + datetime.timedelta(days=days, seconds=30) - clock.now()).total_seconds())
    return app, clock


def _hang(ndb_client: Any, clock: ManualClock, job: str, name: str, schedule_time: datetime.datetime) -> None:
    """The slot's delivery claimed by a worker that then hung: its run never finishes (``stuck``)."""
    from dedup.keys import format_utc, scheduled_run_key
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    key = scheduled_run_key(name, format_utc(schedule_time), query_project="acme-prod", query_location="us-central1")
    description = RunDescription("scheduler", job, name, schedule_time, project="acme-prod", location="us-central1")
    with ndb_client.context():
        Ledger(clock).claim_run(key.run_id, description, RunPolicy(60, 1209600))


def _deliver_sync(site: Any, clock: ManualClock, ndb_client: Any, slot: SyncPlan) -> None:
    """One slot of ``sync-1min``, delivered (or not, or held) as its plan says."""
    from dedup.keys import format_utc

    clock.advance((slot.schedule_time + datetime.timedelta(seconds=2) - clock.now()).total_seconds())
    with _lock:
        FAULTS["sync:" + slot.schedule_time.isoformat()] = ["permanent"] if slot.fault == "permanent" else []
    if slot.fault == "undelivered":
        return
    if slot.fault == "stuck":
        _hang(ndb_client, clock, "sync", "sync-1min", slot.schedule_time)
        return
    if slot.fault == "late":
        clock.advance(3 * 60)  # delivered 3 minutes late: past max_delay_seconds
    headers = {
        "X-CloudScheduler": "true",
        "X-CloudScheduler-JobName": "sync-1min",
        "X-CloudScheduler-ScheduleTime": format_utc(slot.schedule_time),
    }
    site.post(f"/jobs/sync{SCOPE}", b"", headers=headers, status="*")


def expected_counts(day: int) -> Counter[str]:
    """What the plan says day ``day`` (0: Monday) of the week ends as, slot by slot."""
    return Counter(slot.ends_as for slot in plan() if slot.index // 288 == day)


def ran_once_or_more(slots: Iterable[SlotPlan]) -> tuple[int, int]:
    """Of the slots that end completed, those that ran at their first attempt and those that took more."""
    done = [slot for slot in slots if slot.ends_as == "completed"]
    once = sum(1 for slot in done if slot.attempts == 1)
    return once, len(done) - once


def take_screenshots(app: Any, clock: ManualClock, into: Path) -> list[Path]:
    """The pictures docs/seeing-runs.md shows: the home page (desktop and phone), the last day's
    history, the home page over last night (desktop and phone) and a failed run's page, from the
    app serving the week."""
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from devtools import POLL_SECONDS

    into.mkdir(parents=True, exist_ok=True)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()
    site = f"http://127.0.0.1:{server.server_port}"
    chromium = os.environ.get("CHROMIUM") or "/usr/bin/chromium"
    taken = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            desktop = browser.new_page(viewport={"width": 1280, "height": 900})
            phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
            last_night = (clock.now() - datetime.timedelta(days=1)).date().isoformat()
            shots = {
                "home": (desktop, "/admin/"),
                "home-phone": (phone, "/admin/"),
                "last-night": (desktop, f"/admin/jobs/invoice/history?day={last_night}"),
                "night-window": (desktop, "/admin/?window=night"),
                "night-window-phone": (phone, "/admin/?window=night"),
            }
            for name, (page, path) in shots.items():
                page.goto(site + path)
                taken.append(into / f"{name}.png")
                page.screenshot(path=str(taken[-1]))  # what the screen shows first
                if name == "last-night":
                    print(f"last night ({last_night}): {page.locator('#day-summary').inner_text()}", flush=True)
            desktop.goto(f"{site}/admin/jobs/invoice/history?day={last_night}&status=failed")
            failed = desktop.locator("tr.slot-row a").first
            if failed.count():
                failed.click()
                desktop.wait_for_selector("#attempts")
            taken.append(into / "failed-run.png")
            desktop.screenshot(path=str(taken[-1]), full_page=True)
            browser.close()
    finally:
        server.shutdown()
    return taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", default="docs/images", help="where the screenshots go (default: docs/images)")
    args = parser.parse_args(argv)
    import tempfile

    from google.cloud import ndb

    from devtools.emulator import DatastoreEmulator
    from devtools.google_fakes import GoogleFakes

    os.environ.setdefault("DEDUP_AUTH", "none")  # local and loopback only, as make run serves it
    fakes = GoogleFakes()  # Cloud Scheduler's stand-in (the pause) and a metadata server for credentials
    os.environ.update(
        {"GCE_METADATA_HOST": fakes.host, "GCE_METADATA_IP": fakes.host, "DEDUP_SCHEDULER_API_BASE": fakes.url}
    )
    with DatastoreEmulator() as emulator, tempfile.TemporaryDirectory() as folder:
        os.environ.update(emulator.env)
        client = ndb.Client(project=emulator.project)
        print(f"delivering a week of invoice-5min ({SLOTS} slots) through the app...", flush=True)
        # The job (devtools.week:invoice) reads the faults of the module jobs.yaml names, which,
        # run as python -m devtools.week, is not this __main__: build the week through that one.
        from devtools import week

        app, clock = week.build_week(Path(folder), client)
        for path in week.take_screenshots(app, clock, Path(args.into)):
            print(f"wrote {path}")
    fakes.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
