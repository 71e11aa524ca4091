"""scheduler.yaml: the Cloud Scheduler jobs that target this app, validated against jobs.yaml.

Read by the ops CLI (``python -m deploy scheduler ...``) and by the app at
start-up (it knows its schedules: schedules.slots), with one validation.

Validation catches what breaks deduplication, not only what gcloud would
refuse: a schedule that sends no ScheduleTime or never fires, a job whose
deliveries the app would refuse (delivery_problem), a lease shorter than the
attempt deadline, a retention shorter than the retry window or the period,
a job id shared across scopes that are not passed to the app.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import os
import re
import urllib.parse
import zoneinfo
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Self

import pydantic
import yaml
from croniter import croniter
from croniter.croniter import CroniterBadDateError
from pydantic import BeforeValidator, Field, PrivateAttr, model_validator
from pydantic_core import ErrorDetails

from dedup.errors import InvalidRunRequest
from dedup.keys import (
    PROJECT_ID,
    SCHEDULER_JOB_ID,
    check_schedule_time,
    format_utc,
    parse_rfc3339,
    scheduled_run_key,
)
from jobs.base import MAX_BODY_BYTES, MAX_SECONDS
from jobs.config import REQUEST_TIMEOUT_SECONDS, JobSpec, load_strict_yaml
from jobs.declared import Declaration, check, error_field, field_problem, reason

DEFAULT_FILE = "scheduler.yaml"
MIN_ATTEMPT_DEADLINE = 15
MAX_ATTEMPT_DEADLINE = 24 * 3600 + 15  # App Engine targets: 15 s to 24 h 15 s (job.proto)
METHODS = ("POST", "GET")  # what /jobs/<job_id> serves
LIST_DELIMITERS = (",", ";", "|", "~", "#", "@")  # gcloud's dict flags ("gcloud topic escaping")
# A Cloud region as Scheduler and App Engine name them (us-central1); also bootstrap's --region.
SCHEDULER_LOCATION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[dhms])+|\d+(?:\.\d+)?")  # 600, 600s, 10m, 1h30m, 1d
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms]?)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "": 1}
_RESERVED_HEADER = re.compile(r"(?i)(x-google-|x-appengine-|x-cloudscheduler)")
# Scheduler starts an execution's first attempt a little after its schedule time; a slot
# is not missed while a first attempt could still be on its way.
DELIVERY_GRACE_SECONDS = 120
# The outcomes of the audit's deadline and failure-streak lines (python -m deploy alerts alerts on them).
BREACH_OUTCOMES = ("late", "overdue", "slow", "failing")
DEFAULT_CATCHUP_Window = 86400  # a day: what a resume's catch-up reaches back by default
MAX_CATCHUP_Window = 366 * 86400
# A catch-up dispatches at most this many runs unless a job says otherwise (max_catchup_runs), and
# never more than an audit pass judges of a job (schedules.slots.MAX_SLOTS): after a long outage
# the newest slots run and the older stay as they are (paused, or missed and reported), so a
# catch-up cannot flood the queue and the services behind it.
DEFAULT_MAX_CATCHUP_RUNS = 100
MAX_CATCHUP_RUNS_LIMIT = 1000
# How often cron.yaml runs /tasks/audit (tests/test_deployment_files.py holds the two equal).
AUDIT_INTERVAL_SECONDS = 15 * 60
# The project the shipped scheduler.yaml names until someone fills in theirs: project ids have
# no reserved names, so validation knows this one (and refuses it) rather than let
# `scheduler apply` aim at a project that is not the user's.
PLACEHOLDER_PROJECT = "your-project-id"


@dataclasses.dataclass(frozen=True)
class Problem:
    job: str | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = " ".join(
            p for p in (f"job {self.job!r}" if self.job else "", f"field {self.field!r}" if self.field else "") if p
        )
        return f"{DEFAULT_FILE}: {where + ': ' if where else ''}{self.message}"


def relative_url(target: str, pass_scope: bool, project: str, location: str) -> str:
    """What a Scheduler job calls: /jobs/<target>, with its scope in the query unless not ``pass_scope``."""
    path = f"/jobs/{target}"
    if pass_scope:
        path += "?" + urllib.parse.urlencode({"project": project, "location": location})
    return path


def history_id(job: SchedulerJob) -> str:
    """The Scheduler job's id in its project and location: what its history, pauses and audit mark are kept under."""
    return f"{job.project}/{job.location}/{job.name}"


class ScheduleFileError(ValueError):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def load_scheduler_file(path: str) -> list[SchedulerJob]:
    try:
        with open(path, encoding="utf-8") as handle:
            document = load_strict_yaml(handle)
    except OSError as exc:
        raise ScheduleFileError([Problem(None, None, f"cannot read {path}: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        raise ScheduleFileError([Problem(None, None, f"not UTF-8 text: {exc}")]) from None
    except yaml.YAMLError as exc:
        raise ScheduleFileError([Problem(None, None, f"not valid YAML: {exc}")]) from None
    return parse_scheduler_document(document)


def parse_scheduler_document(document: Any) -> list[SchedulerJob]:
    if not isinstance(document, dict) or not isinstance(document.get("jobs"), dict) or not document["jobs"]:
        raise ScheduleFileError([Problem(None, "jobs", "the file must map 'jobs' to at least one Scheduler job")])
    try:
        declared = SchedulerFile.model_validate(document)
    except pydantic.ValidationError as exc:
        raise ScheduleFileError([_problem(error) for error in exc.errors()]) from None
    for key, job in declared.jobs.items():
        job._key = key
    return list(declared.jobs.values())


# Where scheduled_run_key finds what a delivery carries, and the field of scheduler.yaml it comes from.
_DELIVERY_FIELDS = {
    "X-CloudScheduler-JobName": "name",
    "X-CloudScheduler-ScheduleTime": "schedule",
    "query parameter project": "project",
    "query parameter location": "location",
    "header X-Scheduler-Project": "headers",
    "header X-Scheduler-Location": "headers",
}


def delivery_problem(
    name: str, url: str, headers: Mapping[str, str], schedule_time: datetime.datetime
) -> tuple[str, str] | None:
    """(field, message) if the app would refuse the delivery of ``schedule_time`` by the
    Scheduler job ``name`` calling ``url`` with ``headers``, else None.

    The key is derived exactly as /jobs/<job_id> derives it (handlers/scheduler.py), from
    what Cloud Scheduler sends for the job: its relative URL's query, its headers (names
    case-insensitive, as HTTP has them) and its job id.
    """
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    sent = {header.lower(): value for header, value in headers.items()}
    try:
        scheduled_run_key(
            name,
            format_utc(schedule_time),
            query_project=query.get("project"),
            query_location=query.get("location"),
            header_project=sent.get("x-scheduler-project"),
            header_location=sent.get("x-scheduler-location"),
        )
    except InvalidRunRequest as exc:
        return _DELIVERY_FIELDS.get(exc.field, "headers"), f"the app would refuse every delivery (400): {exc.message}"
    return None


# -- scheduler.yaml, declared ------------------------------------------------------------------


def _duration(value: Any) -> float:
    """Seconds from 600, '600s', '10m', '1h', '1h30m' or '1d' (gcloud's duration forms), at most
    MAX_SECONDS (ten years: longer than any retention, and room for the date arithmetic)."""
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value) if 0 <= value <= MAX_SECONDS else None  # NaN compares false
    elif isinstance(value, str) and _DURATION.fullmatch(value.strip().lower()):
        seconds = sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(value.strip().lower()))
    if seconds is not None and seconds <= MAX_SECONDS:
        return seconds
    raise ValueError(
        f"{value!r} is not a duration of at most {MAX_SECONDS}s, ten years (seconds, or e.g. '30s', '10m', '1h30m')"
    )


def _within(inside: Callable[[float], bool], wrong: Callable[[float], str]) -> Callable[[Any], float]:
    """A duration ``inside`` its bounds; ``wrong`` says what is wrong with another."""

    def duration(value: Any) -> float:
        seconds = _duration(value)
        if not inside(seconds):
            raise ValueError(wrong(seconds))
        return seconds

    return duration


def _required(check: Callable[[str], str | None] = lambda _: None) -> Callable[[Any], str]:
    """A non-empty string that ``check`` finds nothing wrong with (it says what is, or None)."""

    def text(value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise ValueError("missing (or not a string)")
        wrong = check(value)
        if wrong:
            raise ValueError(wrong)
        return value

    return text


def _cron(schedule: str) -> str | None:
    fields = schedule.strip().split()
    if len(fields) == 5 and croniter.is_valid(schedule.strip()) and all(_plain_cron_field(f) for f in fields):
        return None
    return (
        f"{schedule.strip()!r} is not a unix-cron schedule ('MIN HOUR DOM MON DOW', e.g. '*/5 * * * *'): "
        "Cloud Scheduler sends X-CloudScheduler-ScheduleTime only for unix-cron schedules, and without it "
        "no delivery can be deduplicated"
    )


_CRON_TOKEN = re.compile(r"\*|\d+|JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC|SUN|MON|TUE|WED|THU|FRI|SAT", re.I)


def _plain_cron_field(field: str) -> bool:
    """Unix-cron as Cloud Scheduler takes it: numbers, names, *, ranges, lists and steps
    (croniter also accepts L, W, # and ?, which Scheduler does not)."""
    return all(_CRON_TOKEN.fullmatch(token) for token in re.split(r"[,/-]", field))


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if not SCHEDULER_JOB_ID.fullmatch(value):
        raise ValueError("Scheduler job names are 1 to 500 letters, digits, '-' and '_'")
    return value


def _time_zone(value: Any) -> str:
    if not (isinstance(value, str) and _known_time_zone(value)):
        raise ValueError(f"{value!r} is not a tz database time zone (e.g. Etc/UTC, utc, Europe/Paris)")
    return value


def _method(value: Any) -> str:
    method = value.upper() if isinstance(value, str) else value
    if method not in METHODS:
        raise ValueError(f"{method!r}: /jobs/<job_id> serves {' and '.join(METHODS)}")
    return str(method)


def _body(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError("must be a string, sent with POST only")
    if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > MAX_BODY_BYTES:
        raise ValueError(
            f"is over {MAX_BODY_BYTES} bytes: the app answers 413 to a larger body, so no delivery would run"
        )
    return value


def _headers(value: Any) -> dict[str, str]:
    headers = {} if value is None else value
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValueError("must map header names to string values")
    for header in headers:
        if _RESERVED_HEADER.match(header):
            raise ValueError(
                f"{header!r}: X-Google-*, X-AppEngine-* and X-CloudScheduler* are set by Google, not by jobs"
            )
    if len({header.lower() for header in headers}) < len(headers):
        raise ValueError("two header names differ only in case: HTTP header names are case-insensitive")
    if headers and all(any(d in f"{k}={v}" for k, v in headers.items()) for d in LIST_DELIMITERS):
        raise ValueError(
            f"between them the headers use every list delimiter gcloud offers ({' '.join(LIST_DELIMITERS)})"
        )
    return dict(headers)


def _note(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError("is a string saying why the job is paused, beside paused: true")
    if isinstance(value, str) and (len(value) > 500 or any(ord(ch) < 0x20 for ch in value)):
        raise ValueError("at most 500 characters, on one line")
    return value


def _start_at(value: Any) -> datetime.datetime | None:
    """start_at: an RFC 3339 instant (YAML may give it as a timestamp) from which slots are expected."""
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ValueError("needs a UTC offset (e.g. 2026-12-01T00:00:00Z): a bare time is no one instant")
        instant = value.astimezone(datetime.UTC)
    elif isinstance(value, str):
        try:
            instant = parse_rfc3339(value, "start_at")
        except InvalidRunRequest:
            raise ValueError(f"{value!r} is not an RFC 3339 timestamp such as 2026-12-01T00:00:00Z") from None
    else:
        raise ValueError("must be an RFC 3339 timestamp such as 2026-12-01T00:00:00Z")
    try:
        return check_schedule_time("start_at", instant)
    except InvalidRunRequest as exc:
        raise ValueError(exc.message) from None


_DURATION_SCHEMA = float | Annotated[str, Field(pattern=r"^\s*((\d+(\.\d+)?[dhmsDHMS])+|\d+(\.\d+)?)\s*$")]
Duration = Annotated[float, check(_duration, _DURATION_SCHEMA)]
_Window = Annotated[
    float,
    check(
        _within(
            lambda s: 0 < s <= MAX_CATCHUP_Window, lambda s: f"{s:g}s: from 1s to {MAX_CATCHUP_Window // 86400} days"
        ),
        _DURATION_SCHEMA,
    ),
]
_Deadline = Annotated[
    float | None,
    check(
        _within(
            lambda s: MIN_ATTEMPT_DEADLINE <= s <= MAX_ATTEMPT_DEADLINE,
            lambda s: f"{int(s)}s: App Engine targets take 15s to 24h15s",
        ),
        _DURATION_SCHEMA,
    ),
]
_String = Annotated[str | None, check(_string)]  # may be left out, not written as null
_Streak = Annotated[int, Field(ge=1, le=1000)]  # failed executions in a row
_Schedule = Annotated[str, check(lambda value: _required(_cron)(value).strip(), Annotated[str, Field(min_length=9)])]
_Project = Annotated[str, check(_required(lambda p: None if PROJECT_ID.fullmatch(p) else f"{p!r} is not a project id"))]
_Location = Annotated[
    str,
    check(
        _required(
            lambda p: None if SCHEDULER_LOCATION.fullmatch(p) else f"{p!r} is not a location such as us-central1"
        ),
        Annotated[str, Field(pattern=f"^{SCHEDULER_LOCATION.pattern}$")],
    ),
]


def _window_bound(value: Any) -> datetime.datetime:
    """One end of a dated exclusion window: an RFC 3339 instant (YAML may give it as a timestamp)."""
    if value is None:
        raise ValueError("must be an RFC 3339 timestamp such as 2026-12-24T00:00:00Z")
    instant = _start_at(value)
    assert instant is not None
    return instant


_Instant = Annotated[datetime.datetime | None, check(_window_bound, datetime.datetime | None)]


@functools.lru_cache(maxsize=512)
def _window_starts(
    cron: str, duration: float, zone: datetime.tzinfo, day: datetime.date
) -> tuple[datetime.datetime, ...]:
    """The starts (UTC, oldest first) of a recurring window whose occurrences may cover an instant of
    the UTC ``day``: from ``duration`` before the day to its end.  In UTC: aware datetimes of one
    zone add and compare by the wall clock, so a window over a change of clocks would last an
    hour more or less than its duration."""
    first = datetime.datetime.combine(day, datetime.time(), datetime.UTC) - datetime.timedelta(seconds=duration)
    end = first + datetime.timedelta(seconds=duration) + datetime.timedelta(days=1)
    iterator = croniter(cron, (first - datetime.timedelta(seconds=1)).astimezone(zone))
    found = []
    while (begins := iterator.get_next(datetime.datetime).astimezone(datetime.UTC)) < end:
        found.append(begins)
    return tuple(found)


class ExclusionWindow(Declaration):
    """A time the job's slots are not expected (planned downtime): recurring, from each time ``cron``
    fires in the job's time zone for ``duration``; or dated, from ``from`` until ``until``."""

    cron: Annotated[str | None, check(lambda value: _required(_cron)(value).strip(), str | None)] = None
    """A unix-cron schedule, in the job's time zone, of when each window starts."""
    duration: _Window | None = None
    """How long each recurring window lasts."""
    starts: Annotated[_Instant, Field(alias="from")] = None
    """A dated window's start (RFC 3339), included."""
    until: _Instant = None
    """A dated window's end (RFC 3339), excluded."""
    note: _String = None
    """Why: shown beside the window."""

    @model_validator(mode="after")
    def one_kind(self) -> Self:
        recurring, dated = self.cron is not None or self.duration is not None, (self.starts, self.until) != (None, None)
        if recurring == dated:
            raise field_problem("cron", "a window is recurring (cron and duration) or dated (from and until)")
        if recurring and (self.cron is None or self.duration is None):
            raise field_problem("duration" if self.cron else "cron", "a recurring window needs cron and duration")
        if dated and (self.starts is None or self.until is None or self.starts >= self.until):
            raise field_problem("until", "a dated window needs from, and an until after it")
        return self

    def covers(self, instant: datetime.datetime, zone: datetime.tzinfo) -> bool:
        """Whether ``instant`` (aware) lies in this window."""
        return self.occurrence(instant, zone) is not None

    def occurrence(
        self, instant: datetime.datetime, zone: datetime.tzinfo
    ) -> tuple[datetime.datetime, datetime.datetime] | None:
        """The start and end (UTC) of this window's occurrence that ``instant`` (aware) lies in, or None."""
        if self.starts is not None and self.until is not None:
            return (self.starts, self.until) if self.starts <= instant < self.until else None
        assert self.cron is not None and self.duration is not None
        utc = instant.astimezone(datetime.UTC)
        # The starts that can reach the instant, a UTC day's at a time and kept: a page judges
        # thousands of slots of one job, and croniter costs about 100 µs a step.
        for begins in reversed(_window_starts(self.cron, self.duration, zone, utc.date())):
            if begins <= utc:
                ends = begins + datetime.timedelta(seconds=self.duration)
                return (begins, ends) if utc < ends else None
        return None

    def occurrences(
        self, since: datetime.datetime, until: datetime.datetime, zone: datetime.tzinfo, limit: int = 100
    ) -> list[tuple[datetime.datetime, datetime.datetime]]:
        """The starts and ends (UTC) of this window's occurrences that overlap [since, until), oldest
        first, ``limit`` at most (the timeline draws them)."""
        if self.starts is not None and self.until is not None:
            return [(self.starts, self.until)] if self.starts < until and self.until > since else []
        assert self.cron is not None and self.duration is not None
        length = datetime.timedelta(seconds=self.duration)
        iterator = croniter(self.cron, (since - length).astimezone(zone))
        found: list[tuple[datetime.datetime, datetime.datetime]] = []
        while len(found) < limit:
            begins = iterator.get_next(datetime.datetime).astimezone(datetime.UTC)
            if begins >= until:
                break
            if begins + length > since:
                found.append((begins, begins + length))
        return found

    def words(self) -> str:
        """The window as the plan and the pages say it."""
        if self.cron is not None:
            text = f"from each '{self.cron}' for {self.duration:g}s"
        else:
            assert self.starts is not None and self.until is not None
            text = f"from {format_utc(self.starts)} until {format_utc(self.until)}"
        return f"{text} ({self.note})" if self.note else text


class RetryConfig(Declaration):
    """How Cloud Scheduler retries an execution whose attempt failed (its job's retryConfig)."""

    retry_count: Annotated[int, Field(ge=0, le=5)] = 0
    """Retries of a failed attempt: 0 to 5."""
    max_retry_duration: Duration = 0
    """How long retries go on, from the first attempt (0: no limit but retry_count)."""
    min_backoff: Duration = 5
    """The wait before the first retry."""
    max_backoff: Duration = 3600
    """The longest wait between retries."""
    max_doublings: Annotated[int, Field(ge=0, le=16)] = 5
    """How often the wait doubles before it grows linearly: 0 to 16."""

    @model_validator(mode="after")
    def backoff_grows(self) -> Self:
        if self.max_backoff < self.min_backoff:
            raise field_problem(
                "max_backoff", f"{self.max_backoff:g}s is shorter than min_backoff ({self.min_backoff:g}s)"
            )
        return self


class SchedulerJob(Declaration):
    """A Cloud Scheduler job that calls this app: what scheduler.yaml says of it (docs/schedules.md),
    and only that: what the app learns of it later is a BoundJob's (schedules.bound)."""

    # Where the file declares it (its key under jobs:); a job built in code is keyed by its name.
    _key: str = PrivateAttr("")

    name: Annotated[str, check(_name, Annotated[str, Field(pattern="^[A-Za-z0-9_-]{1,500}$")])]
    """The Cloud Scheduler job id (by default the declaration's key)."""
    target: Annotated[str, check(_required(), Annotated[str, Field(min_length=1)])]
    """The job of jobs.yaml it delivers to (/jobs/<target>)."""
    schedule: _Schedule
    """A unix-cron schedule, MIN HOUR DOM MON DOW (e.g. '*/5 * * * *')."""
    project: _Project
    """The Google Cloud project of the Scheduler job (and of the app)."""
    location: _Location
    """The Scheduler job's region, e.g. us-central1."""
    time_zone: Annotated[str, check(_time_zone)] = "Etc/UTC"
    """The schedule's tz database time zone (Etc/UTC, utc, Europe/Paris)."""
    method: Annotated[str, check(_method, Annotated[str, Field(pattern="^([Pp][Oo][Ss][Tt]|[Gg][Ee][Tt])$")])] = "POST"
    """POST or GET."""
    body: Annotated[str | None, check(_body, str | None)] = None
    """The body of each delivery (POST only)."""
    headers: Annotated[dict[str, str], check(_headers, dict[str, str] | None)] = {}
    """Headers sent with each delivery (not X-Google-*, X-AppEngine-*, X-CloudScheduler*)."""
    attempt_deadline: _Deadline = None
    """How long an attempt may take: 15s to 24h15s (by default the scaling type's request timeout)."""
    retry: Annotated[RetryConfig, BeforeValidator(lambda value: {} if value is None else value)] = RetryConfig()
    """How Cloud Scheduler retries a failed attempt."""
    service: _String = None
    """The App Engine service it calls (by default app.yaml's)."""
    version: _String = None
    """The App Engine version it calls (by default the serving one)."""
    scaling: Literal["automatic", "basic", "manual"] = "automatic"
    """The target service's scaling type, which bounds the attempt deadline."""
    pass_scope: bool = True
    """Send the project and location in the URL, so that one job id in two places keeps two keys."""
    description: _String = None
    """The Scheduler job's description."""
    start_at: Annotated[datetime.datetime | None, check(_start_at, datetime.datetime | None)] = None
    """From when slots are expected of the app (RFC 3339)."""
    catchup_window: _Window = DEFAULT_CATCHUP_Window
    """How far back a catch-up (resume, misfire) reaches: 1s to 366 days."""
    misfire: Literal["none", "run_latest", "run_all", "compact"] = "none"
    """What the audit does with missed slots: none (report them), run_latest, run_all, or compact
    (one run of the newest standing for the others)."""
    max_catchup_runs: Annotated[int, Field(ge=1, le=MAX_CATCHUP_RUNS_LIMIT)] = DEFAULT_MAX_CATCHUP_RUNS
    """The most runs one catch-up (a resume's, the misfire policy's) dispatches: the newest slots."""
    exclude: Annotated[
        tuple[ExclusionWindow, ...], BeforeValidator(lambda value: tuple(value) if isinstance(value, list) else value)
    ] = ()
    """Planned downtime: its slots are excluded (not expected, never alerted) and not run when delivered."""
    run_excluded: bool = False
    """true: a delivery of an excluded slot runs all the same (it is still not expected)."""
    catch_up_after_exclusion: Literal["none", "latest", "compact"] = "none"
    """Once a window ends, the audit runs its newest slot (latest), or one run of it standing for
    the window's others (compact); none leaves them excluded."""
    paused: bool | None = None
    """true: the job is kept paused; false: kept running; unsaid: left as it is."""
    note: Annotated[str | None, check(_note, Annotated[str, Field(max_length=500)] | None)] = None
    """Why the job is paused, beside paused: true."""
    finish_within: _Window | None = None
    """The audit alerts on a slot not completed this long after its time."""
    max_runtime: _Window | None = None
    """The audit alerts on a run going on longer than this."""
    alert_after_consecutive_failures: _Streak | None = None
    """The audit alerts after this many failed executions in a row (1 to 1000)."""
    pause_after_consecutive_failures: _Streak | None = None
    """The audit pauses the job after this many failed executions in a row (1 to 1000)."""

    @property
    def key(self) -> str:
        """The job's key in scheduler.yaml: what a problem with it is reported under."""
        return self._key or self.name

    @property
    def deadline(self) -> float:
        """The attempt deadline: the file's, else the scaling type's request timeout."""
        return self.attempt_deadline or REQUEST_TIMEOUT_SECONDS[self.scaling]

    @property
    def relative_url(self) -> str:
        return relative_url(self.target, self.pass_scope, self.project, self.location)

    @model_validator(mode="after")
    def body_with_post(self) -> Self:
        if self.body is not None and self.method != "POST":
            raise field_problem("body", "must be a string, sent with POST only")
        return self

    @model_validator(mode="after")
    def note_beside_paused(self) -> Self:
        if self.note is not None and self.paused is not True:
            raise field_problem("note", "is a string saying why the job is paused, beside paused: true")
        return self

    @model_validator(mode="after")
    def fires(self) -> Self:
        if first_schedule_time(self.schedule, self.time_zone) is None:
            raise field_problem(
                "schedule",
                f"{self.schedule!r} never fires: no date matches it (such as February 30th), "
                "so the job would never run",
            )
        return self

    @model_validator(mode="after")
    def deliveries_are_accepted(self) -> Self:
        """The app must accept what Cloud Scheduler sends for the job: its key is derived exactly as
        /jobs/<job_id> derives it, from the job's URL query, headers and id."""
        first = first_schedule_time(self.schedule, self.time_zone)
        assert first is not None  # fires
        url = relative_url(self.target, self.pass_scope, self.project, self.location)
        refused = delivery_problem(self.name, url, self.headers, first)
        if refused is not None:
            raise field_problem(*refused)
        return self


MAX_HTTP_ATTEMPT_DEADLINE = 30 * 60  # HTTP targets: 15 s to 30 min (job.proto)


def external_target_problems(job: SchedulerJob, external_url: str | None = None) -> list[Problem]:
    """What keeps an external job's Scheduler job (an HTTP target calling its handler) from being
    keyed as the app keys its slots: the scope must travel with each delivery, since the app
    cannot see the handler's DEDUP_PROJECT and DEDUP_LOCATION; and an HTTP target's deadline."""
    problems = []
    project, location = delivery_scope(job)
    if not (project and location):
        problems.append(
            Problem(
                job.key,
                "pass_scope",
                "an external target's deliveries must carry their project and location (pass_scope: true, the "
                "default), so its handler keys each slot exactly as this app lists and runs it",
            )
        )
    if job.deadline > MAX_HTTP_ATTEMPT_DEADLINE:
        problems.append(
            Problem(
                job.key,
                "attempt_deadline",
                f"{int(job.deadline)}s is longer than an HTTP target's limit ({MAX_HTTP_ATTEMPT_DEADLINE}s): "
                "Cloud Scheduler refuses it",
            )
        )
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(external_url).query) if external_url else {}
    if not job.pass_scope and {"project", "location"} & set(query):
        problems.append(
            Problem(
                job.key,
                "pass_scope",
                "the external job's url names a project or location in its query, beside the scope this job sends "
                "in its headers: the handler would refuse every delivery whose two scopes differ. Take them out "
                "of the url, or set pass_scope: true",
            )
        )
    for field, value in (("service", job.service), ("version", job.version)):
        if value is not None:
            problems.append(Problem(job.key, field, "names an App Engine target: an external job's is its url"))
    return problems


def delivery_scope(job: SchedulerJob) -> tuple[str | None, str | None]:
    """(project, location) as a delivery of ``job`` carries them: its URL's query, else its headers."""
    if job.pass_scope:
        return job.project, job.location
    headers = {name.lower(): value for name, value in job.headers.items()}
    return headers.get("x-scheduler-project"), headers.get("x-scheduler-location")


def _merge_defaults(document: dict[str, Any]) -> dict[str, Any]:
    """Each job with the file's defaults under its own keys (retry merged key by key), and its
    name defaulting to its key."""
    defaults = document.get("defaults") or {}
    defaults = defaults if isinstance(defaults, dict) else {}  # refused as the file's defaults, not per job
    if not isinstance(document.get("jobs"), dict):
        return document
    jobs: dict[Any, Any] = {}
    for key, settings in document["jobs"].items():
        if isinstance(settings, dict):
            merged = {"name": key, **defaults, **settings}
            if isinstance(defaults.get("retry"), dict) and isinstance(settings.get("retry"), dict):
                merged["retry"] = {**defaults["retry"], **settings["retry"]}
            settings = merged
        jobs[key] = settings
    return {**document, "jobs": jobs}


class SchedulerFile(Declaration):
    """scheduler.yaml: the Cloud Scheduler jobs that call this app, and the defaults they share."""

    defaults: dict[str, Any] | None = None
    """Keys every job takes unless it gives its own (retry: key by key)."""
    jobs: Annotated[dict[str, SchedulerJob], Field(min_length=1)]
    """The Scheduler jobs, each under a key of its own (its name by default)."""

    @model_validator(mode="before")
    @classmethod
    def jobs_take_the_defaults(cls, document: Any) -> Any:
        return _merge_defaults(document) if isinstance(document, dict) else document


def _problem(error: ErrorDetails) -> Problem:
    """A mistake in scheduler.yaml, as the file's readers were always told it."""
    place, kind = error["loc"], error["type"]
    if place[:1] != ("jobs",) or len(place) < 2:
        if kind == "extra_forbidden":
            return Problem(None, None, f"unknown top-level key {place[0]!r}; allowed: defaults, jobs")
        return Problem(None, str(place[0]) if place else None, reason(error))
    key = str(place[1])
    if place[2:] == ("[key]",):
        return Problem(key, "name", "must be a string")
    if len(place) == 2 and kind != "field_problem":
        return Problem(key, None, "settings must be a mapping")
    field = error_field(error, skip=2)
    if kind == "missing":
        return Problem(key, field, "missing (or not a string)")
    if kind in ("extra_forbidden", "invalid_key"):
        nested: dict[str, type[Declaration]] = {"retry": RetryConfig, "exclude": ExclusionWindow}
        declared = nested.get(str(place[2]), SchedulerJob)
        allowed = (spec.alias or name for name, spec in declared.model_fields.items())
        return Problem(key, field, f"unknown key; allowed: {', '.join(sorted(allowed))}")
    return Problem(key, field, reason(error))


def _known_time_zone(name: str) -> bool:
    """A tz database zone name as Scheduler takes them ("utc" too, as gcloud suggests);
    not the local-system aliases zoneinfo also resolves."""
    return name.lower() == "utc" or (name in _tz_database() and name not in ("Factory", "localtime"))


@functools.cache
def _tz_database() -> frozenset[str]:
    """zoneinfo's zone names, read once: available_timezones() walks the tz directory on every call
    (4 ms, which a fleet of 1,000 Scheduler jobs paid per job at start-up)."""
    return frozenset(zoneinfo.available_timezones())


def schedule_zone(time_zone: str) -> zoneinfo.ZoneInfo:
    """The zone of a time_zone validation accepted ("utc" too)."""
    return zoneinfo.ZoneInfo("Etc/UTC" if time_zone.lower() == "utc" else time_zone)


# Where schedule_period_seconds and first_schedule_time start looking.
_PERIOD_START = datetime.datetime(2026, 1, 1)


@functools.cache
def first_schedule_time(schedule: str, time_zone: str) -> datetime.datetime | None:
    """The schedule's first time from 2026 on (UTC), or None when no date matches it ("0 0 30 2 *").

    Remembered: a pure function of its text, which two rules of a job (fires,
    deliveries_are_accepted) ask for.

    croniter looks up to 50 years ahead; a unix-cron schedule that fires at all
    fires at least every 8 years (February 29th, 2096 then 2104).
    """
    start = _PERIOD_START.replace(tzinfo=schedule_zone(time_zone))
    try:
        first: datetime.datetime = croniter(schedule, start).get_next(datetime.datetime)
        return first.astimezone(datetime.UTC)
    except CroniterBadDateError:
        return None


# How many executions the period check steps through: all of a year (at most 2,000) for the ops
# CLI, which validates the file before every deploy; the first two gaps at the app's start-up,
# where a fleet of 1,000 distinct schedules would otherwise cost each worker minutes of CPU
# before it serves (schedules.config.dedup_problems, exhaustive).
EXHAUSTIVE_PERIOD_STEPS = 2000
START_UP_PERIOD_STEPS = 2


@functools.cache
def schedule_period_seconds(schedule: str, time_zone: str, steps: int = EXHAUSTIVE_PERIOD_STEPS) -> float:
    """The longest gap between two executions over the coming year (at most ``steps`` of them),
    or between the first two when they are further apart ("0 0 29 2 *": four years).

    For a schedule validation accepted (one that fires: first_schedule_time).  A pure function
    of its text, and up to ``steps`` cron steps: remembered, so each app and each check pays it once.
    """
    start = _PERIOD_START.replace(tzinfo=schedule_zone(time_zone))
    iterator = croniter(schedule, start)
    previous = iterator.get_next(datetime.datetime)
    longest = 0.0
    for _ in range(steps):
        current = iterator.get_next(datetime.datetime)
        longest = max(longest, (current - previous).total_seconds())
        previous = current
        if (current - start).days > 400:
            break
    return longest


def backoff_seconds(min_backoff: float, max_backoff: float, max_doublings: int, index: int) -> float:
    """The wait before retry ``index`` (0 for the first), as Cloud Scheduler and Cloud Tasks both
    back off: from ``min_backoff``, doubling ``max_doublings`` times, then growing by the last
    doubled wait each retry, capped at ``max_backoff``."""
    doubled = min(index, max_doublings)
    return min(min_backoff * 2.0**doubled * (index - doubled + 1), max_backoff)


def retry_intervals(retry: RetryConfig) -> list[float]:
    """Scheduler's waits before each retry: doubling maxDoublings times, then linear, capped."""
    return [
        backoff_seconds(retry.min_backoff, retry.max_backoff, retry.max_doublings, index)
        for index in range(retry.retry_count)
    ]


def retry_window_seconds(job: SchedulerJob) -> float:
    """How long after an execution's first attempt deliveries of it can still arrive.

    Every attempt may run until its deadline.  Retries stop when both
    ``retry_count`` and ``max_retry_duration`` are used up (no retries only when
    both are 0), and they may run past the next scheduled time (Scheduler then
    skips that execution), so the window is not capped at the period.
    """
    retry = job.retry
    by_count = sum(retry_intervals(retry)) + (retry.retry_count + 1) * job.deadline
    by_duration = retry.max_retry_duration + job.deadline if retry.max_retry_duration else 0
    return max(by_count, by_duration)


def audit_lag_seconds(job: SchedulerJob) -> float:
    """How long after a slot's time the audit has surely judged it: every delivery and retry
    can have come (its retry window and the grace before a first attempt), and one audit
    interval has passed since."""
    return retry_window_seconds(job) + DELIVERY_GRACE_SECONDS + AUDIT_INTERVAL_SECONDS


def minimum_retention_seconds(job: SchedulerJob) -> float:
    """The shortest retention under which the app still knows every slot it reports on.

    A slot's record must outlive its retry window, the grace before its first
    attempt and one audit interval: otherwise the audit, the executions listing
    and backfill would reach the slot only after its record expired, and could
    no longer tell a run that completed from one that never happened.
    """
    return audit_lag_seconds(job)


def placeholder_project_problem(project: str) -> str | None:
    """What to fill in, if ``project`` is the shipped placeholder; else None."""
    if project != PLACEHOLDER_PROJECT:
        return None
    return (
        f"{project!r} is the placeholder scheduler.yaml ships with: fill in the id of the Google Cloud "
        "project the app is deployed to (defaults.project, or the job's project)"
    )


def dedup_problems(jobs: list[SchedulerJob], app_jobs: Mapping[str, JobSpec], exhaustive: bool = True) -> list[Problem]:
    """Everything that stops the app (at start-up) and the ops CLI (before a plan) using ``jobs``
    with ``app_jobs``: what breaks deduplication, and placeholders not yet filled in.

    ``exhaustive`` (the ops CLI): the period check steps through a year of executions; the
    app's start-up through the first two gaps (START_UP_PERIOD_STEPS), so a fleet starts in
    seconds and the deploy that put the file there has made the whole check.

    Parsing alone (load_scheduler_file) accepts a placeholder, so a simulation of the shipped
    schedules still runs; nothing deploys or serves one.
    """
    problems: list[Problem] = []
    for job in jobs:
        placeholder = placeholder_project_problem(job.project)
        if placeholder:
            problems.append(Problem(job.key, "project", placeholder))
        spec = app_jobs.get(job.target)
        if spec is None:
            problems.append(
                Problem(job.key, "target", f"{job.target!r} is not a job in jobs.yaml ({', '.join(sorted(app_jobs))})")
            )
            continue
        lease, retention = spec.policy.lease_seconds, spec.policy.retention_seconds
        if lease < job.deadline:
            problems.append(
                Problem(
                    job.key,
                    "attempt_deadline",
                    (
                        f"{int(job.deadline)}s is longer than the lease of {job.target!r} ({int(lease)}s): "
                        "Scheduler would retry while the first attempt still holds the run, the lease would have "
                        "run out, and two attempts would run at once. Raise lease_seconds or lower the deadline"
                    ),
                )
            )
        external = spec.runner.external
        if external is not None:
            problems += external_target_problems(job, external.url)
        limit = REQUEST_TIMEOUT_SECONDS[job.scaling]
        if external is None and job.deadline > limit:
            problems.append(
                Problem(
                    job.key,
                    "attempt_deadline",
                    (
                        f"{int(job.deadline)}s is longer than the request timeout of {job.scaling} "
                        f"scaling ({limit}s): "
                        "App Engine ends the request first"
                    ),
                )
            )
        period = schedule_period_seconds(
            job.schedule, job.time_zone, EXHAUSTIVE_PERIOD_STEPS if exhaustive else START_UP_PERIOD_STEPS
        )
        window, minimum = retry_window_seconds(job), minimum_retention_seconds(job)
        if retention < minimum:
            problems.append(
                Problem(
                    job.key,
                    "retry",
                    (
                        f"the retention of {job.target!r} ({int(retention)}s) is shorter than the minimum of "
                        f"{math.ceil(minimum)}s: deliveries can arrive for {int(window)}s, plus "
                        f"{DELIVERY_GRACE_SECONDS}s before a first attempt and {AUDIT_INTERVAL_SECONDS}s until "
                        "the audit looks; a shorter one forgets completed runs before the audit and the "
                        "executions listing can tell them from missed ones, and a late retry would run again. "
                        f"Raise retention_seconds to at least {math.ceil(minimum)}"
                    ),
                )
            )
        if retention < period:
            problems.append(
                Problem(
                    job.key,
                    "schedule",
                    (
                        f"executions are up to {int(period)}s apart, longer than the retention of {job.target!r} "
                        f"({int(retention)}s); raise retention_seconds to at least the period"
                    ),
                )
            )
    by_name: dict[str, list[SchedulerJob]] = {}
    for job in jobs:
        by_name.setdefault(job.name, []).append(job)
    for name, declared in by_name.items():
        places = {(job.project, job.location) for job in declared}
        if len(places) < len(declared):
            problems.append(
                Problem(
                    declared[-1].key, "name", f"Scheduler job {name!r} is declared twice in one project and location"
                )
            )
        if len(places) > 1:
            for job in declared:
                if not job.pass_scope:
                    problems.append(
                        Problem(
                            job.key,
                            "pass_scope",
                            (
                                f"Scheduler job {name!r} exists in {len(places)} projects/locations; without its "
                                "scope in the URL their executions would share keys and deduplicate each other: "
                                "keep pass_scope: true"
                            ),
                        )
                    )
    return problems


class ScheduleSettingError(ValueError):
    """The scheduler file the app was given does not validate: the app refuses to start."""


def scheduler_file_path(named: str | None, jobs_file: str) -> str:
    """``named`` (DEDUP_SCHEDULER_FILE), else the scheduler.yaml beside the jobs file (absent: no schedule features)."""
    return named or os.path.join(os.path.dirname(jobs_file) or ".", DEFAULT_FILE)


def load_app_schedules(path: str, app_jobs: Mapping[str, JobSpec], required: bool = False) -> tuple[SchedulerJob, ...]:
    """The Scheduler jobs of ``path``, validated as ``python -m deploy scheduler validate`` does.

    An absent file is no schedule (unless ``required``: DEDUP_SCHEDULER_FILE named it).
    """
    if not os.path.exists(path) and not required:
        return ()
    try:
        jobs = load_scheduler_file(path)
    except ScheduleFileError as exc:
        raise ScheduleSettingError(f"{path}: " + "; ".join(str(p) for p in exc.problems)) from None
    problems = dedup_problems(jobs, app_jobs, exhaustive=False)
    if problems:
        raise ScheduleSettingError(f"{path}: " + "; ".join(str(p) for p in problems))
    return tuple(jobs)
