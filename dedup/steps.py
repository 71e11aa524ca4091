"""Steps of a run that survive a takeover: each one's outcome is kept in the run's record.

A run is exactly-once as a whole; a job that does several things and loses its attempt after
some of them would, on takeover, start again from the first.  ``Steps.run(name, call)`` keeps
each step's outcome in the run's record (``RunRecord.steps``), written fenced by the attempt
that owns the run, so a later attempt returns a finished step's result without calling it again.

Each step has one of two semantics, with a rule for the case nobody can decide alone:

- ``at_least_once`` (the default): the result is recorded after the call.  A step that was called
  but whose result was never recorded (the attempt died in between) is called again.
- ``at_most_once``: ``started`` is recorded before the call, so a later attempt that finds it
  started with no result knows the effect may have happened.  It never calls it again silently:
  the step's ``on_unknown`` decides.  ``fail`` fails the run for good; ``review`` fails it as
  ``NeedsReview``, which the operator's page shows with actions to mark the step done or to run
  it again; ``retry`` calls it again on purpose.

Every write is the run's fenced write (dedup.fences): one round trip on a database whose fence
was verified, else a transaction that reads the attempt id.  A stale attempt (taken over) cannot
record a step: it gets ``StaleAttempt`` and stops.  The decision is ``decide``, a pure function of
what is recorded, so the state machine is checked without a database (tests/test_steps_model.py).

A step's downstream key is ``<run id>:<step name>``: the same on every attempt, distinct per step,
for the API the step calls (Google's ``requestId``, a Stripe ``Idempotency-Key``, our own guard).
Step records live in the run's record, so they expire with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dedup.errors import PermanentJobError, StaleAttempt
from dedup.keys import format_utc

# A checkpoint's result is a document, not a payload: keep a reference (an object's name) for
# anything larger.  All of a run's steps share its record (1 MiB in all, the run's own result
# up to 512 KiB of it).
MAX_STEP_RESULT_BYTES = 64 * 1024
MAX_STEPS_JSON_BYTES = 256 * 1024
MAX_STEPS = 100
# A step's name ends its downstream key: letters, digits and ``_ . -``, as any API's key accepts.
STEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Semantic(enum.StrEnum):
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


class OnUnknown(enum.StrEnum):
    """What an ``at_most_once`` step found started, with no result, does."""

    FAIL = "fail"  # the run fails for good, naming the step
    REVIEW = "review"  # the run fails as NeedsReview: an operator marks the step done or runs it again
    RETRY = "retry"  # call it again, on purpose


class StepState(enum.StrEnum):
    STARTED = "started"  # an at_most_once step, recorded before its call
    DONE = "done"  # its result is recorded
    RERUN = "rerun"  # an operator chose to run it again (after NeedsReview)


def step_key(run_id: str, name: str) -> str:
    """The key a step passes downstream: the same on every attempt of the run, distinct per step."""
    return f"{run_id}:{name}"


def name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
        return (
            f"a step's name must be 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit "
            f"(it ends the step's downstream key), got {name!r}"
        )
    return None


# -- the decision: a pure function of what is recorded ---------------------------------------


@dataclasses.dataclass(frozen=True)
class Replay:
    """The step is done: its recorded result is returned, and it is not called."""

    result: Any


@dataclasses.dataclass(frozen=True)
class Call:
    """Call the step; with ``record_started`` (at_most_once), record ``started`` first."""

    record_started: bool


@dataclasses.dataclass(frozen=True)
class Unknown:
    """An at_most_once step found started with no result: ``rule`` says what the run does."""

    rule: OnUnknown
    started_attempt: int


type Decision = Replay | Call | Unknown


def decide(recorded: Mapping[str, Any] | None, semantic: Semantic, on_unknown: OnUnknown) -> Decision:
    """What a step does, given its record (None: never started)."""
    state = recorded.get("state") if recorded else None
    if state == StepState.DONE:
        assert recorded is not None
        return Replay(recorded.get("result"))
    at_most_once = semantic == Semantic.AT_MOST_ONCE
    if state == StepState.STARTED and at_most_once:
        assert recorded is not None
        if on_unknown == OnUnknown.RETRY:
            return Call(record_started=True)
        return Unknown(on_unknown, int(recorded.get("attempt") or 0))
    # Never started, started under at_least_once (called again by its semantic), or an operator's rerun.
    return Call(record_started=at_most_once)


# -- an attempt's steps -----------------------------------------------------------------------


class StepWriter(Protocol):
    """Where an attempt's step records go: the run's fenced write (dedup.runner.RunningAttempt)."""

    def record_step(self, name: str, entry: dict[str, Any]) -> bool:
        """Write ``entry`` as step ``name`` of the run, fenced by the attempt; False when it is stale."""
        ...

    def lost(self) -> bool:
        """True once the attempt's lease was lost (a renewal found the run taken over, or ran out)."""
        ...


class StepNotTaken(Exception):
    """Raised by an at_most_once step's call that surely did not take effect (refused before it
    acted: a 4xx, a connection never made): the step is recorded as not started, so a later
    attempt calls it without asking anyone, and ``cause`` is raised in its place."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class NeedsReview(PermanentJobError):
    """An at_most_once step with ``on_unknown: review`` was found started with no result."""


class Steps:
    """The steps one attempt runs, over the step records its claim found (``recorded``)."""

    def __init__(
        self,
        run_id: str,
        attempt: int,
        recorded: Mapping[str, Any] | None,
        writer: StepWriter | None,
        now: Callable[[], datetime.datetime],
    ) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self._recorded: dict[str, dict[str, Any]] = {name: dict(entry) for name, entry in (recorded or {}).items()}
        self._writer = writer
        self._now = now
        self._called: set[str] = set()  # the names this attempt used: a name twice is a bug in the job
        self._lock = threading.Lock()
        # Set once a write was refused: the run is another attempt's, so no step of this one may
        # call anything again, even if the job caught the StaleAttempt and went on.
        self.stale = False

    def recorded(self) -> dict[str, dict[str, Any]]:
        """The step records as this attempt knows them (a copy)."""
        with self._lock:
            return {name: dict(entry) for name, entry in self._recorded.items()}

    def run[T](
        self,
        name: str,
        call: Callable[[str], T],
        semantic: Semantic | str = Semantic.AT_LEAST_ONCE,
        on_unknown: OnUnknown | str | None = None,
    ) -> T:
        """The step's result: recorded by an earlier attempt, else ``call(key)``'s, recorded."""
        semantic, rule = _rules(semantic, on_unknown)
        problem = name_problem(name)
        if problem:
            raise PermanentJobError(problem)
        self._still_owned(name)
        with self._lock:
            if name in self._called:
                raise PermanentJobError(
                    f"the step {name!r} ran twice in one attempt: each step of a run needs its own name"
                )
            if name not in self._recorded and len(self._recorded) >= MAX_STEPS:
                raise PermanentJobError(f"a run records at most {MAX_STEPS} steps")
            self._called.add(name)
            recorded = self._recorded.get(name)
        key = step_key(self.run_id, name)
        match decide(recorded, semantic, rule):
            case Replay(result):
                return result  # type: ignore[no-any-return]  # what call returned, as JSON
            case Unknown(OnUnknown.REVIEW, started_attempt):
                raise NeedsReview(
                    f"the at_most_once step {name!r} started at attempt {started_attempt} and recorded no result: "
                    "it may have taken effect. An operator must mark it done or run it again",
                    details={"step": name, "attempt": started_attempt, "key": key},
                )
            case Unknown(_, started_attempt):
                raise PermanentJobError(
                    f"the at_most_once step {name!r} started at attempt {started_attempt} and recorded no result: "
                    "it may have taken effect, and its on_unknown is fail",
                    details={"step": name, "attempt": started_attempt, "key": key},
                )
            case Call(record_started):
                pass
        started = self._now()
        if record_started:
            self._write(name, {**self._entry(StepState.STARTED, semantic, started), "result": None})
        self._still_owned(name)
        try:
            result = call(key)
        except StepNotTaken as not_taken:
            if record_started:  # it did not act: the next attempt calls it again, no one asked
                self._write(name, {**self._entry(StepState.RERUN, semantic, started), "result": None})
            raise not_taken.cause from None
        problem = result_problem(name, result)
        if problem:
            raise PermanentJobError(problem)
        result = json.loads(json.dumps(result))  # what every later attempt gets back: the same value
        entry = {**self._entry(StepState.DONE, semantic, started), "finished": format_utc(self._now())}
        entry["result"] = result
        with self._lock:
            others = {n: e for n, e in self._recorded.items() if n != name}
        if len(json.dumps({**others, name: entry}).encode("utf-8")) > MAX_STEPS_JSON_BYTES:
            raise PermanentJobError(f"a run's step records are at most {MAX_STEPS_JSON_BYTES} bytes of JSON together")
        self._write(name, entry)
        return result  # type: ignore[no-any-return]  # the call's result, as JSON gives it back

    def mark_done(self, name: str, result: Any, semantic: Semantic = Semantic.AT_MOST_ONCE) -> None:
        """Record step ``name`` done with ``result`` without calling anything: what it was to start
        was found done (a job kind's create adopted by its search)."""
        self._still_owned(name)
        now = self._now()
        self._write(name, {**self._entry(StepState.DONE, semantic, now), "finished": format_utc(now), "result": result})

    def note(self, name: str, **fields: Any) -> None:
        """Add ``fields`` to step ``name``'s record, its state unchanged (what an attempt learned of a
        step it could not finish: a create whose answer left it in doubt)."""
        with self._lock:
            entry = dict(self._recorded.get(name) or {})
        self._write(name, {**entry, **fields})

    def _still_owned(self, name: str) -> None:
        """StaleAttempt, before anything is called, once this attempt lost the run."""
        if self.stale or (self._writer is not None and self._writer.lost()):
            self.stale = True
            raise StaleAttempt(f"attempt {self.attempt} of run {self.run_id} lost the run; step {name!r} not called")

    def _entry(self, state: StepState, semantic: Semantic, started: datetime.datetime) -> dict[str, Any]:
        return {
            "state": str(state),
            "semantic": str(semantic),
            "attempt": self.attempt,
            "started": format_utc(started),
            "finished": None,
        }

    def _write(self, name: str, entry: dict[str, Any]) -> None:
        if self._writer is not None and not self._writer.record_step(name, entry):
            self.stale = True
            raise StaleAttempt(
                f"attempt {self.attempt} of run {self.run_id} was taken over; step {name!r} not recorded"
            )
        with self._lock:
            self._recorded[name] = entry


class TakesSteps:
    """What a job's context offers of its run's steps (jobs.base.RunContext, the library's
    dedup.deliveries.ScheduledRun): ``step``, over the Steps ``steps()`` gives."""

    def steps(self) -> Steps:
        raise NotImplementedError

    def step[T](
        self,
        name: str,
        call: Callable[[str], T],
        semantic: Semantic | str = Semantic.AT_LEAST_ONCE,
        on_unknown: OnUnknown | str | None = None,
    ) -> T:
        """Run one step of the job, once per run as its semantic says, and return its result.

        ``call`` gets the step's downstream key, ``<run id>:<name>``, to pass to what it calls.  A
        step an earlier attempt finished is not called again: its recorded result (JSON, at most
        MAX_STEP_RESULT_BYTES) is returned.  ``at_least_once`` (the default) calls a step again
        whose result was never recorded; ``at_most_once`` records "started" first and, finding it
        started with no result, does what ``on_unknown`` says (``fail``, ``review`` or ``retry``;
        required).  A step whose record is refused because this attempt lost the run raises
        dedup.errors.StaleAttempt: let it propagate.
        """
        return self.steps().run(name, call, semantic, on_unknown)


def _rules(semantic: Semantic | str, on_unknown: OnUnknown | str | None) -> tuple[Semantic, OnUnknown]:
    try:
        chosen = Semantic(semantic)
    except ValueError:
        raise PermanentJobError(f"a step's semantic is at_least_once or at_most_once, got {semantic!r}") from None
    if chosen == Semantic.AT_MOST_ONCE and on_unknown is None:
        raise PermanentJobError("an at_most_once step needs its on_unknown: fail, review or retry")
    if chosen == Semantic.AT_LEAST_ONCE and on_unknown is not None:
        raise PermanentJobError("on_unknown is for at_most_once steps: an at_least_once step is called again")
    try:
        rule = OnUnknown(on_unknown) if on_unknown is not None else OnUnknown.FAIL
    except ValueError:
        raise PermanentJobError(f"a step's on_unknown is fail, review or retry, got {on_unknown!r}") from None
    return chosen, rule


def result_problem(name: str, result: object) -> str | None:
    """Why ``result`` cannot be kept as step ``name``'s result (refused, never truncated), or None."""
    try:
        encoded = json.dumps(result, allow_nan=False)
    except Exception as exc:  # TypeError, ValueError, RecursionError
        return f"the step {name!r} returned a result that is not JSON: {type(exc).__name__}: {exc}"
    size = len(encoded.encode("utf-8"))
    if size > MAX_STEP_RESULT_BYTES:
        return (
            f"the step {name!r} returned {size} bytes of JSON; a step's result is at most {MAX_STEP_RESULT_BYTES} "
            "bytes: keep the data elsewhere and return its name"
        )
    return None


@dataclasses.dataclass(frozen=True)
class StepDecision:
    """An operator's answer to ``NeedsReview``: the step ``step`` is done (with ``result``) or is to be
    run again (``StepState.RERUN``), for the run as they saw it at ``seen_attempt``, by ``by``."""

    step: str
    state: StepState
    seen_attempt: int
    by: str
    result: Any = None


def review_step(record: Any) -> dict[str, Any] | None:
    """The step a failed run waits on an operator for (its NeedsReview details: step, attempt, key), or None."""
    error = record.error if record.status == "failed" else None
    if not isinstance(error, Mapping) or error.get("type") != NeedsReview.__name__:
        return None
    details = error.get("details")
    return dict(details) if isinstance(details, Mapping) and isinstance(details.get("step"), str) else None


def review_problem(record: Any, decision: StepDecision) -> str | None:
    """Why ``decision`` does not apply to the run ``record`` (None: it does)."""
    if decision.state not in (StepState.DONE, StepState.RERUN):
        return f"a step is marked done or to be run again, not {decision.state!r}"
    waiting = review_step(record)
    if waiting is None:
        return f"the run is {record.status} at attempt {record.attempt}: it is not waiting for a review of a step"
    if record.attempt != decision.seen_attempt:
        return f"the run is at attempt {record.attempt}, not {decision.seen_attempt}: look at it again before deciding"
    if waiting["step"] != decision.step:
        return f"the run waits for a review of the step {waiting['step']!r}, not {decision.step!r}"
    entry = (record.steps or {}).get(decision.step) or {}
    if entry.get("state") != StepState.STARTED:
        return (
            f"the step {decision.step!r} was already marked {entry.get('state')} by {entry.get('settled_by')}: "
            "the run goes on from that decision when it runs again"
        )
    if decision.state == StepState.DONE:
        problem = result_problem(decision.step, decision.result)
        if problem:
            return problem
        others = {name: step for name, step in (record.steps or {}).items() if name != decision.step}
        if len(json.dumps({**others, decision.step: {**entry, "result": decision.result}})) > MAX_STEPS_JSON_BYTES:
            return f"with that result a run's step records would pass {MAX_STEPS_JSON_BYTES} bytes of JSON"
    return None


def step_rows(steps: Mapping[str, Any] | None, run_id: str) -> list[dict[str, Any]]:
    """The run page's rows: each step's name, state, semantic, attempt, duration and key, in order."""
    rows = []
    for name, entry in (steps or {}).items():
        if not isinstance(entry, Mapping):
            continue
        started, finished = entry.get("started"), entry.get("finished")
        seconds = None
        if isinstance(started, str) and isinstance(finished, str):
            try:
                seconds = (
                    datetime.datetime.fromisoformat(finished) - datetime.datetime.fromisoformat(started)
                ).total_seconds()
            except ValueError:
                seconds = None
        rows.append(
            {
                "name": name,
                "state": entry.get("state"),
                "semantic": entry.get("semantic"),
                "attempt": entry.get("attempt"),
                "started": started,
                "finished": finished,
                "seconds": seconds,
                "key": step_key(run_id, name),
                **({"settled_by": entry["settled_by"]} if entry.get("settled_by") else {}),
            }
        )
    return sorted(rows, key=lambda row: str(row["started"] or ""))
