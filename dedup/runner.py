"""Run a piece of work at most once per run_id: replay, claim, run, finish.

This is the small core that scheduled runs, manual runs and the reusable
guard all wrap around their work.  ``work`` receives the Attempt that owns
the claim and returns a JSON-serialisable result, or raises.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from dedup.errors import PermanentJobError, StaleAttempt
from dedup.heartbeat import LeaseHeartbeat
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import (
    Attempt,
    Claimed,
    ClaimOutcome,
    Contended,
    InProgress,
    Outcome,
    Replayed,
    RunOutcome,
    Skipped,
    Stale,
)
from dedup.steps import Steps

log = logging.getLogger(__name__)
# Spans of the protocol's steps (the OpenTelemetry API only: which provider records and exports
# them is the host app's choice, handlers/tracing.py here; without one they cost nothing).
tracer = trace.get_tracer("dedup")

# Results and errors live in one Datastore entity (1 MiB in all).
MAX_STORED_JSON_BYTES = 512 * 1024
# How often a waiting duplicate looks at the record (Prefer: wait=N).
WAIT_POLL_SECONDS = (0.1, 0.2, 0.4, 0.8, 1.0)


# How many requests of a process may wait at once (Prefer: wait) by default: a quarter of the 8
# threads app.yaml gives each worker (the app's DEDUP_MAX_WAITERS sets its own).
DEFAULT_MAX_WAITERS = 2


class WaitSlots:
    """How many calls of this process may wait for a lease holder at once.

    A waiting call holds a server thread while it polls; without a bound,
    enough ``Prefer: wait`` retries of one long run take every thread and
    starve unrelated requests.  Beyond the bound a call answers at once, as
    if it had not asked to wait.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("the number of wait slots cannot be negative")
        self.limit = limit
        self._taken = 0
        self._lock = threading.Lock()

    @property
    def taken(self) -> int:
        """How many calls are waiting now."""
        with self._lock:
            return self._taken

    def take(self) -> bool:
        """Take a slot if one is free (never blocks)."""
        with self._lock:
            if self._taken >= self.limit:
                return False
            self._taken += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            if self._taken <= 0:
                raise RuntimeError("a wait slot was given back that was never taken")
            self._taken -= 1


@dataclasses.dataclass
class Waiting:
    """A call's wish to wait for the attempt holding the lease (``Prefer: wait=N``)."""

    seconds: float
    slots: WaitSlots | None = None  # None: no bound (library use)
    waited: bool = False  # set by run_once once the call held a slot and waited

    def begin(self) -> bool:
        if self.slots is not None and not self.slots.take():
            return False
        self.waited = True
        return True

    def end(self) -> None:
        if self.waited and self.slots is not None:
            self.slots.give_back()


class Verdict(enum.Enum):
    """What a returned result means for the record."""

    COMPLETED = "completed"  # store it as the run's result
    FAILED = "failed"  # store it as the run's (permanent) error
    RELEASED = "released"  # keep nothing: a retry must run again


def run_once(
    ledger: Ledger,
    run_id: str,
    description: RunDescription,
    policy: RunPolicy,
    work: Callable[[Attempt], Any],
    *,
    classify: Callable[[Any], Verdict] | None = None,
    wait: Waiting | None = None,
    skip_reason: str | None = None,
    reopen_attempt: int | None = None,
) -> RunOutcome:
    """Replay a finished run, or claim it, run ``work`` once and record the outcome.

    ``classify`` sorts a returned result (default: every result completes).
    With ``wait`` an in-progress duplicate waits up to ``wait.seconds`` for
    the attempt holding the lease, instead of answering InProgress at once,
    when one of ``wait.slots`` is free.  The slot is held only while waiting.
    ``skip_reason`` (a delivery later than its job allows): where a claim would
    start the run afresh, it is recorded as skipped instead, and ``work`` never runs.
    ``reopen_attempt`` (a slot run by hand: the attempt the operator saw): a failed or
    skipped run still at that attempt is run again under its key (Ledger.claim_run).
    """
    with tracer.start_as_current_span("dedup.claim", attributes={"run_id": run_id}) as span:
        outcome, claim_began = _claim(ledger, run_id, description, policy, wait, skip_reason, reopen_attempt)
        describe(span, outcome)
    if not isinstance(outcome, Claimed):
        return outcome
    return _run_claimed(ledger, outcome.attempt, policy, work, classify, claim_began)


def describe(span: trace.Span, outcome: Outcome) -> None:
    """A step's span says what it came to: the outcome, the attempt, whether it was a replay."""
    record = outcome.record
    attempt = outcome.attempt.number if isinstance(outcome, Claimed) else getattr(record, "attempt", None)
    span.set_attribute("outcome", type(outcome).__name__)
    span.set_attribute("replayed", isinstance(outcome, Replayed))
    if attempt is not None:
        span.set_attribute("attempt", attempt)
    if record is not None:
        span.set_attribute("status", str(record.status))


def _claim(
    ledger: Ledger,
    run_id: str,
    description: RunDescription,
    policy: RunPolicy,
    wait: Waiting | None,
    skip_reason: str | None,
    reopen_attempt: int | None,
) -> tuple[ClaimOutcome | Skipped, float]:
    """The claim, or the answer that refused it (after waiting, with ``wait``), and when it began."""
    deadline = time.monotonic() + max(0.0, wait.seconds if wait else 0.0)
    polls = iter(WAIT_POLL_SECONDS)
    holding = False
    try:
        while True:
            # The stored lease is counted from inside the claim's transaction, so
            # never earlier than this: the job's view of its lease errs short.
            claim_began = time.monotonic()
            # A waiting call polls a record it saw leased: it sends no insert on speculation.
            outcome = ledger.replay_or_claim(
                run_id, description, policy, reopen_attempt, skip_reason, speculate=not holding
            )
            if isinstance(outcome, Claimed):
                return outcome, claim_began
            remaining = deadline - time.monotonic()
            if not isinstance(outcome, (InProgress, Contended)) or remaining <= 0:
                return outcome, claim_began
            if wait is None or (not holding and not wait.begin()):
                return outcome, claim_began  # every slot is taken: answer now, as without waiting
            holding = True
            time.sleep(min(next(polls, WAIT_POLL_SECONDS[-1]), remaining))
    finally:
        if holding and wait is not None:
            wait.end()


@dataclasses.dataclass(frozen=True)
class RunningAttempt:
    """The run as its running attempt holds it: its heartbeat says whether the lease is
    lost, its ledger records (fenced) what the attempt starts downstream."""

    ledger: Ledger
    attempt: Attempt
    heartbeat: LeaseHeartbeat | None = None
    # The run's steps as this attempt runs them, over what its claim found recorded (dedup.steps).
    steps: Steps = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        steps = Steps(self.attempt.run_id, self.attempt.number, self.attempt.step_records, self, self.ledger.clock.now)
        object.__setattr__(self, "steps", steps)

    def lost(self) -> bool:
        return self.heartbeat.lease_lost() if self.heartbeat else False

    def record_downstream(self, resource_name: str) -> bool:
        return not isinstance(self.ledger.record_downstream(self.attempt, resource_name), Stale)

    def record_step(self, name: str, entry: dict[str, Any]) -> bool:
        return not isinstance(self.ledger.record_step(self.attempt, name, entry), Stale)


def _run_claimed(
    ledger: Ledger,
    attempt: Attempt,
    policy: RunPolicy,
    work: Callable[[Attempt], Any],
    classify: Callable[[Any], Verdict] | None,
    claim_began: float,
) -> RunOutcome:
    run_id = attempt.run_id
    claimed = attempt
    heartbeat = LeaseHeartbeat(
        ledger, claimed, policy.lease_seconds, policy.max_run_seconds, renew=policy.heartbeat, claim_began=claim_began
    )
    attempt = dataclasses.replace(claimed, held=RunningAttempt(ledger, claimed, heartbeat))
    steps: dict[str, str | int] = {"run_id": run_id, "attempt": attempt.number}
    with tracer.start_as_current_span("dedup.job", attributes=steps, record_exception=False) as span:
        finish = _do_work(ledger, attempt, policy, work, classify, heartbeat, span)
    with tracer.start_as_current_span("dedup.finish", attributes=steps) as span:
        outcome = finish()
        describe(span, outcome)
    return outcome


def _do_work(
    ledger: Ledger,
    attempt: Attempt,
    policy: RunPolicy,
    work: Callable[[Attempt], Any],
    classify: Callable[[Any], Verdict] | None,
    heartbeat: LeaseHeartbeat,
    span: trace.Span,
) -> Callable[[], RunOutcome]:
    """Run ``work`` once; the ledger call that records how it ended (made in the finish's own span)."""
    run_id = attempt.run_id
    try:
        with heartbeat:
            result = work(attempt)
    except StaleAttempt as exc:
        # A step's write found the run taken over: it is another attempt's now, so nothing is written.
        log.warning("run %s attempt %d stopped: %s", run_id, attempt.number, exc)
        span.set_status(trace.StatusCode.ERROR, "stale attempt")
        stale = Stale(run_id, attempt.number, None)
        return lambda: stale
    except PermanentJobError as exc:
        log.info("run %s attempt %d failed permanently: %s", run_id, attempt.number, exc)
        span.set_status(trace.StatusCode.ERROR, "permanent failure")
        error = error_document(exc, details=exc.details)
        return lambda: ledger.fail_run(attempt, error, policy)
    except Exception as exc:  # every other error is retryable by contract
        log.warning(
            "run %s attempt %d failed, releasing for retry: %r",
            run_id,
            attempt.number,
            exc,
            exc_info=True,
        )
        span.set_status(trace.StatusCode.ERROR, "retryable failure")
        error = error_document(exc, details=getattr(exc, "details", None))
        return lambda: ledger.release_run(attempt, error)
    if attempt.held is not None and attempt.held.steps.stale:
        # The job caught a step's StaleAttempt and returned: the run is another attempt's all the same.
        log.warning("run %s attempt %d returned after losing the run; nothing recorded", run_id, attempt.number)
        stale = Stale(run_id, attempt.number, None)
        return lambda: stale
    problem = storable_json_problem(result)
    if problem:
        # The job ran and may have had effects: record a failure rather than
        # release the claim and run it again.
        log.error("run %s attempt %d: %s", run_id, attempt.number, problem)
        span.set_status(trace.StatusCode.ERROR, "invalid result")
        return lambda: ledger.fail_run(attempt, {"type": "InvalidResult", "message": problem}, policy)
    verdict = classify(result) if classify else Verdict.COMPLETED
    if verdict is Verdict.FAILED:
        return lambda: ledger.fail_run(attempt, result, policy)
    if verdict is Verdict.RELEASED:
        return lambda: ledger.release_run(attempt, result)
    return lambda: ledger.complete_run(attempt, result, policy)


# An error message is for people; a stack of HTML from a proxy is cut short.
MAX_ERROR_MESSAGE_CHARS = 4096


def error_document(exc: BaseException, details: object = None) -> dict[str, Any]:
    """A JSON document describing a job's exception, safe to store and to return."""
    try:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    except Exception:  # an exception whose __str__ raises
        message = f"{type(exc).__name__} (its message could not be read)"
    document: dict[str, Any] = {"type": type(exc).__name__, "message": str(message)[:MAX_ERROR_MESSAGE_CHARS]}
    if details is not None:
        try:
            document["details"] = json.loads(json.dumps(details, default=str))
        except Exception:  # circular, too deep, NaN-like values
            document["details"] = None
        if document["details"] is None or storable_json_problem(document["details"]):
            document["details"] = _safe_repr(details)
    return document


def storable_json_problem(value: object) -> str | None:
    """Why ``value`` cannot be stored as a result, or None when it can."""
    try:
        encoded = json.dumps(value, allow_nan=False)
    except Exception as exc:  # TypeError, ValueError, RecursionError, a raising __str__
        return f"the job's result is not JSON-serialisable: {type(exc).__name__}: {exc}"
    if len(encoded.encode("utf-8")) > MAX_STORED_JSON_BYTES:
        return f"the job's result is larger than {MAX_STORED_JSON_BYTES} bytes of JSON"
    return None


def _safe_repr(value: object) -> str:
    try:
        return repr(value)[:MAX_ERROR_MESSAGE_CHARS]
    except Exception:
        return f"<unprintable {type(value).__name__}>"
