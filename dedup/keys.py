"""Turn a Cloud Scheduler delivery into the run it belongs to.

A scheduled run is identified by (project, location, Scheduler job id, UTC
schedule time).  Scheduler sends only the job id and the schedule time, so
the scope comes from the target's query string or headers, or from a
JobName given as a full resource name.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import re

import ciso8601

from dedup.errors import InvalidRunRequest

# Scheduler job ids: letters, digits, hyphens, underscores, at most 500.
SCHEDULER_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,500}")
# Project ids (optionally domain-scoped, "example.com:my-project") and locations.
PROJECT_ID = re.compile(r"(?:[a-z0-9][a-z0-9.-]{0,62}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")
LOCATION_ID = re.compile(r"[a-z][a-z0-9-]{0,62}")
_FULL_JOB_NAME = re.compile(r"projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/jobs/(?P<job>[^/]+)")
# Longer than any legal JobName, ScheduleTime or scope value: rejected unread.
MAX_HEADER_LENGTH = 1024
# Schedule times outside this range are refused (400): Cloud Scheduler sends
# the time an execution was due, so anything else is a forged or broken
# delivery, and every timestamp inside it has four digits and room for the
# arithmetic (a day before, a retention after) that jobs and records do.
EARLIEST_SCHEDULE_TIME = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
LATEST_SCHEDULE_TIME = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)
# A run id is SHA-256 in lower-case hex; nothing else is ever looked up.
_RUN_ID = re.compile(r"[0-9a-f]{64}")
# Anything but printable ASCII: a control character, DEL, or any non-ASCII one.
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")
# How far ahead of this server's clock a slot's delivery may say it is due and still be the slot's.
# Cloud Scheduler and App Engine run on Google's synchronised clocks; a slot is delivered at or
# after its time, never before, so more than this ahead is no slot's delivery (``ahead_of_its_time``).
CLOCK_SKEW_SECONDS = 10
_KEY_VERSION = "scheduler-run/v1"
# A Force run's key: its own, so it never takes the slot its schedule time names (docs/schedules.md).
_FORCE_RUN_KEY_VERSION = "force-run/v1"


@dataclasses.dataclass(frozen=True)
class ScheduledRunKey:
    """The identity of one scheduled execution."""

    project: str  # "" when the delivery names no scope
    location: str
    scheduler_job_name: str  # the short Scheduler job id
    schedule_time: datetime.datetime  # aware, UTC
    # A Force run (Cloud Scheduler's jobs.run): keyed apart from the slot its time may name.
    force_run: bool = False

    @property
    def schedule_time_text(self) -> str:
        return format_utc(self.schedule_time)

    @property
    def run_id(self) -> str:
        """SHA-256 hex over a length-prefixed encoding: no separator can collide."""
        version = _FORCE_RUN_KEY_VERSION if self.force_run else _KEY_VERSION
        return digest_parts(version, self.project, self.location, self.scheduler_job_name, self.schedule_time_text)

    def as_force_run(self) -> ScheduledRunKey:
        """The same delivery keyed as a Force run: its retries share the key, the slot keeps its own."""
        return dataclasses.replace(self, force_run=True)


def digest_parts(*parts: str) -> str:
    encoded = b"".join(str(len(raw)).encode("ascii") + b":" + raw for raw in (part.encode("utf-8") for part in parts))
    return hashlib.sha256(encoded).hexdigest()


def is_run_id(value: str) -> bool:
    """64 lower-case hex digits: the only shape of run id this app makes.

    Routes check it before any lookup, so no other text (a reserved
    Datastore name such as ``__x__``, an over-long key) reaches Datastore.
    """
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None


def format_utc(instant: datetime.datetime) -> str:
    """One spelling per instant: UTC, four-digit year, microseconds, ``Z`` (RFC 3339)."""
    utc = instant.astimezone(datetime.UTC)
    # strftime's %Y drops leading zeros on Linux (year 1 -> "1"): spell it out.
    return f"{utc.year:04d}-" + utc.strftime("%m-%dT%H:%M:%S.%fZ")


def _checked_text(field: str, value: str) -> str:
    if len(value) > MAX_HEADER_LENGTH:
        raise InvalidRunRequest(field, f"{field} is longer than {MAX_HEADER_LENGTH} characters")
    if _NOT_PRINTABLE_ASCII.search(value):
        raise InvalidRunRequest(field, f"{field} contains control or non-ASCII characters")
    return value


def parse_rfc3339(value: str, field: str) -> datetime.datetime:
    """Parse an RFC 3339 timestamp (``Z`` or ``±hh:mm``, any fraction) into UTC."""
    text = _checked_text(field, value).strip()
    try:
        # Fractions beyond microseconds are cut: Datastore keeps microseconds.
        return ciso8601.parse_rfc3339(text).astimezone(datetime.UTC)
    except (ValueError, OverflowError) as exc:
        raise InvalidRunRequest(field, f"{field} {value!r} is not an RFC 3339 timestamp: {exc}") from None


def check_schedule_time(field: str, instant: datetime.datetime) -> datetime.datetime:
    """Refuse an instant outside [EARLIEST_SCHEDULE_TIME, LATEST_SCHEDULE_TIME)."""
    if not EARLIEST_SCHEDULE_TIME <= instant < LATEST_SCHEDULE_TIME:
        raise InvalidRunRequest(
            field,
            f"{field} {format_utc(instant)} is outside the accepted range: from "
            f"{format_utc(EARLIEST_SCHEDULE_TIME)} up to (not including) {format_utc(LATEST_SCHEDULE_TIME)}",
        )
    return instant


def parse_schedule_time(value: str | None) -> datetime.datetime:
    """Parse an RFC 3339 ScheduleTime into UTC; refuse one outside the accepted range."""
    field = "X-CloudScheduler-ScheduleTime"
    if value is None or value == "":
        raise InvalidRunRequest(
            field,
            f"missing {field} header: Cloud Scheduler sends it only for jobs with a "
            "unix-cron schedule (e.g. '*/5 * * * *'); give the job one, since without "
            "a schedule time there is no way to tell a retry from a new execution. "
            "Not run; to run the job now, start a manual run (dedupctl run)",
        )
    return check_schedule_time(field, parse_rfc3339(value, field))


def _scope_value(field: str, pattern: re.Pattern[str], *candidates: tuple[str, str | None]) -> str:
    """Agree the candidates (source name, value) for one scope field; "" when none."""
    chosen: tuple[str, str] | None = None
    for source, raw in candidates:
        if raw is None or raw == "":
            continue
        value = _checked_text(source, raw)
        if not pattern.fullmatch(value):
            raise InvalidRunRequest(source, f"{source} {value!r} is not a valid {field}")
        if chosen is not None and chosen[1] != value:
            raise InvalidRunRequest(
                source,
                f"{field} given twice with different values: {chosen[0]}={chosen[1]!r} and {source}={value!r}",
            )
        chosen = (source, value)
    return chosen[1] if chosen else ""


def ahead_of_its_time(key: ScheduledRunKey, now: datetime.datetime) -> str | None:
    """Why this delivery is a Force run by its time alone, or None.

    Cloud Scheduler delivers no slot before its time, so a delivery carrying a time more than
    CLOCK_SKEW_SECONDS ahead is a Force run (console, ``gcloud scheduler jobs run``) carrying the
    next slot's time: keyed as that slot, it would take it, and the slot's own delivery would be
    answered as a duplicate (``ScheduledRunKey.as_force_run`` keys it apart)."""
    ahead = (key.schedule_time - now).total_seconds()
    if ahead <= CLOCK_SKEW_SECONDS:
        return None
    return (
        f"its schedule time is {ahead:.0f}s ahead of this server's clock (more than the "
        f"{CLOCK_SKEW_SECONDS}s skew allowed): no slot is delivered before its time"
    )


def scheduled_run_key(
    scheduler_job_name: str | None,
    schedule_time: str | None,
    *,
    query_project: str | None = None,
    query_location: str | None = None,
    header_project: str | None = None,
    header_location: str | None = None,
    configured_project: str | None = None,
    configured_location: str | None = None,
) -> ScheduledRunKey:
    """Build the run key of a delivery, or raise InvalidRunRequest naming the field.  The
    ``configured_`` scope (a handler's settings) is one more source, which the others must agree with."""
    field = "X-CloudScheduler-JobName"
    if scheduler_job_name is None or scheduler_job_name == "":
        raise InvalidRunRequest(field, f"missing {field} header: this endpoint serves Cloud Scheduler jobs")
    scheduler_job_name = _checked_text(field, scheduler_job_name)
    name_project = name_location = None
    full = _FULL_JOB_NAME.fullmatch(scheduler_job_name)
    if full:
        name_project, name_location = full["project"], full["location"]
        scheduler_job_name = full["job"]
    if not SCHEDULER_JOB_ID.fullmatch(scheduler_job_name):
        raise InvalidRunRequest(
            field,
            f"{field} must be a Scheduler job id (letters, digits, '-' and '_', at most "
            "500) or projects/P/locations/L/jobs/ID",
        )
    instant = parse_schedule_time(schedule_time)
    project = _scope_value(
        "project",
        PROJECT_ID,
        ("query parameter project", query_project),
        ("header X-Scheduler-Project", header_project),
        (field, name_project),
        ("the configured project", configured_project),
    )
    location = _scope_value(
        "location",
        LOCATION_ID,
        ("query parameter location", query_location),
        ("header X-Scheduler-Location", header_location),
        (field, name_location),
        ("the configured location", configured_location),
    )
    return ScheduledRunKey(project, location, scheduler_job_name, instant)
