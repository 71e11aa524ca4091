"""`make simulate`: Cloud Scheduler's delivery, played locally on a compressed clock.

Reads scheduler.yaml, generates executions from the unix-cron schedules and
delivers them to this app (served by gunicorn on the emulator) as Scheduler
does: an attempt deadline that cuts the HTTP wait while the attempt goes on
running, retries with Scheduler's backoff (minBackoff doubling maxDoublings
times, then linear, capped at maxBackoff; retryCount; maxRetryDuration), 503
retried outside the count; plus injected duplicate deliveries and lost
acknowledgements, and Force runs of both kinds the docs describe (carrying the next slot's
time, or the execution's own).  Then a day of schedule states (devtools/schedule_day.py:
a fresh deploy, Force runs, a pause with catch-up through Cloud Tasks, a late run, a
failure streak) on gunicorn, on a clock it steps.  Each job's side effect is an HTTP call to a local sink that
counts calls by the run's key (so "exactly once" is counted where it
matters, downstream) and is sometimes slow or failing.  The report is a
table and an HTML chart (one cell per execution: green once, red otherwise).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import html
import os
import random
import sys
import tempfile
import threading
import time
import zoneinfo
from collections.abc import Sequence

import requests
from croniter import croniter

from devtools.effect_sink import EffectSink, Faults
from jobs.config import DEFAULT_JOBS_FILE, load_jobs
from schedules.config import SchedulerJob, load_scheduler_file, retry_intervals

# Where each target's retention comes from: the jobs `make run` serves, the shipped ones with
# local targets (jobs.yaml itself names a placeholder URL, refused until it is filled in).
LOCAL_JOBS_FILE = os.path.join(os.path.dirname(DEFAULT_JOBS_FILE), "examples", "local-jobs.yaml")


@dataclasses.dataclass
class Execution:
    job: SchedulerJob
    schedule_time: datetime.datetime
    attempts: list[str] = dataclasses.field(default_factory=list)  # what Scheduler saw, per attempt
    run_id: str | None = None
    effects: int = 0
    calls: int = 0
    window: tuple[float, float] = (0.0, 0.0)  # monotonic start and end of its deliveries
    listed: str | None = None  # its status in the app's executions listing, after the simulation
    # A Force run: "next_slot" (it carries the next slot's time) or "execution_time" (its own).
    force_run: str | None = None
    slot_taken: bool | None = None  # a Force run's: whether a record holds the slot key of its time

    @property
    def slot_key(self) -> str:
        """The run id a slot's delivery at this time gets (a Force run must never hold it)."""
        from schedules.slots import Slot

        return Slot(self.job, self.schedule_time).run_id

    @property
    def expected_status(self) -> str:
        """What the listing must say: it took effect (completed), or no delivery ran it (missed)."""
        return "completed" if self.effects else "missed"


def executions_of(jobs: list[SchedulerJob], count: int, start: datetime.datetime) -> list[Execution]:
    """The first ``count`` executions of all jobs from ``start``, in time order."""
    upcoming = []
    for job in jobs:
        iterator = croniter(job.schedule, start.astimezone(zoneinfo.ZoneInfo(job.time_zone)))
        upcoming += [
            Execution(job, iterator.get_next(datetime.datetime).astimezone(datetime.UTC)) for _ in range(count)
        ]
    return sorted(upcoming, key=lambda e: e.schedule_time)[:count]


def force_runs_of(jobs: list[SchedulerJob], now: datetime.datetime) -> list[Execution]:
    """A Force run of each kind for the first job: one carrying its next slot's time (a slot
    at least twice the clock skew ahead, so no reading can take it for the slot's delivery),
    one carrying the moment it was forced."""
    from dedup.keys import CLOCK_SKEW_SECONDS
    from schedules.bound import BoundJob
    from schedules.slots import slots_between

    job = jobs[0]
    ahead = now + datetime.timedelta(seconds=2 * CLOCK_SKEW_SECONDS)
    [next_slot] = slots_between([BoundJob(job)], ahead, ahead + datetime.timedelta(days=366), limit=1)
    return [
        Execution(job, next_slot.schedule_time, force_run="next_slot"),
        Execution(job, now.replace(microsecond=now.microsecond or 1), force_run="execution_time"),
    ]


def header_time(instant: datetime.datetime) -> str:
    """ScheduleTime as Scheduler spells it: whole seconds for a slot, the fraction for an execution time."""
    if instant.microsecond:
        return instant.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ")


def deliver_execution(
    app_url: str,
    execution: Execution,
    compress: float,
    faults: Faults,
    rng: random.Random,
    lock: threading.Lock,
    killer: WorkerKiller | None = None,
) -> None:
    """Scheduler's attempts for one execution until a 2xx gets through or retries run out."""
    with lock:
        outage = rng.random() < faults.outages and execution.force_run is None  # a Force run is delivered at once
    if outage:
        execution.attempts.append("outage")  # Scheduler never delivered it: the slot must show as missed
        return
    job = execution.job
    deadline = job.deadline / compress
    waits = iter(retry_intervals(job.retry.model_copy(update={"retry_count": job.retry.retry_count + 50})))
    started = time.monotonic()
    headers = {
        "X-CloudScheduler-JobName": job.name,
        "X-CloudScheduler": "true",
        "X-CloudScheduler-ScheduleTime": header_time(execution.schedule_time),
    }
    url = app_url + job.relative_url

    def attempt() -> str:
        try:
            response = requests.post(url, headers=headers, data=job.body or "", timeout=deadline)
        except requests.Timeout:
            return "deadline"
        except requests.RequestException:
            return "error"
        if response.ok:
            execution.run_id = response.json().get("run_id") or execution.run_id
        return str(response.status_code)

    try:
        _deliveries(execution, attempt, deadline, waits, job, compress, faults, rng, lock, started, killer)
    finally:
        execution.window = (started, time.monotonic())


def _deliveries(execution, attempt, deadline, waits, job, compress, faults, rng, lock, started, killer) -> None:
    counted_failures = 0
    while True:
        with lock:
            duplicate = rng.random() < faults.duplicates
            lost = rng.random() < faults.lost_acks
            kill = rng.random() < faults.worker_kills
        if kill and killer is not None:
            threading.Timer(min(0.3, deadline / 2), killer.kill_one).start()
        if duplicate:
            extra = threading.Thread(target=lambda: execution.attempts.append("dup:" + attempt()))
            extra.start()
        outcome = attempt()
        if outcome.startswith("2") and lost:
            outcome = "lost-ack"
        execution.attempts.append(outcome)
        if duplicate:
            extra.join(deadline + 5)
        if outcome.startswith("2"):
            return
        if outcome != "503":
            counted_failures += 1  # 503 is retried outside retryCount; a lost ack is an ordinary failure
        elif len(execution.attempts) > MAX_ATTEMPTS:
            return  # the app never answers 503; a bound keeps a broken target from looping forever
        out_of_count = counted_failures > job.retry.retry_count
        out_of_time = time.monotonic() - started > job.retry.max_retry_duration / compress
        # With both limits set, Scheduler retries until both are reached.
        if outcome != "503" and out_of_count and (out_of_time or not job.retry.max_retry_duration):
            return
        time.sleep(next(waits, job.retry.max_backoff) / compress)


MAX_ATTEMPTS = 60


class WorkerKiller:
    """SIGKILLs a random gunicorn worker on demand (gunicorn starts a new one); remembers when."""

    def __init__(self, server_pid: int, rng: random.Random, lock: threading.Lock) -> None:
        self.server_pid, self.rng, self.lock = server_pid, rng, lock
        self.kills: list[float] = []

    def kill_one(self) -> None:
        import signal

        workers = _children(self.server_pid)
        if not workers:
            return
        with self.lock:
            victim = self.rng.choice(workers)
        try:
            os.kill(victim, signal.SIGKILL)
            self.kills.append(time.monotonic())
        except ProcessLookupError:
            pass


def simulate(
    app_url: str,
    jobs: list[SchedulerJob],
    executions: int,
    compress: float,
    faults: Faults,
    seed: int,
    sink: EffectSink,
    parallel: int = 8,
    server_pid: int | None = None,
    force_runs: bool = True,
) -> Simulation:
    """Play ``executions`` scheduled executions against the app; return them with the worker kills."""
    rng = random.Random(seed)
    lock = threading.Lock()
    plan = executions_of(jobs, executions, datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    # The server's clock is the real one: the slots above are long past, the Force runs are now.
    forced = force_runs_of(jobs, datetime.datetime.now(datetime.UTC)) if force_runs else []
    killer = WorkerKiller(server_pid, rng, lock) if server_pid and faults.worker_kills else None
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda e: deliver_execution(app_url, e, compress, faults, rng, lock, killer), plan + forced))
    # Attempts cut by their deadline may still be running: wait out the longest lease.
    time.sleep(3 * max(job.deadline for job in jobs) / compress + 1)
    for execution in plan + forced:
        execution.effects = sink.effects.get(execution.run_id, 0) if execution.run_id else 0
        execution.calls = sink.calls.get(execution.run_id, 0) if execution.run_id else 0
    return Simulation(plan, list(killer.kills) if killer else [], forced)


@dataclasses.dataclass(frozen=True)
class Simulation:
    """What a simulation delivered, and when it killed a worker (a second call must coincide with one)."""

    plan: list[Execution]
    kills: list[float]
    force_runs: list[Execution] = dataclasses.field(default_factory=list)


def misplaced_force_runs(force_runs: list[Execution]) -> list[Execution]:
    """Force runs that did not take effect once, or took the slot their time names.

    The simulated app is served without scheduler.yaml (its compressed leases would not
    validate against the real deadlines), so it tells a Force run by its time ahead of the
    clock alone; one carrying its own execution time names no slot, and its key is no
    slot's.  Needs ``slot_taken`` (list_executions)."""
    from schedules.bound import BoundJob
    from schedules.slots import is_slot

    def took_a_slot(e: Execution) -> bool:
        return is_slot(BoundJob(e.job), e.schedule_time) and (e.run_id == e.slot_key or e.slot_taken is not False)

    return [e for e in force_runs if e.effects != 1 or took_a_slot(e)]


def unexplained(plan: list[Execution], kills: list[float]) -> list[Execution]:
    """Executions delivered that did not take effect exactly once, and whose extra calls no kill explains.

    A second call with a run's key is expected only when an attempt died after
    the effect and before recording it: a worker killed while the execution
    was being delivered.  The downstream's key absorbs it (``effects`` stays 1).
    """

    def killed_during(e: Execution) -> bool:
        return any(e.window[0] <= t <= e.window[1] + 5 for t in kills)

    delivered = [e for e in plan if e.attempts != ["outage"]]  # an outage's execution is missed, and must be
    return [e for e in delivered if e.effects != 1 or (e.calls > 1 and not killed_during(e))]


def _children(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return children


def simulation_jobs_file(jobs: list[SchedulerJob], sink_url: str, compress: float) -> str:
    """jobs.yaml for the simulation: each target an http job calling the sink.

    The lease is three attempt deadlines and the call's timeout two, so a slow
    side effect (1.5 deadlines) outlives Scheduler's wait but not the attempt:
    the case where Scheduler retries while the first attempt still runs.
    """
    app_jobs = load_jobs(os.environ.get("DEDUP_JOBS_FILE") or LOCAL_JOBS_FILE)
    lines = ["jobs:"]
    for target in sorted({job.target for job in jobs}):
        deadline = max(job.deadline for job in jobs if job.target == target) / compress
        retention = app_jobs[target].policy.retention_seconds
        lines += [
            f"  {target}:",
            "    kind: http",
            f"    url: {sink_url}",
            f"    lease_seconds: {3 * deadline}",
            f"    timeout_seconds: {2 * deadline}",
            f"    retention_seconds: {max(retention, 3 * deadline + 1)}",
        ]
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    handle.write("\n".join(lines) + "\n")
    handle.close()
    return handle.name


def list_executions(plan: list[Execution], now: datetime.datetime, force_runs: Sequence[Execution] = ()) -> None:
    """Each execution's status as the app's executions listing derives it (schedules.slots), from its record,
    and whether a record holds the slot key of each Force run's time.

    Needs an NDB context on the simulation's Datastore.
    """
    from dedup.clock import ManualClock
    from dedup.ledger import Ledger
    from schedules.slots import Slot, execution_status

    slots = [Slot(e.job, e.schedule_time) for e in plan]
    ledger = Ledger(ManualClock(now))
    records = ledger.lookup_many([slot.run_id for slot in slots] + [e.slot_key for e in force_runs])
    for execution, slot in zip(plan, slots, strict=True):
        execution.listed = execution_status(slot, records.get(slot.run_id), now)
    for forced in force_runs:
        forced.slot_taken = forced.slot_key in records


def report(plan: list[Execution], force_runs: Sequence[Execution] = ()) -> tuple[str, str]:
    rows = [f"{'execution':<44} {'effects':>7} {'calls':>5} {'listed':>9}  attempts"]
    for e in plan:
        rows.append(
            f"{e.job.name + ' ' + e.schedule_time.strftime('%Y-%m-%d %H:%M'):<44} {e.effects:>7} {e.calls:>5} "
            f"{e.listed or '-':>9}  {' '.join(e.attempts)}"
        )
    for e in force_runs:
        from schedules.bound import BoundJob
        from schedules.slots import is_slot

        taken = (
            "no slot"
            if not is_slot(BoundJob(e.job), e.schedule_time)
            else "took the slot"
            if e.slot_taken
            else "slot untouched"
        )
        rows.append(
            f"{f'Force run ({e.force_run}) ' + header_time(e.schedule_time):<44} {e.effects:>7} {e.calls:>5} "
            f"{taken:>9}  {' '.join(e.attempts)}"
        )
    once = sum(1 for e in plan if e.effects == 1)
    rows.append(
        f"\n{once} of {len(plan)} executions took effect exactly once at the downstream; "
        f"{sum(1 for e in plan if e.effects == 0)} never; {sum(1 for e in plan if e.calls > 1)} reached it "
        f"more than once (a worker killed after the effect; the key absorbed it). "
        f"The executions listing: {sum(1 for e in plan if e.listed == 'missed')} missed "
        f"({sum(1 for e in plan if e.attempts == ['outage'])} never delivered), "
        f"{sum(1 for e in plan if e.listed == 'skipped')} skipped; "
        f"{sum(1 for e in plan if e.listed is not None and e.listed != e.expected_status)} "
        "disagree with the simulation."
        + (
            f" Force runs: {len(force_runs) - len(misplaced_force_runs(list(force_runs)))} of {len(force_runs)} "
            "took effect once under a key of their own, leaving the slot their time names to its delivery."
            if force_runs
            else ""
        )
    )
    cells = "".join(
        f'<div class="cell {"missed" if e.listed == "missed" else "ok" if e.effects == 1 else "bad"}" '
        f'title="{html.escape(e.job.name)} '
        f'{e.schedule_time:%Y-%m-%d %H:%M}: {e.effects} effect(s); {html.escape(" ".join(e.attempts))}"></div>'
        for e in plan
    )
    page = (
        f"<!doctype html><meta charset=utf-8><title>Simulated deliveries</title>"
        f"<style>body{{font:14px system-ui;margin:1.5rem}} .grid{{display:flex;flex-wrap:wrap;gap:3px;max-width:900px}}"
        f" .cell{{width:16px;height:16px;border-radius:3px}} .ok{{background:#1a7f37}}"
        f" .bad{{background:#cf222e}} .missed{{border:2px dashed #cf222e}}</style>"
        f"<h1>Simulated Cloud Scheduler deliveries</h1><p>{html.escape(rows[-1].strip())}</p>"
        f"<p>One square per execution, in time order: green = its side effect happened exactly once; "
        f"dashed = missed (never delivered, and the listing says so); red = anything else. "
        f"Hover for its attempts.</p><div class=grid>{cells}</div>"
        f"<pre>{html.escape(chr(10).join(rows))}</pre>"
    )
    return "\n".join(rows), page


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scheduler-file", default="scheduler.yaml")
    parser.add_argument("--executions", type=int, default=60)
    parser.add_argument("--compress", type=float, default=60, help="seconds of Scheduler time per real second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--report", default="simulation-report.html")
    args = parser.parse_args()

    from devtools.emulator import DatastoreEmulator
    from devtools.gunicorn import GunicornServer

    faults = Faults()
    jobs = load_scheduler_file(args.scheduler_file)
    sink = EffectSink(
        faults,
        slow_seconds=min(j.deadline for j in jobs) / args.compress * 1.5,
        rng=random.Random(args.seed + 1),
    )
    jobs_file = simulation_jobs_file(jobs, sink.url, args.compress)
    with (
        DatastoreEmulator(project="dedup-simulate") as emulator,
        GunicornServer(emulator, jobs_file, quiet=True, extra_env={"DEDUP_AUTH": "none"}) as server,
    ):
        assert server.process is not None, "entering the server started it"
        simulation = simulate(
            server.url, jobs, args.executions, args.compress, faults, args.seed, sink, server_pid=server.process.pid
        )
        os.environ.update(emulator.env)
        from google.cloud import ndb

        with ndb.Client(project=emulator.project).context():
            list_executions(simulation.plan, datetime.datetime.now(datetime.UTC), simulation.force_runs)
        from devtools import schedule_day

        day, _ = schedule_day.on_gunicorn(emulator)
    plan = simulation.plan
    os.unlink(jobs_file)
    table, page = report(plan, simulation.force_runs)
    print(table)
    with open(args.report, "w", encoding="utf-8") as handle:
        handle.write(page)
    print(f"chart: {args.report}")
    bad = unexplained(plan, simulation.kills)
    disagree = [e for e in plan if e.listed != e.expected_status]
    print(f"{len(simulation.kills)} worker kill(s); {len(bad)} execution(s) not exactly once")
    print(f"executions listing: {len(disagree)} slot(s) disagree with what the simulation delivered")
    misplaced = misplaced_force_runs(simulation.force_runs)
    print(f"Force runs: {len(misplaced)} of {len(simulation.force_runs)} not once under their own key, or took a slot")
    print(
        "\nA day of schedule states on gunicorn (devtools/schedule_day.py): a fresh deploy, a Force run of "
        "each kind, a pause with catch-up through Cloud Tasks (each task delivered twice at once), a late run, "
        "a failure streak"
    )
    print(schedule_day.report(day))
    problems = schedule_day.disagreements(day)
    print(f"schedule day: {len(problems)} disagreement(s) between the app and what the day did")
    for problem in problems:
        print(f"  {problem}")
    return 0 if not bad and not disagree and not misplaced and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
