"""Exceptions of the dedup protocol and of the jobs it runs."""

from __future__ import annotations


class InvalidRunRequest(ValueError):
    """The delivery cannot name a run (bad or missing header); nothing is written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class PermanentJobError(Exception):
    """Raised by a job when retrying cannot help (bad input, a rejected request).

    The run is recorded as failed and every later delivery replays the failure
    instead of running the job again.  Raise it also when the job may already
    have had side effects that must not be repeated.
    """

    def __init__(self, message: str, details: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class RetryableJobError(Exception):
    """Raised by a job for a transient failure.  Any other exception counts as one too.

    The run is released: its record stays, marked ``released``, and counts as absent
    for the next claim, so the next delivery runs the job again at once (as attempt
    N+1, keeping the attempt numbers and the history).
    """

    def __init__(self, message: str, details: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class StaleAttempt(Exception):
    """This attempt lost the run (a takeover): what it tried to record was refused, so it must stop.

    Raised to the job from a step's write; the runner records nothing for the attempt, since the
    run is another attempt's now.
    """
