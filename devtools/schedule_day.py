"""A day of schedule states, played against the app (issue 24 §8).

One hourly job through a day of what operators do and what goes wrong: a fresh deploy, a
Force run of each kind, a pause in an incident and a resume with catch-up (its tasks
delivered twice, and Scheduler's own late retry of a caught-up slot), a late run, and a
failure streak.  Afterwards the executions listing and the audit's lines must agree with
what the day did: no false miss, every slot once.

The day is written once, against a :class:`Site`: the app in-process (webtest on a
ManualClock: tests/test_schedule_day.py, in make check) or served by gunicorn
(:class:`GunicornSite`: real HTTP, two workers, on a clock file every worker reads,
devtools/stepped_app.py; make simulate and tests/test_simulated_day.py).  The job is an
http job calling an :class:`~devtools.simulate.EffectSink`, which counts the calls by run
id; its permanent failures are the sink's 422s.  The clock starts at T0, 2030-01-01T00:00Z,
and the app is first deployed at 00:30.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tempfile
import textwrap
from collections.abc import Mapping
from typing import Any, Protocol

import requests
import yaml

from dedup.keys import format_utc
from devtools.cloud_tasks_fake import CloudTasksFake, to_url
from devtools.effect_sink import EffectSink, Faults
from devtools.gunicorn import GunicornServer
from devtools.stepped_app import CLOCK_FILE_VARIABLE, FileClock
from schedules.config import SchedulerJob, parse_scheduler_document

T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
SCHEDULER_JOB = "invoice-hourly"
JOB_PATH = f"projects/acme-prod/locations/us-central1/jobs/{SCHEDULER_JOB}"
QUEUE = "projects/acme-prod/locations/us-central1/queues/dedup-dispatch"
CRON = {"X-Appengine-Cron": "true"}  # App Engine's cron marker: /tasks/audit as cron.yaml calls it
SCHEDULES = textwrap.dedent("""
    defaults:
      project: acme-prod
      location: us-central1
      attempt_deadline: 60s
      retry: {retry_count: 1, min_backoff: 1m}
    jobs:
      invoice-hourly:
        target: invoice
        schedule: "0 * * * *"
        finish_within: 10m
        alert_after_consecutive_failures: 2
""")
# What the listing must say of each slot from the hour before T0 to 11:00.
EXPECTED_STATUSES: dict[float, str] = {
    -1: "untracked",
    0: "untracked",  # before the deploy: not missed
    1: "completed",
    2: "completed",
    3: "completed",  # the Force run carrying its time did not take it
    4: "late",  # delivered 20 minutes late; finish_within is 10
    **{h: "completed" for h in range(5, 9)},  # paused, then caught up
    9: "failed",
    10: "failed",
    11: "completed",
}
FAILING = (9, 10)  # the slots whose call the downstream refuses for good: a streak of two


def at(hour: float) -> str:
    """The slot ``hour`` hours after T0, spelled as the app lists it."""
    return format_utc(T0 + datetime.timedelta(hours=hour))


def jobs_yaml(sink_url: str) -> str:
    return textwrap.dedent(f"""
        jobs:
          invoice:
            kind: http
            url: {sink_url}
            lease_seconds: 120
            timeout_seconds: 30
    """)


def scheduler_job() -> SchedulerJob:
    [job] = parse_scheduler_document(yaml.safe_load(SCHEDULES))
    return job


def slot_run_id(hour: float) -> str:
    from schedules.slots import Slot

    return Slot(scheduler_job(), T0 + datetime.timedelta(hours=hour)).run_id


@dataclasses.dataclass(frozen=True)
class AuditLine:
    severity: str
    outcome: str | None
    schedule_time: str | None


class Site(Protocol):
    """The app the day is played against, and its clock."""

    def deploy(self) -> None:
        """Start serving (the first deploy: the app first sees scheduler.yaml now)."""

    def set_clock(self, instant: datetime.datetime) -> None: ...

    def call(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One request; the status and the JSON answer (None if it is not JSON)."""

    def deliver_tasks(self, tasks: CloudTasksFake) -> None:
        """Cloud Tasks delivers every task twice."""

    def audit_lines(self) -> list[AuditLine]:
        """The audit's WARNING and ERROR lines so far."""


@dataclasses.dataclass
class Day:
    """What the day did, and what the app said of it."""

    statuses: dict[str, str]  # the listing's status per slot time
    unscheduled: list[dict[str, Any]]
    forced: list[str]  # the run ids the two Force runs were answered with
    caught_up: list[str]  # the slot times the resume dispatched
    received: dict[str, int]  # calls the downstream received per slot time (refused ones too)
    applied: dict[str, int]  # effects the downstream applied per slot time
    forced_applied: list[int]
    audit: list[AuditLine]
    task_answers: list[list[int]]  # per Cloud Tasks task, every answer its deliveries got
    late_retry: tuple[int, Any]  # Scheduler's own late retry of a caught-up slot


def play(site: Site, sink: EffectSink, tasks: CloudTasksFake) -> Day:
    """Play the day (module docstring) and collect what the app says of it."""
    clock = T0

    def move(instant: datetime.datetime) -> None:
        nonlocal clock
        clock = instant
        site.set_clock(instant)

    def deliver(hour: float) -> tuple[int, Any]:
        headers = {
            "X-CloudScheduler": "true",
            "X-CloudScheduler-JobName": SCHEDULER_JOB,
            "X-CloudScheduler-ScheduleTime": at(hour),
        }
        return site.call("POST", "/jobs/invoice?project=acme-prod&location=us-central1", headers=headers)

    def tick(hour: float, late_by: float = 10) -> None:
        """The clock to ``late_by`` seconds past the slot, and the slot delivered."""
        move(T0 + datetime.timedelta(hours=hour, seconds=late_by))
        deliver(hour)

    def audit() -> None:
        status, answer = site.call("GET", "/tasks/audit", headers=CRON)
        assert status == 200, (status, answer)

    sink.refused |= {slot_run_id(h) for h in FAILING}
    # 00:30: a fresh deploy. The day before it is untracked, not missed.
    move(T0 + datetime.timedelta(minutes=30))
    site.deploy()
    site.call("GET", "/api/v1/scheduler-jobs")
    audit()
    # 01:00 and 02:00 run. At 02:20 a Force run carrying 03:00 (the next slot's time), and one
    # carrying its own time; neither takes a slot.
    tick(1)
    tick(2)
    move(clock + datetime.timedelta(minutes=20))
    forced = [deliver(3)[1]["run_id"], deliver(2 + 1 / 3 + 0.0001)[1]["run_id"]]
    # 03:00 runs as itself; 04:00 is delivered 20 minutes late (finish_within is 10 minutes).
    tick(3)
    tick(4, late_by=1200)
    audit()
    # 04:30: an incident. Paused until 08:30; 05:00 to 08:00 are never delivered.
    move(T0 + datetime.timedelta(hours=4.5))
    status, answer = site.call(
        "POST", f"/api/v1/scheduler-jobs/{SCHEDULER_JOB}/pause", json_body={"note": "incident 4711"}
    )
    assert status == 200, (status, answer)
    move(clock + datetime.timedelta(hours=4))
    audit()
    status, answer = site.call("POST", f"/api/v1/scheduler-jobs/{SCHEDULER_JOB}/resume", json_body={"catch_up": "all"})
    assert status == 200, (status, answer)
    caught_up = [c["schedule_time"] for c in answer["caught_up"]]
    site.deliver_tasks(tasks)  # each task twice
    late_retry = deliver(7)  # and Scheduler's own late retry of a caught-up slot arrives too
    # 09:00 and 10:00 fail for good (the downstream refuses them): a streak of two alerts once.
    tick(9)
    tick(10)
    tick(11)
    move(clock + datetime.timedelta(hours=1))  # 12:10: every slot's window and deadline has passed
    audit()

    status, listing = site.call("GET", "/api/v1/jobs/invoice/executions", params={"since": at(-1), "until": at(12)})
    assert status == 200, (status, listing)
    hours = [h for h in EXPECTED_STATUSES if h >= 1]
    return Day(
        statuses={e["schedule_time"]: e["status"] for e in listing["executions"]},
        unscheduled=listing["unscheduled"],
        forced=forced,
        caught_up=caught_up,
        received={at(h): sink.received[slot_run_id(h)] for h in hours},
        applied={at(h): sink.effects[slot_run_id(h)] for h in hours},
        forced_applied=[sink.effects[run_id] for run_id in forced],
        audit=site.audit_lines(),
        task_answers=[list(task.answers) for task in tasks.tasks],
        late_retry=late_retry,
    )


def disagreements(day: Day) -> list[str]:
    """Where what the app says of the day differs from what the day did (empty: none)."""
    problems = []
    expected = {at(h): status for h, status in EXPECTED_STATUSES.items()}
    if day.statuses != expected:
        wrong = {t: (day.statuses.get(t), s) for t, s in expected.items() if day.statuses.get(t) != s}
        problems.append(f"the listing disagrees (slot: listed, expected): {wrong}")
    if sorted(run["run_id"] for run in day.unscheduled) != sorted(day.forced):
        problems.append(f"the Force runs are not what the listing shows apart: {day.unscheduled}")
    if {run["source"] for run in day.unscheduled} != {"force_run"}:
        problems.append(f"runs apart from the slots that are no Force runs: {day.unscheduled}")
    if day.forced_applied != [1, 1]:
        problems.append(f"the Force runs took effect {day.forced_applied} times, not once each")
    if any(count != 1 for count in day.received.values()):
        problems.append(f"a slot reached the downstream other than once: {day.received}")
    applied = {at(h): 0 if h in FAILING else 1 for h in EXPECTED_STATUSES if h >= 1}
    if day.applied != applied:
        problems.append(f"effects per slot {day.applied}, expected {applied}")
    if day.caught_up != [at(h) for h in range(5, 9)]:
        problems.append(f"the resume caught up {day.caught_up}, not 05:00 to 08:00")
    if len(day.task_answers) != 4 or any(sum(200 <= a < 300 for a in answers) != 2 for answers in day.task_answers):
        problems.append(f"not every task was delivered twice, both acknowledged: {day.task_answers}")
    if day.late_retry[0] != 200 or (day.late_retry[1] or {}).get("run_id") != slot_run_id(7):
        problems.append(f"Scheduler's late retry of a caught-up slot was not answered as that run: {day.late_retry}")
    said = sorted((line.outcome or "", line.schedule_time or "") for line in day.audit if line.severity == "ERROR")
    if said != [("failing", ""), ("late", at(4))]:
        problems.append(f"the audit's ERROR lines were {said}, not one for the streak and one for the late run")
    if any(line.outcome == "missed" for line in day.audit):
        problems.append("the audit reported a slot missed: a pause or the deploy taken for a miss")
    return problems


def report(day: Day) -> str:
    """The day as a table: each slot's status and its calls downstream, then the audit's lines."""
    rows = [f"{'slot':<28} {'listed':>10} {'calls':>5} {'applied':>7}"]
    for time_text, status in sorted(day.statuses.items()):
        rows.append(
            f"{time_text:<28} {status:>10} {day.received.get(time_text, 0):>5} {day.applied.get(time_text, 0):>7}"
        )
    for run_id, applied in zip(day.forced, day.forced_applied, strict=True):
        rows.append(f"{'Force run ' + run_id[:12]:<28} {'apart':>10} {'':>5} {applied:>7}")
    rows.append(
        f"caught up on resume: {', '.join(t[11:16] for t in day.caught_up)}; Cloud Tasks' answers per task: "
        f"{day.task_answers}; Scheduler's late retry of 07:00: {day.late_retry[0]}"
    )
    rows += [f"audit {line.severity}: {line.outcome} {line.schedule_time or ''}".rstrip() for line in day.audit]
    return "\n".join(rows)


def on_gunicorn(emulator: Any) -> tuple[Day, dict[str, str]]:
    """The day on gunicorn with its own stand-ins (make simulate): the day, and the Scheduler
    stand-in's job states at its end.  The caller's environment is left as it was."""
    import random

    from devtools.google_fakes import GoogleFakes

    google, tasks = GoogleFakes(), CloudTasksFake()
    sink = EffectSink(Faults(transient=0, slow=0), slow_seconds=0, rng=random.Random(5))
    config = tempfile.mkdtemp(prefix="gcloud-config-")
    env: dict[str, str | None] = {
        # google-auth finds the metadata stand-in as it finds App Engine's, and no user credentials.
        "GCE_METADATA_HOST": google.host,
        "GCE_METADATA_IP": google.host,
        "GOOGLE_APPLICATION_CREDENTIALS": None,
        "CLOUDSDK_CONFIG": config,
        "DEDUP_SCHEDULER_API_BASE": google.url,
        "DEDUP_TASKS_API_BASE": tasks.url,
        "DEDUP_TASKS_TRANSPORT": "rest",  # the stand-in speaks REST
    }
    site = GunicornSite(emulator, sink, env)
    try:
        return play(site, sink, tasks), dict(google.scheduler_states)
    finally:
        site.close()
        for server in (sink.server,):
            server.shutdown()
            server.server_close()
        google.close()
        tasks.close()


class GunicornSite:
    """The app served by gunicorn (two workers, threads), on a clock file every worker reads."""

    def __init__(self, emulator: Any, sink: EffectSink, extra_env: Mapping[str, str | None]) -> None:
        self.emulator = emulator
        self.folder = tempfile.mkdtemp(prefix="schedule-day-")
        self.clock = FileClock(os.path.join(self.folder, "clock"))
        self.log_path = os.path.join(self.folder, "app.log")
        with open(os.path.join(self.folder, "scheduler.yaml"), "w", encoding="utf-8") as handle:
            handle.write(SCHEDULES)
        self.jobs_file = os.path.join(self.folder, "jobs.yaml")
        with open(self.jobs_file, "w", encoding="utf-8") as handle:
            handle.write(jobs_yaml(sink.url))
        self.extra_env: dict[str, str | None] = {
            CLOCK_FILE_VARIABLE: self.clock.path,
            "DEDUP_AUTH": "none",  # local, as make run: the markers the day sends are taken as they come
            "DEDUP_LOG_FORMAT": "json",
            "DEDUP_TASKS_QUEUE": QUEUE,
            **extra_env,
        }
        self.server: GunicornServer | None = None

    def deploy(self) -> None:
        self.server = GunicornServer(
            self.emulator,
            self.jobs_file,
            workers=2,
            threads=4,
            app="devtools.stepped_app:app",
            extra_env=self.extra_env,
            log_path=self.log_path,
        ).start()

    def set_clock(self, instant: datetime.datetime) -> None:
        self.clock.set(instant)

    @property
    def url(self) -> str:
        assert self.server is not None, "deploy() first"
        return self.server.url

    def call(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        response = requests.request(
            method, self.url + path, headers=dict(headers or {}), json=json_body, params=params, timeout=60
        )
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None

    def deliver_tasks(self, tasks: CloudTasksFake) -> None:
        tasks.deliver(to_url(self.url), times=2, at_once=True)  # two deliveries of a task at once

    def audit_lines(self) -> list[AuditLine]:
        lines = []
        with open(self.log_path, encoding="utf-8") as handle:
            for text in handle:
                try:
                    record = json.loads(text)
                except ValueError:
                    continue  # gunicorn's own lines
                if isinstance(record, dict) and record.get("logger") == "dedup.audit":
                    lines.append(AuditLine(record["severity"], record.get("outcome"), record.get("schedule_time")))
        return [line for line in lines if line.severity in ("WARNING", "ERROR")]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
