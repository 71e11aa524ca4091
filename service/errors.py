"""The service's refusals: why it did not do what was asked (and that nothing was done).

Its own types, not HTTP's: the adapters render them (the answers table, ``handlers/answers.py``),
whichever surface asked.  ``NotFound``: what the request names is not declared or not known.
``Invalid``: the request breaks a rule the message names.  ``Declined``: a well-formed request
the state refuses, of a ``kind`` a client matches on, with details of its own (not ``Refused``,
which is a write answer in ``dedup.store``: one name, one idea).
"""

from __future__ import annotations

import enum
from typing import Any


class Refusal(Exception):
    """Nothing was done; ``message`` says why, in words a person acts on."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(Refusal):
    """What the request names (a job, a Scheduler job, a slot) is not declared or not known."""


class Invalid(Refusal):
    """The request breaks a rule (a malformed value, an ambiguous choice): sent again as it is, it fails again."""


class RefusalKind(enum.StrEnum):
    """Why a well-formed request was refused; the value is the code clients match on."""

    SLOT_NOT_DUE = "SlotNotDue"  # the slot has not come: running it now would answer its delivery
    EXECUTION_UNKNOWN = "ExecutionUnknown"  # its record may be forgotten: runs only when forced
    PRECONDITION_REQUIRED = "PreconditionRequired"  # reopening a failed slot needs the attempt seen
    RUN_NOT_RETRYABLE = "RunNotRetryable"  # only a failed manual run of a declared job is retried
    RUNS_ELSEWHERE = "RunsElsewhere"  # an external job: its own handler runs it, never this app
    STEP_NOT_WAITING = "StepNotWaiting"  # a step decision for a run not waiting on that step at that attempt


class Declined(Refusal):
    """A request the app's state refuses, as ``kind`` says, with what the client needs to act (``details``)."""

    def __init__(self, kind: RefusalKind, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.kind = kind
        self.details = details
