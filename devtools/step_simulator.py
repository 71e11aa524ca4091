"""`python -m devtools.step_simulator`: a three-step job killed at random points, thousands of times.

A python job of three steps (``STEPS``: at_least_once into a downstream that deduplicates by
the step's key, at_most_once with ``on_unknown: review`` into one that does not, at_least_once
again) is delivered until its run is final.  Each schedule kills attempts at random step events
(before or after a step's write, before or after its effect, before the finish), wakes a
stale attempt after another took the run over, and plays the operator who settles a run that
waits for review (done when the charge happened, run again when it did not).  After each
schedule: every step took effect exactly once, its at_most_once step was never called twice,
and no stale attempt recorded anything.  tests/test_steps.py runs it on the real ledger over
the in-memory store (thousands of schedules) and over both emulators (fewer).

A kill is ``Killed``, a BaseException: it passes through the runner's ``except Exception`` as
a process's death would, so the attempt writes nothing more and its lease runs out.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
import random
import sys
from collections.abc import Callable
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb

from dedup.clock import ManualClock
from dedup.finished_cache import FinishedRuns
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.memory_store import MemoryStore
from dedup.outcomes import Attempt, Finished, Renewed, Replayed, RunOutcome, Stale
from dedup.run_record import RunStatus
from dedup.runner import run_once
from dedup.steps import StepDecision, StepState, review_step
from jobs.base import RunContext

LEASE = 60
POLICY = RunPolicy(lease_seconds=LEASE, retention_seconds=7 * 86400)
DESCRIPTION = RunDescription(source="scheduler", job_id="three-steps", scheduler_job_name="three-steps")
# The job's steps: (name, semantic, on_unknown, whether the downstream deduplicates by the step's key).
STEPS: tuple[tuple[str, str, str | None, bool], ...] = (
    ("reserve", "at_least_once", None, True),
    ("charge", "at_most_once", "review", False),
    ("notify", "at_least_once", None, True),
)


class Killed(BaseException):
    """The process died here."""


@dataclasses.dataclass
class Downstream:
    """What each step's target saw: every call (``calls``), and the effects it applied once per key
    where it deduplicates (``applied``), else once per call."""

    calls: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    applied: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    keys: dict[str, set[str]] = dataclasses.field(default_factory=lambda: collections.defaultdict(set))

    def call(self, step: str, key: str, deduplicates: bool) -> dict[str, Any]:
        self.calls[step] += 1
        if not deduplicates or key not in self.keys[step]:
            self.applied[step] += 1
        self.keys[step].add(key)
        return {"step": step, "key": key}


class Events:
    """The step events of the attempts, in order.  ``kill_at`` kills the attempt at that event
    (a name, or the n-th event from now); ``hooks`` run an action at an event (a takeover)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.kill_at: str | int | None = None
        self.hooks: dict[str, Callable[[], None]] = {}

    def __call__(self, event: str) -> None:
        self.seen.append(event)
        hook = self.hooks.pop(event, None)
        if hook is not None:
            hook()
        if isinstance(self.kill_at, int):
            self.kill_at -= 1
            if self.kill_at < 0:
                self.kill_at = None
                raise Killed(event)
        elif event == self.kill_at:
            self.kill_at = None
            raise Killed(event)


class EventLedger(Ledger):
    """The ledger, telling ``events`` before and after each step's write and the finish."""

    events: Events

    def record_step(self, attempt: Attempt, name: str, entry: dict[str, Any]) -> Renewed | Stale:
        self.events(f"{attempt.number}:{name}:{entry['state']}:write")
        written = super().record_step(attempt, name, entry)
        landed = "refused" if isinstance(written, Stale) else "written"
        self.events(f"{attempt.number}:{name}:{entry['state']}:{landed}")
        return written

    def complete_run(self, attempt: Attempt, result: object, policy: RunPolicy) -> Any:
        self.events(f"{attempt.number}:finish")
        return super().complete_run(attempt, result, policy)


def three_steps(downstream: Downstream, events: Events) -> Callable[[RunContext], Any]:
    """The job: three steps, each calling the downstream with its key."""

    def job(context: RunContext) -> Any:
        results = []
        for name, semantic, on_unknown, deduplicates in STEPS:

            def effect(key: str, name: str = name, deduplicates: bool = deduplicates) -> Any:
                events(f"{context.attempt}:{name}:effect")
                done = downstream.call(name, key, deduplicates)
                events(f"{context.attempt}:{name}:effected")
                return done

            results.append(context.step(name, effect, semantic=semantic, on_unknown=on_unknown))
        return {"steps": results}

    return job


def deliver(
    ledger: Ledger, clock: ManualClock, run_id: str, job: Callable[[RunContext], Any], reopen_attempt: int | None = None
) -> RunOutcome:
    """One delivery of the run: claim, run the job, finish (or die at a kill, writing nothing more)."""

    def work(attempt: Attempt) -> Any:
        return job(RunContext.for_attempt(attempt, DESCRIPTION.job_id, clock=clock))

    return run_once(ledger, run_id, DESCRIPTION, POLICY, work, reopen_attempt=reopen_attempt)


@dataclasses.dataclass
class Schedule:
    """What one random schedule did, and what it found."""

    deliveries: int = 0
    kills: int = 0
    stale_wakes: int = 0
    reviews: int = 0
    reruns: int = 0
    outcome: str = ""
    broken: list[str] = dataclasses.field(default_factory=list)


MAX_DELIVERIES = 40


def play(ledger: EventLedger, clock: ManualClock, run_id: str, rng: random.Random) -> Schedule:
    """One random schedule of kills, stale wakes and reviews, until the run completes; what broke."""
    downstream, events = Downstream(), Events()
    ledger.events = events
    job = three_steps(downstream, events)
    schedule = Schedule()
    reopen: int | None = None
    taken: list[tuple[Any, ...]] = []  # the record as a takeover left it, mid-attempt
    while schedule.deliveries < MAX_DELIVERIES:
        schedule.deliveries += 1
        # About one attempt in five runs through; the others die at one of their first ten events.
        if rng.random() < 0.8:
            events.kill_at = rng.randrange(10)
        if rng.random() < 0.15:  # a stale wake: mid-attempt, the lease runs out and another attempt runs
            at = rng.choice([f"{name}:{moment}" for name, *_ in STEPS for moment in ("effect", "effected")])

            def takeover() -> None:
                events.hooks = {}  # one takeover per delivery
                schedule.stale_wakes += 1
                kill, events.kill_at = events.kill_at, None
                clock.advance(LEASE + 1)
                deliver(ledger, clock, run_id, job)
                events.kill_at = kill
                taken.append(snapshot(ledger.lookup(run_id)))

            events.hooks = {f"{n}:{at}": takeover for n in range(1, MAX_DELIVERIES + 1)}
        taken.clear()
        try:
            outcome = deliver(ledger, clock, run_id, job, reopen)
        except Killed:
            schedule.kills += 1
            clock.advance(LEASE + 1)  # the dead attempt's lease runs out; Scheduler retries
            continue
        finally:
            events.hooks = {}
            events.kill_at = None
            if taken and snapshot(ledger.lookup(run_id)) != taken[0]:
                schedule.broken.append("an attempt taken over mid-step changed the record after the takeover")
        reopen = None
        record = ledger.lookup(run_id)
        if record is not None and record.status == RunStatus.COMPLETED:
            schedule.outcome = "completed"
            break
        waiting = review_step(record) if record is not None else None
        if waiting is not None and record is not None:
            schedule.reviews += 1  # the operator checks the charge and decides truthfully
            happened = downstream.calls[waiting["step"]] > 0
            state = StepState.DONE if happened else StepState.RERUN
            schedule.reruns += state == StepState.RERUN
            settled = ledger.settle_step(
                run_id,
                StepDecision(waiting["step"], state, record.attempt, "user:operator@example.com", {"checked": True}),
            )
            if isinstance(settled, str):
                schedule.broken.append(f"the review was refused: {settled}")
                break
            reopen = record.attempt
            continue
        if isinstance(outcome, (Finished, Replayed)) and record is not None and record.status == RunStatus.FAILED:
            schedule.broken.append(f"failed: {record.error}")
            break
    if schedule.outcome != "completed":
        schedule.broken.append(f"not completed after {schedule.deliveries} deliveries")
    for name, *_ in STEPS:
        if downstream.applied[name] != 1:
            schedule.broken.append(f"{name} took effect {downstream.applied[name]} times")
    if downstream.calls["charge"] > 1 + schedule.reruns:
        schedule.broken.append(f"the at_most_once charge was called {downstream.calls['charge']} times")
    return schedule


def snapshot(record: Any) -> tuple[Any, ...]:
    """What a stale attempt must never change: the attempt, the status and the steps."""
    return (record.attempt, record.status, record.steps) if record is not None else ()


def simulate(ledger: EventLedger, clock: ManualClock, schedules: int, seed: int, prefix: str = "sim") -> list[Schedule]:
    """``schedules`` random schedules, each its own run; each one's findings."""
    rng = random.Random(seed)
    return [play(ledger, clock, f"{prefix}-{seed}-{number}", rng) for number in range(schedules)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # every kill and takeover logs; the report says what matters
    try:
        with ndb.Client(project="step-simulator", credentials=AnonymousCredentials()).context():
            memory = MemoryStore()
            ledger = EventLedger(ManualClock(), FinishedRuns(0), store=lambda: memory)
            found = simulate(ledger, ledger.clock, args.schedules, args.seed)  # type: ignore[arg-type]
    finally:
        logging.disable(logging.NOTSET)
    broken = [s for s in found if s.broken]
    totals = {
        field: sum(getattr(s, field) for s in found)
        for field in ("deliveries", "kills", "stale_wakes", "reviews", "reruns")
    }
    print(f"{len(found)} schedules, {totals}: {len(broken)} broken")
    for schedule in broken[:10]:
        print("  ", schedule.broken)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
