"""The interface every job kind implements, and the context a run gets."""

from __future__ import annotations

import abc
import dataclasses
import datetime
import json
import urllib.parse
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from dedup.clock import Clock, SystemClock
from dedup.errors import PermanentJobError
from dedup.outcomes import Attempt
from dedup.steps import Steps, TakesSteps
from jobs.errors import JobsConfigError
from jobs.trace_headers import outgoing_trace_headers
from models import RunSource

# The longest downstream resource name a run records (and every reader is sent).
MAX_DOWNSTREAM_CHARS = 1024


@dataclasses.dataclass(frozen=True)
class ExternalTarget:
    """Where an ``external`` job's own handler is (jobs/kinds/external.py), and how a request
    reaches it: ``url`` with an OIDC token that ``service_account`` signs for ``audience``."""

    url: str
    service_account: str
    audience: str

    def delivery_url(self, project: str, location: str, pass_scope: bool) -> str:
        """What a Scheduler job or a task calls: the url, with the scope in its query unless not
        ``pass_scope`` (then the handler's DEDUP_PROJECT and DEDUP_LOCATION name it)."""
        if not pass_scope:
            return self.url
        parts = urllib.parse.urlsplit(self.url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        query = [(name, value) for name, value in query if name not in ("project", "location")]
        query += [("project", project), ("location", location)]
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


@dataclasses.dataclass(frozen=True)
class RunContext(TakesSteps):
    """Everything a job may need to know about the run it performs.

    ``downstream_key`` (the run id) is the key to pass to anything downstream, as its
    ``Idempotency-Key`` or the like, so the downstream can deduplicate too.
    """

    run_id: str
    attempt_id: str
    attempt: int
    job_id: str
    scheduler_job_name: str | None
    schedule_time: datetime.datetime | None
    body: bytes = b""
    project: str = ""
    location: str = ""
    source: str = RunSource.SCHEDULER  # RunSource.FORCE_RUN for a Force run, RunSource.API for a manual run
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # manual runs' parameters
    client_token: str | None = None  # manual runs: the caller's token
    # What an earlier attempt of this run started downstream, if it recorded it.
    downstream: str | None = None
    # A compacted catch-up's run: the slot times (aware, UTC, oldest first) it stands for beside
    # its own ``schedule_time``, each of which never runs on its own.  Empty for any other run.
    covers: tuple[datetime.datetime, ...] = ()
    # The app's clock (tests step it), for jobs that compare times with records'.
    clock: Clock = dataclasses.field(default_factory=SystemClock, repr=False, compare=False)
    _attempt: Attempt | None = dataclasses.field(default=None, repr=False, compare=False)
    # Without a runner (a job called directly, as in a unit test), steps are kept in memory only.
    _unheld_steps: Steps | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def for_attempt(cls, attempt: Attempt, job_id: str, **fields: Any) -> RunContext:
        return cls(
            run_id=attempt.run_id,
            attempt_id=attempt.attempt_id,
            attempt=attempt.number,
            job_id=job_id,
            downstream=attempt.downstream,
            _attempt=attempt,
            **{"scheduler_job_name": None, "schedule_time": None, **fields},
        )

    def now(self) -> datetime.datetime:
        """The current time as the ledger sees it (aware, UTC)."""
        return self.clock.now()

    @property
    def downstream_key(self) -> str:
        """The key every attempt of this run gives the downstream: the run id, the same however
        often the run is delivered or retried (a client's token is ``client_token``)."""
        return self.run_id

    def trace_headers(self) -> dict[str, str]:
        """The run's trace as headers (``traceparent``, ``X-Cloud-Trace-Context``), for the calls a
        python job makes itself: the service called joins the delivery's trace, as the other
        kinds' calls do."""
        return outgoing_trace_headers()

    @property
    def idempotency_key(self) -> str:
        """``downstream_key``'s first name, kept so that job targets written against it still run:
        a job that failed on it would be retried, and fail, on every delivery."""
        warnings.warn("RunContext.idempotency_key is now RunContext.downstream_key", DeprecationWarning, stacklevel=2)
        return self.downstream_key

    def lease_lost(self) -> bool:
        """True once the run was taken over or this attempt's lease ran out: stop, a result may be refused."""
        return self._attempt.lease_lost() if self._attempt else False

    def record_downstream(self, resource_name: str) -> bool:
        """Record, as soon as it exists, what this run started downstream.

        A takeover then adopts it instead of starting another.  False when this
        attempt has lost the run to a takeover (it should stop).  A name is an
        identifier (Google's resource names are a few hundred characters): one
        longer than MAX_DOWNSTREAM_CHARS is a permanent failure, since what it
        names may already have started.
        """
        if not (
            isinstance(resource_name, str)
            and 0 < len(resource_name) <= MAX_DOWNSTREAM_CHARS
            and all(33 <= ord(char) <= 126 for char in resource_name)
        ):
            raise PermanentJobError(
                f"the downstream resource name must be 1 to {MAX_DOWNSTREAM_CHARS} printable ASCII characters "
                "without spaces; it was not recorded, and what it names may have started"
            )
        return self._attempt.record_downstream(resource_name) if self._attempt else True

    def started_before(self, find: Callable[[], str | None]) -> str | None:
        """What an earlier attempt of this run started downstream, to adopt: the recorded
        resource, else what ``find()`` turns up (recorded then, so no later attempt searches)."""
        existing = self.downstream or find()
        if existing and existing != self.downstream:
            self.record_downstream(existing)
        return existing

    def steps(self) -> Steps:
        """The run's steps as this attempt runs them (what earlier attempts recorded, and its own)."""
        held = self._attempt.held if self._attempt else None
        if held is not None:
            return held.steps
        if self._unheld_steps is None:
            records = self._attempt.step_records if self._attempt else None
            object.__setattr__(self, "_unheld_steps", Steps(self.run_id, self.attempt, records, None, self.clock.now))
        assert self._unheld_steps is not None
        return self._unheld_steps

    def body_text(self) -> str | None:
        """The request body as text, or None when it is not UTF-8."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def body_json(self) -> Any:
        """The request body parsed as JSON; None for an empty body."""
        text = self.body_text()
        if not text or not text.strip():
            return None
        return json.loads(text)


class JobKind(abc.ABC):
    """One kind of job (``python``, ``http``, ...).

    A kind declares the keys it takes in jobs.yaml (``declaration``: a jobs.declared.JobDeclaration
    with its ``kind``, its keys and its rules, which builds the kind once at start-up), and runs: return a
    JSON-serialisable result, or raise PermanentJobError / RetryableJobError (any other
    exception counts as retryable).  Kinds never touch the ledger.
    """

    name: ClassVar[str]
    declaration: ClassVar[type[BaseModel]]  # a jobs.declared.JobDeclaration (which imports this module)

    @abc.abstractmethod
    def run(self, context: RunContext) -> Any:
        """Perform one attempt of the run."""

    def calls(self) -> str:
        """What a run calls downstream, in words, for the person about to start one (the
        dashboard's confirmation step names it).  A kind of one's own may say more."""
        return f"a {self.name} job"

    @property
    def external(self) -> ExternalTarget | None:
        """Where a handler served elsewhere runs the job (the ``external`` kind), or None: this
        app runs it (every other kind)."""
        return None


# Far beyond any sensible lease or retention, and far from datetime's limits.
MAX_SECONDS = 10 * 365 * 24 * 3600
# The largest request body the app reads (handlers/request_limits.py answers 413 above it), and so
# the largest body scheduler.yaml may give a job.
MAX_BODY_BYTES = 1024 * 1024


def http_url(job_id: str, field: str, value: Any, query: bool = True) -> str:
    """An absolute http(s) URL with a host (and, unless ``query``, no query), or a JobsConfigError."""
    if not isinstance(value, str) or not value.strip():
        raise JobsConfigError(job_id, field, f"must be a non-empty string, got {value!r}")
    problem = url_problem(value, query)
    if problem:
        raise JobsConfigError(job_id, field, problem)
    return value


def url_problem(url: str, query: bool = True) -> str | None:
    """What is wrong with ``url`` as an absolute http(s) URL with a host (and, unless ``query``,
    no query), or None.

    One check for every URL the files and settings give: urlsplit itself raises ValueError for
    some strings (an unclosed IPv6 bracket, a host NFKC normalisation changes, a port out of
    range), which must end as an error naming the field, not a traceback.
    """
    try:
        parsed = urllib.parse.urlsplit(url)
        parsed.port  # noqa: B018 - raises for a port out of range
    except ValueError as exc:
        return f"{url!r} is not a URL: {exc}"
    if parsed.scheme not in ("http", "https") or not parsed.hostname or (parsed.query and not query):
        wanted = "an absolute http(s) URL" if query else "an http(s) base URL, without a query"
        return f"must be {wanted}, got {url!r}"
    if is_placeholder_host(parsed.hostname):
        return (
            f"{parsed.hostname!r} is a placeholder (a name reserved for examples, RFC 2606): "
            f"fill in the address of the service the job calls"
        )
    return None


DEFAULT_PORTS = {"http": 80, "https": 443}


def _host_of(parts: urllib.parse.SplitResult) -> str:
    """The URL's host as a service names itself: lower case, no trailing dot, an IPv6 one bracketed."""
    host = (parts.hostname or "").rstrip(".")
    return f"[{host}]" if ":" in host else host


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a URL url_problem accepted, the port only where it is not the
    scheme's own: what a Cloud Run service takes as the audience of the tokens it is called with."""
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port is not None and parts.port != DEFAULT_PORTS[parts.scheme] else ""
    return f"{parts.scheme}://{_host_of(parts)}{port}"


def without_credentials(url: str) -> str:
    """The URL without any ``user:password@``, query or fragment: what may be shown or sent as an
    audience (Cloud Scheduler's own default audience is the target URL)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def is_loopback_url(url: str) -> bool:
    """Whether the URL's host is this machine (a local service in tests and make run)."""
    return urllib.parse.urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")


# RFC 2606's names for documentation: no real service answers there, so a URL naming one
# (the shipped jobs.yaml's crm.example.com) is a value still to fill in.
_PLACEHOLDER_DOMAINS = ("example.com", "example.net", "example.org")
_PLACEHOLDER_TLDS = ("example", "invalid", "test")


def is_placeholder_host(host: str) -> bool:
    """Whether ``host`` is a reserved example name, so a job calling it would fail every run."""
    host = host.lower().rstrip(".")
    return host.rsplit(".", 1)[-1] in _PLACEHOLDER_TLDS or any(
        host == domain or host.endswith("." + domain) for domain in _PLACEHOLDER_DOMAINS
    )
