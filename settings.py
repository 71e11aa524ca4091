"""The app's settings, read once at start-up: one frozen, typed object, one reading, one error.

``Settings.from_environ(os.environ)`` reads and checks every setting it holds, with its default
and its bounds, and raises ``SettingError`` naming the variable, what is wrong and what to
write; ``main.py`` (and each entry point) reads it once and hands it to ``configure_logging`` and
``create_app``, which hand the values on, so no module reads the environment for a setting
afterwards.  The ops CLI (``python -m deploy check``) and the tests check settings through it too.

Caller verification's variables (DEDUP_AUTH, each mode's, DEDUP_OPERATORS and DEDUP_VIEWERS) are
read here too, as written; what one means beside the others (which modes DEDUP_AUTH combines,
on App Engine or not) is checked by ``AuthSettings.from_settings`` (handlers/auth), which the app
and ``python -m deploy check`` both call on this object: its ``AuthConfigError`` is a ``SettingError``.

Read elsewhere, on purpose, and no setting (tests/test_settings.py's scan lists them): App Engine's
GAE_INSTANCE (``dedup.claims.INSTANCE``), this process's identity in a record's attempt history,
like its host name and process id, which no one configures; and dedupctl's DEDUP_TOKEN, a client's
credential on the caller's machine, never the app's.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from dedup import database
from dedup.callers import DEFAULT_CERTS_URL
from dedup.finished_cache import MAX_BYTES, MAX_ENTRIES
from dedup.runner import DEFAULT_MAX_WAITERS
from jobs.base import http_url
from jobs.config import DEFAULT_JOBS_FILE, DEFAULT_REQUEST_TIMEOUT, REQUEST_TIMEOUT_SECONDS
from jobs.errors import JobsConfigError
from service.window import DEFAULT_NIGHT, Night

# App Engine's standard environment sets GAE_ENV to this.
PRODUCTION_GAE_ENV = "standard"

# How many requests of a process may wait at once (Prefer: wait) unless DEDUP_MAX_WAITERS says
# otherwise (the library's default, dedup.runner); and its bound.
MAX_WAITERS_LIMIT = 64
MAX_FINISHED_CACHE_ENTRIES = 100_000
MAX_FINISHED_CACHE_MIB = 1024
# Of the instance's memory (App Engine's GAE_MEMORY_MB: 384 MB on an F1, 768 on an F2), what one
# worker's cache may take: a quarter, so app.yaml's two workers leave half for the requests.
CACHE_SHARE_OF_MEMORY = 4
TASKS_QUEUE_SETTING = "DEDUP_TASKS_QUEUE"
TASKS_LOCATION_SETTING = "DEDUP_TASKS_LOCATION"
TASKS_API_BASE_SETTING = "DEDUP_TASKS_API_BASE"
TASKS_TRANSPORT_SETTING = "DEDUP_TASKS_TRANSPORT"
# google-cloud-tasks' transports: gRPC (its default, and the one its emulators speak) or REST.
TASKS_TRANSPORTS = ("grpc", "rest")
QUEUE_ID = re.compile(r"[A-Za-z0-9-]{1,100}")
QUEUE_NAME = re.compile(r"projects/[a-z0-9.:-]+/locations/[a-z0-9-]+/queues/[A-Za-z0-9-]{1,100}")
DEFAULT_SCHEDULER_API_BASE = "https://cloudscheduler.googleapis.com"
SCHEDULER_API_BASE_SETTING = "DEDUP_SCHEDULER_API_BASE"
TRACE_EXPORTS = ("cloud-trace", "none")
METRICS_EXPORTS = ("cloud-monitoring", "none")
# Caller verification's defaults (handlers/auth): Google's signing keys, and the value of
# DEDUP_APPENGINE_OFF_GAE with which tests and local tools say they trust forgeable markers.
DEFAULT_OIDC_CERTS_URL = DEFAULT_CERTS_URL  # Google's ID-token keys (dedup.callers)
DEFAULT_IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
OFF_APP_ENGINE_SETTING = "DEDUP_APPENGINE_OFF_GAE"
OFF_APP_ENGINE_VALUE = "trust-forgeable-headers"


class SettingError(ValueError):
    """A bad DEDUP_* setting: the app refuses to start."""


@dataclass(frozen=True)
class Settings:
    """Every setting below, typed, as ``from_environ`` read and checked it.

    Each field's ``metadata["variable"]`` is the environment variable it is read from.
    """

    max_waiters: int = dataclasses.field(default=DEFAULT_MAX_WAITERS, metadata={"variable": "DEDUP_MAX_WAITERS"})
    finished_cache_entries: int = dataclasses.field(
        default=MAX_ENTRIES, metadata={"variable": "DEDUP_FINISHED_CACHE_ENTRIES"}
    )
    finished_cache_bytes: int = dataclasses.field(default=MAX_BYTES, metadata={"variable": "DEDUP_FINISHED_CACHE_MIB"})
    # None: the ``(default)`` database.
    database: str | None = dataclasses.field(default=None, metadata={"variable": database.SETTING})
    jobs_file: str = dataclasses.field(default=DEFAULT_JOBS_FILE, metadata={"variable": "DEDUP_JOBS_FILE"})
    # None: the scheduler.yaml beside the jobs file, if there is one.
    scheduler_file: str | None = dataclasses.field(default=None, metadata={"variable": "DEDUP_SCHEDULER_FILE"})
    on_app_engine: bool = dataclasses.field(default=False, metadata={"variable": "GAE_ENV"})
    # The Cloud Tasks queue work is dispatched to, by its whole name (None: this process's threads).
    tasks_queue: str | None = dataclasses.field(default=None, metadata={"variable": TASKS_QUEUE_SETTING})
    tasks_api_base: str | None = dataclasses.field(default=None, metadata={"variable": TASKS_API_BASE_SETTING})
    # How the dispatcher speaks to Cloud Tasks: one of TASKS_TRANSPORTS.
    tasks_transport: str = dataclasses.field(default="grpc", metadata={"variable": TASKS_TRANSPORT_SETTING})
    # This app's App Engine service, which dispatched tasks are routed to.
    service: str | None = dataclasses.field(default=None, metadata={"variable": "GAE_SERVICE"})
    scheduler_api_base: str = dataclasses.field(
        default=DEFAULT_SCHEDULER_API_BASE, metadata={"variable": SCHEDULER_API_BASE_SETTING}
    )
    # The service's request timeout, by its scaling type: a job's max_run_seconds unless it gives one.
    request_timeout: float = dataclasses.field(default=DEFAULT_REQUEST_TIMEOUT, metadata={"variable": "DEDUP_SCALING"})
    # The Google Cloud project (App Engine sets it): where the run pages' log links point.
    project: str | None = dataclasses.field(default=None, metadata={"variable": "GOOGLE_CLOUD_PROJECT"})
    # "json" (App Engine's structured logs) or "text".
    log_format: str = dataclasses.field(default="text", metadata={"variable": "DEDUP_LOG_FORMAT"})
    # Where spans go: one of TRACE_EXPORTS.
    trace_export: str = dataclasses.field(default="none", metadata={"variable": "DEDUP_TRACE_EXPORT"})
    # Where metrics go: one of METRICS_EXPORTS.
    metrics_export: str = dataclasses.field(default="none", metadata={"variable": "DEDUP_METRICS_EXPORT"})
    # Caller verification, as written (stripped); AuthSettings.from_settings checks what each means.
    # The modes, comma-separated ("": App Engine's default there, refused elsewhere).
    auth: str = dataclasses.field(default="", metadata={"variable": "DEDUP_AUTH"})
    # IAM members, comma-separated (None: unset; an empty list is not unset for viewers).
    operators: str | None = dataclasses.field(default=None, metadata={"variable": "DEDUP_OPERATORS"})
    viewers: str | None = dataclasses.field(default=None, metadata={"variable": "DEDUP_VIEWERS"})
    oidc_audience: str = dataclasses.field(default="", metadata={"variable": "DEDUP_OIDC_AUDIENCE"})
    # Lowercased.
    oidc_allowed_emails: frozenset[str] = dataclasses.field(
        default=frozenset(), metadata={"variable": "DEDUP_OIDC_ALLOWED_EMAILS"}
    )
    oidc_certs_url: str = dataclasses.field(
        default=DEFAULT_OIDC_CERTS_URL, metadata={"variable": "DEDUP_OIDC_CERTS_URL"}
    )
    iap_audience: str = dataclasses.field(default="", metadata={"variable": "DEDUP_IAP_AUDIENCE"})
    iap_certs_url: str = dataclasses.field(default=DEFAULT_IAP_CERTS_URL, metadata={"variable": "DEDUP_IAP_CERTS_URL"})
    # Lowercased marker names (None: unset, every marker the modes allow; empty: set to none, refused).
    appengine_trusted: frozenset[str] | None = dataclasses.field(
        default=None, metadata={"variable": "DEDUP_APPENGINE_TRUSTED"}
    )
    # When night is for the operators, and in which time zone: the dashboard's "last night".
    night: Night = dataclasses.field(default=Night.parse(DEFAULT_NIGHT), metadata={"variable": "DEDUP_NIGHT"})
    # DEDUP_APPENGINE_OFF_GAE=trust-forgeable-headers: tests and local tools take App Engine's markers
    # off App Engine, where anyone can send them (then only loopback is served).
    appengine_off_app_engine: bool = dataclasses.field(default=False, metadata={"variable": OFF_APP_ENGINE_SETTING})

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable ``field`` is read from."""
        return str(next(f for f in dataclasses.fields(cls) if f.name == field).metadata["variable"])

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """Read and check every setting of ``environ``; the first bad one raises ``SettingError``."""
        queue = tasks_queue(environ)
        return cls(
            max_waiters=max_waiters(environ),
            finished_cache_entries=finished_cache_entries(environ),
            finished_cache_bytes=finished_cache_bytes(environ),
            database=database_of(environ),
            jobs_file=jobs_file(environ),
            scheduler_file=environ.get("DEDUP_SCHEDULER_FILE") or None,
            on_app_engine=environ.get("GAE_ENV") == PRODUCTION_GAE_ENV,
            tasks_queue=queue,
            # Read only when a queue is: unused otherwise.
            tasks_api_base=tasks_api_base(environ) if queue else None,
            tasks_transport=tasks_transport(environ) if queue else "grpc",
            service=environ.get("GAE_SERVICE") or None,
            scheduler_api_base=scheduler_api_base(environ),
            request_timeout=request_timeout(environ),
            trace_export=trace_export(environ),
            metrics_export=metrics_export(environ),
            project=environ.get("GOOGLE_CLOUD_PROJECT") or None,
            log_format=log_format(environ),
            auth=environ.get("DEDUP_AUTH", "").strip(),
            operators=environ.get("DEDUP_OPERATORS"),
            viewers=environ.get("DEDUP_VIEWERS"),
            oidc_audience=environ.get("DEDUP_OIDC_AUDIENCE", "").strip(),
            oidc_allowed_emails=listed(environ.get("DEDUP_OIDC_ALLOWED_EMAILS")) or frozenset(),
            oidc_certs_url=environ.get("DEDUP_OIDC_CERTS_URL", "").strip() or DEFAULT_OIDC_CERTS_URL,
            iap_audience=environ.get("DEDUP_IAP_AUDIENCE", "").strip(),
            iap_certs_url=environ.get("DEDUP_IAP_CERTS_URL", "").strip() or DEFAULT_IAP_CERTS_URL,
            appengine_trusted=listed(environ.get("DEDUP_APPENGINE_TRUSTED")),
            appengine_off_app_engine=environ.get(OFF_APP_ENGINE_SETTING) == OFF_APP_ENGINE_VALUE,
            night=night(environ),
        )


def listed(raw: str | None) -> frozenset[str] | None:
    """A comma-separated setting's entries, stripped and lowercased (None: unset)."""
    if raw is None:
        return None
    return frozenset(entry.strip().lower() for entry in raw.split(",") if entry.strip())


def whole_number_setting(environ: Mapping[str, str], name: str, default: int, limit: int, zero_means: str) -> int:
    """A DEDUP_* setting that is a whole number from 0 to ``limit`` (unset: ``default``)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not re.fullmatch(r"[0-9]{1,7}", raw) or int(raw) > limit:
        raise SettingError(f"{name}={raw!r}: a whole number from 0 ({zero_means}) to {limit}")
    return int(raw)


def jobs_file(environ: Mapping[str, str]) -> str:
    """DEDUP_JOBS_FILE, else the jobs.yaml beside the app: the app's and ``python -m deploy``'s default."""
    return environ.get("DEDUP_JOBS_FILE") or DEFAULT_JOBS_FILE


def max_waiters(environ: Mapping[str, str]) -> int:
    """DEDUP_MAX_WAITERS: keep it a small share of gunicorn's --threads."""
    return whole_number_setting(
        environ, "DEDUP_MAX_WAITERS", DEFAULT_MAX_WAITERS, MAX_WAITERS_LIMIT, "Prefer: wait is never honoured"
    )


def database_of(environ: Mapping[str, str]) -> str | None:
    """DEDUP_DATABASE: the Datastore-mode database that holds the ledger (None: ``(default)``),
    by the rule the deploy CLI applies too (dedup/database.py)."""
    try:
        return database.client_database(environ)
    except database.DatabaseNameError as exc:
        raise SettingError(f"{database.SETTING}: {exc}") from None


def finished_cache_entries(environ: Mapping[str, str]) -> int:
    """DEDUP_FINISHED_CACHE_ENTRIES: completed runs each process remembers."""
    return whole_number_setting(
        environ, "DEDUP_FINISHED_CACHE_ENTRIES", MAX_ENTRIES, MAX_FINISHED_CACHE_ENTRIES, "no cache"
    )


def finished_cache_bytes(environ: Mapping[str, str]) -> int:
    """DEDUP_FINISHED_CACHE_MIB: what each process's cache may hold, refused when it cannot fit the
    instance class (a quarter of GAE_MEMORY_MB, which App Engine sets to the class's memory)."""
    mib = whole_number_setting(
        environ, "DEDUP_FINISHED_CACHE_MIB", MAX_BYTES // 2**20, MAX_FINISHED_CACHE_MIB, "no cache"
    )
    memory = environ.get("GAE_MEMORY_MB", "")
    if memory.isascii() and memory.isdigit() and mib * CACHE_SHARE_OF_MEMORY > int(memory):
        raise SettingError(
            f"DEDUP_FINISHED_CACHE_MIB={mib}: more than a quarter of this instance's {memory} MB "
            f"(GAE_MEMORY_MB) for one worker's cache; at most {int(memory) // CACHE_SHARE_OF_MEMORY}, "
            "or a larger instance_class in app.yaml"
        )
    return mib * 2**20


def tasks_queue_name(queue: str) -> str:
    """``queue`` if it is a Cloud Tasks queue's whole name, else ``SettingError``."""
    if not QUEUE_NAME.fullmatch(queue):
        raise SettingError(
            f"{TASKS_QUEUE_SETTING} must be projects/PROJECT/locations/LOCATION/queues/QUEUE, got {queue!r}"
        )
    return queue


def tasks_queue(environ: Mapping[str, str]) -> str | None:
    """The queue DEDUP_TASKS_QUEUE names, by its whole name; None when it is unset (or names a bare
    queue id where no project is known: off App Engine, as under make devserver).

    DEDUP_TASKS_QUEUE is the queue's resource name, or its id: then the project is
    GOOGLE_CLOUD_PROJECT (App Engine sets it) and the location DEDUP_TASKS_LOCATION.
    """
    queue = environ.get(TASKS_QUEUE_SETTING)
    if not queue:
        return None
    if QUEUE_ID.fullmatch(queue):
        project, location = environ.get("GOOGLE_CLOUD_PROJECT"), environ.get(TASKS_LOCATION_SETTING)
        if not project and environ.get("GAE_ENV") != PRODUCTION_GAE_ENV:
            return None
        if not project or not location:
            raise SettingError(
                f"{TASKS_QUEUE_SETTING}={queue!r} is a queue id: it needs GOOGLE_CLOUD_PROJECT and "
                f"{TASKS_LOCATION_SETTING} (the queue's region, e.g. us-central1), or give the queue's whole name"
            )
        queue = f"projects/{project}/locations/{location}/queues/{queue}"
    return tasks_queue_name(queue)


def tasks_api_base(environ: Mapping[str, str]) -> str | None:
    """DEDUP_TASKS_API_BASE: the Cloud Tasks API's base URL (None: Google's)."""
    base = environ.get(TASKS_API_BASE_SETTING) or None
    if base is not None and not re.fullmatch(r"https?://[^/?#\s]+", base):
        raise SettingError(f"{TASKS_API_BASE_SETTING} must be an http(s) base URL, got {base!r}")
    return base


def is_local_api_base(base: str) -> bool:
    """An ``http://`` base URL of a Google API: an emulator or a stand-in on this machine or the test
    network, reached in plaintext and without credentials (Google's APIs are https only)."""
    return urllib.parse.urlsplit(base).scheme == "http"


def tasks_transport(environ: Mapping[str, str]) -> str:
    """DEDUP_TASKS_TRANSPORT: ``grpc`` (unset) or ``rest``."""
    transport = (environ.get(TASKS_TRANSPORT_SETTING) or "grpc").strip().lower()
    if transport not in TASKS_TRANSPORTS:
        raise SettingError(f"{TASKS_TRANSPORT_SETTING} must be one of {', '.join(TASKS_TRANSPORTS)}, got {transport!r}")
    return transport


def scheduler_api_base(environ: Mapping[str, str]) -> str:
    """DEDUP_SCHEDULER_API_BASE: the Cloud Scheduler API's base URL (unset: Google's)."""
    base = environ.get(SCHEDULER_API_BASE_SETTING) or DEFAULT_SCHEDULER_API_BASE
    try:
        return http_url("environment", SCHEDULER_API_BASE_SETTING, base, query=False)
    except JobsConfigError as exc:
        raise SettingError(f"{SCHEDULER_API_BASE_SETTING}: {exc.reason}") from None


def _export(environ: Mapping[str, str], variable: str, on_app_engine: str, choices: tuple[str, ...]) -> str:
    """Where a signal goes: ``variable``, else ``on_app_engine`` on App Engine and nowhere elsewhere."""
    default = on_app_engine if environ.get("GAE_ENV") == PRODUCTION_GAE_ENV else "none"
    export = (environ.get(variable) or default).strip().lower()
    if export not in choices:
        raise SettingError(f"{variable} must be one of {', '.join(choices)}")
    return export


def trace_export(environ: Mapping[str, str]) -> str:
    """Where spans go: DEDUP_TRACE_EXPORT, else Cloud Trace on App Engine and nowhere elsewhere."""
    return _export(environ, "DEDUP_TRACE_EXPORT", "cloud-trace", TRACE_EXPORTS)


def metrics_export(environ: Mapping[str, str]) -> str:
    """Where metrics go: DEDUP_METRICS_EXPORT, else Cloud Monitoring on App Engine and nowhere elsewhere."""
    return _export(environ, "DEDUP_METRICS_EXPORT", "cloud-monitoring", METRICS_EXPORTS)


def request_timeout(environ: Mapping[str, str]) -> float:
    """The request timeout of DEDUP_SCALING, app.yaml's scaling type (unset: automatic)."""
    scaling = environ.get("DEDUP_SCALING", "automatic")
    if scaling not in REQUEST_TIMEOUT_SECONDS:
        raise SettingError(f"DEDUP_SCALING={scaling!r}: one of {', '.join(REQUEST_TIMEOUT_SECONDS)}")
    return REQUEST_TIMEOUT_SECONDS[scaling]


def night(environ: Mapping[str, str]) -> Night:
    """DEDUP_NIGHT: the operators' night, ``HH:MM-HH:MM [ZONE]`` (unset: 22:00-07:00 UTC)."""
    try:
        return Night.parse(environ.get("DEDUP_NIGHT") or DEFAULT_NIGHT)
    except ValueError as exc:
        raise SettingError(f"DEDUP_NIGHT: {exc}") from None


def log_format(environ: Mapping[str, str]) -> str:
    """DEDUP_LOG_FORMAT: "json" (the default where GAE_ENV is set, as on App Engine) or "text"
    (anything else)."""
    fmt = (environ.get("DEDUP_LOG_FORMAT") or ("json" if environ.get("GAE_ENV") else "text")).lower()
    return "json" if fmt == "json" else "text"
