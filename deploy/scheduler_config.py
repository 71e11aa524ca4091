"""scheduler.yaml's jobs as Cloud Scheduler takes them: the API's ``Job`` (what ``scheduler apply``
sends), what differs between it and a live job (the update's mask), and the gcloud commands that
do the same by hand (``scheduler plan --gcloud``).  The jobs come parsed by schedules.config."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from google.cloud import scheduler_v1

from jobs.base import ExternalTarget
from schedules.config import LIST_DELIMITERS, SchedulerJob

APP_YAML = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app.yaml")

# The Job fields scheduler.yaml declares, by the proto paths an update mask names them (gcloud's own
# for its flags: command_lib/scheduler/util.py).  Each is compared with the live job's, so one the
# file no longer declares is named too and cleared.  The HTTP method and the target type are not
# here: a job whose live ones differ is made again (``remake_reason``).
COMMON_FIELDS = (
    "description",
    "schedule",
    "time_zone",
    "attempt_deadline",
    "retry_config.retry_count",
    "retry_config.max_retry_duration",
    "retry_config.min_backoff_duration",
    "retry_config.max_backoff_duration",
    "retry_config.max_doublings",
)
OAUTH_TOKEN = "http_target.oauth_token"
TARGET_FIELDS = {
    "app-engine": (
        "app_engine_http_target.relative_uri",
        "app_engine_http_target.headers",
        "app_engine_http_target.body",
        "app_engine_http_target.app_engine_routing.service",
        "app_engine_http_target.app_engine_routing.version",
        # Never declared: an instance set on the live job by hand is cleared, as the file says nothing of it.
        "app_engine_http_target.app_engine_routing.instance",
    ),
    "http": (
        "http_target.uri",
        "http_target.headers",
        "http_target.body",
        "http_target.oidc_token.service_account_email",
        "http_target.oidc_token.audience",
        # The OAuth token as a whole, and only where the live job has one: it and the OIDC token are
        # one oneof of HttpTarget, so a mask naming both where neither is set could be refused.
        OAUTH_TOKEN,
    ),
}
# Each target type's field of the Job message (a oneof), by ``target_type``.
TARGET_MESSAGES = {"app-engine": "app_engine_http_target", "http": "http_target"}
# Headers Scheduler shows on a job's target though the job did not set them (target.proto): its
# User-Agent (appended to one the job sets), and the Content-Type of a body sent without one.
SCHEDULER_HEADERS = {
    "user-agent": ("AppEngine-Google; (+http://code.google.com/appengine)", "Google-Cloud-Scheduler"),
    "content-type": ("application/octet-stream",),
}
# What gcloud's update cannot take off a live job: it has no --clear-description or --clear-version,
# and 528's --clear-message-body sends an update mask without the body.
GCLOUD_CANNOT_CLEAR = {
    "description": "description",
    "app_engine_http_target.app_engine_routing.version": "version",
    "app_engine_http_target.body": "body",
    "http_target.body": "body",
}


def app_service(path: str = APP_YAML) -> str:
    """The App Engine service app.yaml deploys (``default`` when it names none).

    Read from app.yaml itself, so the Scheduler jobs that name no service are sent
    where the app runs: left unset, Scheduler sends them to the ``default`` service,
    which here is another app's (or a placeholder's).
    """
    with open(path, encoding="utf-8") as handle:
        return str((yaml.safe_load(handle) or {}).get("service") or "default")


def target_type(external: ExternalTarget | None) -> str:
    """gcloud's name of the Scheduler job's target type: ``app-engine`` for this app's jobs,
    ``http`` for an external job's handler."""
    return "app-engine" if external is None else "http"


# -- the API's Job ----------------------------------------------------------------------------


def job_parent(job: SchedulerJob) -> str:
    return f"projects/{job.project}/locations/{job.location}"


def job_path(job: SchedulerJob) -> str:
    """The Scheduler job's resource name."""
    return f"{job_parent(job)}/jobs/{job.name}"


def declared_job(job: SchedulerJob, external: ExternalTarget | None = None) -> scheduler_v1.Job:
    """The Job the declaration makes: every field scheduler.yaml sets, and nothing it does not.

    An App Engine target always names its service (the job's, else app.yaml's), never left to
    Scheduler's default.  An ``external`` job's is an HTTP target calling its handler with an OIDC
    token from its caller's service account.  The attempt deadline and the retry settings are
    always given (the file's, else their defaults), as Scheduler shows them on a live job.
    """
    retry = job.retry
    method = getattr(scheduler_v1.HttpMethod, job.method)
    body = (job.body or "").encode("utf-8", "surrogatepass")
    target: dict[str, Any]
    if external is None:
        routing = scheduler_v1.AppEngineRouting(service=job.service or app_service(), version=job.version or "")
        target = {
            "app_engine_http_target": scheduler_v1.AppEngineHttpTarget(
                http_method=method,
                app_engine_routing=routing,
                relative_uri=job.relative_url,
                headers=job.headers,
                body=body,
            )
        }
    else:
        target = {
            "http_target": scheduler_v1.HttpTarget(
                uri=external.delivery_url(job.project, job.location, job.pass_scope),
                http_method=method,
                headers=job.headers,
                body=body,
                oidc_token=scheduler_v1.OidcToken(
                    service_account_email=external.service_account, audience=external.audience
                ),
            )
        }
    return scheduler_v1.Job(
        name=job_path(job),
        description=job.description or "",
        schedule=job.schedule,
        time_zone=job.time_zone,
        attempt_deadline=_duration(job.deadline),
        retry_config=scheduler_v1.RetryConfig(
            retry_count=retry.retry_count,
            max_retry_duration=_duration(retry.max_retry_duration),
            min_backoff_duration=_duration(retry.min_backoff),
            max_backoff_duration=_duration(retry.max_backoff),
            max_doublings=retry.max_doublings,
        ),
        **target,
    )


def live_target(job: scheduler_v1.Job) -> str:
    """What a live job sends, as ``target_type`` and method: ``app-engine POST``, ``http GET``;
    "" for a Pub/Sub target or none."""
    for kind, field in TARGET_MESSAGES.items():
        if field in job:
            method = getattr(job, field).http_method
            return f"{kind} {'POST' if method == scheduler_v1.HttpMethod.HTTP_METHOD_UNSPECIFIED else method.name}"
    return ""


def remake_reason(job: SchedulerJob, external: ExternalTarget | None, live: scheduler_v1.Job) -> str | None:
    """Why the live job must be deleted and created again, or None.

    A job's target type is a choice of its message's oneof (an App Engine job whose jobs.yaml target
    became ``external`` is now an HTTP one), and gcloud's update keeps the HTTP method it finds:
    both are changed by making the job again, so ``apply`` and ``plan --gcloud`` do the same.
    """
    wanted, found = f"{target_type(external)} {job.method}", live_target(live)
    if found == wanted:
        return None
    return f"the live job sends {found or 'no App Engine or HTTP request'}, the file says {wanted}"


@dataclasses.dataclass(frozen=True)
class Change:
    """One field an update sets: its proto path (what the mask names), the live value and the
    declared one, for people (None: unset; a body as its text)."""

    field: str
    live: Any
    declared: Any


def changes(declared: scheduler_v1.Job, live: scheduler_v1.Job, every: bool = False) -> list[Change]:
    """What an update changes: every declared field (``COMMON_FIELDS`` and the target's) whose live
    value differs (or each, ``every``), a field set on the live job and left unset in the file included.

    Unset and a proto3 default are one (the API shows neither); header names are compared
    case-insensitively, as HTTP has them, less the headers Scheduler sets itself.
    """
    kind = "app-engine" if TARGET_MESSAGES["app-engine"] in declared else "http"
    want, have = _field_values(declared), _field_values(live)
    headers = f"{TARGET_MESSAGES[kind]}.headers"
    declared_headers = _at(want, headers) or {}

    def value(values: Mapping[str, Any], path: str) -> Any:
        found = _at(values, path)
        if path == headers:
            return _own_headers(found or {}, declared_headers) or None
        return found

    compared = [(path, value(have, path), value(want, path)) for path in (*COMMON_FIELDS, *TARGET_FIELDS[kind])]
    return [
        Change(path, _for_people(path, old), _for_people(path, new))
        for path, old, new in compared
        if _comparable(old) != _comparable(new) or (every and not (path == OAUTH_TOKEN and old is None))
    ]


def _field_values(job: scheduler_v1.Job) -> dict[str, Any]:
    """The job as JSON, by proto field name (durations as "600s", bytes in base64, enums by name)."""
    values: dict[str, Any] = scheduler_v1.Job.to_dict(job, use_integers_for_enums=False)
    return values


def api_path(path: str) -> str:
    """A field path as the REST API, its docs and an updateMask spell it: ``retryConfig.retryCount``."""
    return ".".join(part.split("_")[0] + "".join(w.title() for w in part.split("_")[1:]) for part in path.split("."))


def _for_people(path: str, value: Any) -> Any:
    """A body as its text (the API's JSON has it in base64)."""
    if value is not None and path.endswith(".body"):
        return base64.b64decode(value).decode("utf-8", "replace")
    return value


def _at(values: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path; None where it is unset or a proto3 default."""
    value: Any = values
    for key in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return None if value in (None, "", 0, "0s", {}, []) else value


def _own_headers(live: Mapping[str, str], declared: Mapping[str, str]) -> dict[str, str]:
    """The headers a job set itself: those Scheduler adds are left out unless the declaration sets
    them to the same value."""
    wanted = {name.lower(): value for name, value in declared.items()}
    own = {}
    for name, value in live.items():
        key = name.lower()
        if key in SCHEDULER_HEADERS and wanted.get(key) != value:
            for default in SCHEDULER_HEADERS[key]:
                value = value.removesuffix(default).strip()
            if not value:
                continue
        own[name] = value
    return own


def _comparable(value: Any) -> Any:
    """A value as two are compared: headers by lower-cased name, as HTTP has them."""
    return {name.lower(): text for name, text in value.items()} if isinstance(value, dict) else value


def _duration(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


# -- gcloud ---------------------------------------------------------------------------------


def gcloud_commands(job: SchedulerJob, exists: bool, external: ExternalTarget | None = None) -> list[list[str]]:
    """The gcloud commands that make Cloud Scheduler's job match the declaration.

    An update clears the headers, then sets the declared ones (gcloud cannot
    replace them in one command), so a header removed from the file goes too.
    The target is ``declared_job``'s, in gcloud's flags.
    """
    verb = "update" if exists else "create"
    kind = target_type(external)
    retry = job.retry
    target = [job.name, f"--project={job.project}", f"--location={job.location}"]
    if external is not None:
        where = [
            f"--uri={external.delivery_url(job.project, job.location, job.pass_scope)}",
            f"--oidc-service-account-email={external.service_account}",
            f"--oidc-token-audience={external.audience}",
        ]
    else:
        where = [f"--relative-url={job.relative_url}"]
    command = [
        "gcloud",
        "scheduler",
        "jobs",
        verb,
        kind,
        *target,
        f"--schedule={job.schedule}",
        f"--time-zone={job.time_zone}",
        *where,
        f"--http-method={job.method.lower()}",
        f"--attempt-deadline={_seconds(job.deadline)}",
        f"--max-retry-attempts={retry.retry_count}",
        f"--max-retry-duration={_seconds(retry.max_retry_duration)}",
        f"--min-backoff={_seconds(retry.min_backoff)}",
        f"--max-backoff={_seconds(retry.max_backoff)}",
        f"--max-doublings={retry.max_doublings}",
    ]
    commands = [command]
    if external is None:
        command.append(f"--service={job.service or app_service()}")
    if exists:
        command.append("--clear-headers")
        command.append(f"--message-body={job.body}" if job.body is not None else "--clear-message-body")
        if job.headers:
            commands.append(
                ["gcloud", "scheduler", "jobs", "update", kind, *target, _mapping_flag("--update-headers", job.headers)]
            )
    else:
        if job.headers:
            command.append(_mapping_flag("--headers", job.headers))
        if job.body is not None:
            command.append(f"--message-body={job.body}")
    if job.version and external is None:
        command.append(f"--version={job.version}")
    if job.description:
        command.append(f"--description={job.description}")
    return commands


def job_command(action: str, job: SchedulerJob, *flags: str) -> list[str]:
    """``gcloud scheduler jobs ACTION NAME`` in the job's project and location (delete, pause)."""
    return [
        "gcloud",
        "scheduler",
        "jobs",
        action,
        job.name,
        f"--project={job.project}",
        f"--location={job.location}",
        *flags,
    ]


def made_paused(job: SchedulerJob, live_state: str | None) -> bool:
    """Whether a job the plan creates (or makes again) is paused once made: ``paused: true``, or
    paused before and not ``paused: false``.

    An existing job's pause is the app's to change (schedules.history: the app applies the
    file's ``paused`` when a version that changes it first runs, in its record and in Cloud
    Scheduler), so the file and an operator's pause or resume never fight over it.
    """
    return job.paused is True or (live_state == "PAUSED" and job.paused is not False)


def update_warnings(job: SchedulerJob, fields: Sequence[str]) -> list[str]:
    """What the gcloud commands of an update of ``fields`` leave on the live job (apply clears it)."""
    return [
        f"{job.name}: no {word} declared; gcloud cannot clear the live job's, so it keeps it "
        "(scheduler apply clears it)"
        for path, word in GCLOUD_CANNOT_CLEAR.items()
        if path in fields and not {"description": job.description, "version": job.version, "body": job.body}[word]
    ]


def _seconds(value: float) -> str:
    """gcloud's duration form, in seconds: ``600s``, or ``0.5s`` (never rounded to 0)."""
    return f"{int(value)}s" if float(value).is_integer() else f"{value:.3f}".rstrip("0") + "s"


def _mapping_flag(flag: str, pairs: Mapping[str, str]) -> str:
    """``--flag=K=V,K2=V2``, switching gcloud's list delimiter when a value holds a comma
    (``gcloud topic escaping``)."""
    items = [f"{k}={v}" for k, v in sorted(pairs.items())]
    delimiter = next(d for d in LIST_DELIMITERS if not any(d in item for item in items))
    prefix = "" if delimiter == "," else f"^{delimiter}^"
    return f"{flag}={prefix}{delimiter.join(items)}"


def shell_line(command: list[str]) -> str:
    return shlex.join(command)


def shown(value: Any) -> str:
    """A field's value in a plan's line: JSON, or ``unset``."""
    return "unset" if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)
