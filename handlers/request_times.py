"""The one reading of a time a request carries: RFC 3339, in UTC, within the schedule times' range.

Query parameters (``since``, ``until``, ``from``), form fields, a path's ``schedule_time`` and a
task's JSON body are all read here, so each route holds them to the same bounds: from
2000-01-01T00:00:00Z up to (not including) 2100-01-01T00:00:00Z, the range of every schedule
time the app keys (``dedup.keys``, which reads the Scheduler's header to the same bounds).
docs/limits.md states them ("A time a request carries").  Inside them, a page's arithmetic (a
day either side, a zone's offset) never leaves Python's years 1 to 9999, so no such time is
ever an ``OverflowError``: whatever is outside is a 400 that names its field.
"""

from __future__ import annotations

import datetime

from flask import Response

from dedup.errors import InvalidRunRequest
from dedup.keys import EARLIEST_SCHEDULE_TIME, LATEST_SCHEDULE_TIME, parse_rfc3339
from handlers.problems import problem


def _spelled(instant: datetime.datetime) -> str:
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ")


EXAMPLE = "2030-01-01T00:00:00Z"
# What every refusal says the field must be: the format and the bounds, in one phrase.
RULE = (
    f"an RFC 3339 timestamp such as {EXAMPLE}, at or after {_spelled(EARLIEST_SCHEDULE_TIME)} "
    f"and before {_spelled(LATEST_SCHEDULE_TIME)}"
)


class BadTime(ValueError):
    """A time a request carries that is not RFC 3339 within the bounds: a 400 naming ``field``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def request_time(field: str, value: object) -> datetime.datetime:
    """The instant ``value`` (what the request gave as ``field``) names, in UTC; BadTime if it is
    not a string, not RFC 3339 (a ``Z`` or ``±hh:mm`` offset; fractions cut at microseconds), or
    outside the bounds (RULE)."""
    if not isinstance(value, str):
        raise BadTime(field, f"{field} must be {RULE}, not {type(value).__name__}")
    try:
        instant = parse_rfc3339(value, field)
    except InvalidRunRequest as exc:  # its message names the field and says what is wrong
        raise BadTime(field, f"{field} must be {RULE}: {exc.message}") from None
    if not EARLIEST_SCHEDULE_TIME <= instant < LATEST_SCHEDULE_TIME:
        raise BadTime(field, f"{field} must be {RULE}: {value!r} is outside that range")
    return instant


def time_problem(bad: BadTime) -> Response:
    """The API's answer to a bad time: a 400 problem naming the field, as a member too."""
    return problem(400, "InvalidParameterException", bad.message, field=bad.field)
