"""An operator's review of a step whose outcome is unknown (dedup.steps.NeedsReview).

A run that stopped at an ``at_most_once`` step with ``on_unknown: review`` waits, failed, for a
person to check the downstream (by the step's key) and say what happened: the step is done (with
the result it would have returned, if any) or is to be run again.  The decision is written in one
transaction, only while the run still waits on that step at the attempt the operator saw, and
the run is then reopened at that attempt as an operator's run of its slot is
(``run_slot_later``): the next attempt resumes after its recorded steps, and takes the decided
step as decided.  Sent twice, the decision is written once and the reopen queued once.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from dedup.json_depth import MAX_JSON_DEPTH, nesting_depth_exceeds
from dedup.keys import is_run_id
from dedup.outcomes import RunOutcome
from dedup.steps import StepDecision, StepState, result_problem, review_step
from schedules.slots import slot_of_run
from service.errors import Declined, Invalid, NotFound, RefusalKind
from service.principal import Principal
from service.runs import Queued
from service.slots import MAX_SEEN_ATTEMPT, SlotRunRequest, check_slot_run, run_slot_later, run_slot_now
from service.state import AppState

DECISIONS = {"done": StepState.DONE, "rerun": StepState.RERUN}
MAX_RESULT_TEXT = 64 * 1024


@dataclasses.dataclass(frozen=True)
class StepReview:
    """What an operator asked of the step a run waits on: ``decision`` (done or rerun), the attempt
    they saw, and for done the step's result (what the step would have returned; None for none)."""

    step: str
    decision: object
    seen_attempt: object
    result: Any = None

    def parsed(self, by: str) -> StepDecision:
        """The decision, or Invalid naming the field that is wrong."""
        state = DECISIONS.get(self.decision) if isinstance(self.decision, str) else None
        if state is None:
            raise Invalid(f"decision must be done or rerun, got {str(self.decision)[:40]!r}")
        seen = self.seen_attempt
        if isinstance(seen, bool) or not isinstance(seen, int) or not 0 < seen <= MAX_SEEN_ATTEMPT:
            raise Invalid(f"attempt must be the run's attempt number as shown (1 to {MAX_SEEN_ATTEMPT})")
        if state == StepState.RERUN and self.result is not None:
            raise Invalid("a step run again takes no result: it returns its own")
        problem = result_problem(self.step, self.result) if state == StepState.DONE else None
        if problem:
            raise Invalid(problem)
        return StepDecision(self.step, state, seen, by, self.result)


def result_from_text(text: str) -> Any:
    """A form's result field as JSON (empty: None); Invalid when it is not JSON."""
    if not text.strip():
        return None
    if len(text) > MAX_RESULT_TEXT:
        raise Invalid(f"the step's result is at most {MAX_RESULT_TEXT} characters of JSON")
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        raise Invalid(f"the step's result must be JSON (or empty, for none): {str(exc)[:200]}") from None
    if nesting_depth_exceeds(value, MAX_JSON_DEPTH):
        raise Invalid(f"the step's result is nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def settle_step(
    state: AppState, principal: Principal, run_id: str, review: StepReview, queue: bool = False
) -> RunOutcome | Declined | Queued:
    """Write the operator's decision on the step ``run_id`` waits on, then reopen the run at the
    attempt they saw: run now (the API's), or with ``queue`` queued (the dashboard's), or answered
    from its record when a reopen already started.  NotFound, Invalid or Declined (nothing
    written) when the run does not wait on it."""
    record = state.ledger.lookup(run_id) if is_run_id(run_id) else None
    if record is None:
        raise NotFound(f"no run {run_id} (or it has expired)")
    decision = review.parsed(principal.name)
    slot = slot_of_run(record, state.with_pauses())
    if slot is None:
        raise Declined(
            RefusalKind.RUN_NOT_RETRYABLE,
            "only a scheduled slot's run is reopened after a review: this run is a "
            f"{record.source} run, whose steps a retry (a new run) would not keep",
            {"run_id": run_id, "source": record.source},
        )
    reopen = SlotRunRequest(seen_attempt=decision.seen_attempt)
    refused, _ = check_slot_run(state, slot, reopen)  # what would refuse the reopen refuses the decision
    if refused is not None:
        return refused
    waiting = review_step(record)
    settled = state.ledger.settle_step(run_id, decision)
    if isinstance(settled, str):
        details = {"run_id": run_id, "attempt": record.attempt, "step": waiting["step"] if waiting else None}
        return Declined(RefusalKind.STEP_NOT_WAITING, settled, details)
    if queue:
        return run_slot_later(state, principal, record.job_id, slot, reopen)
    return run_slot_now(state, principal, record.job_id, slot, reopen)
