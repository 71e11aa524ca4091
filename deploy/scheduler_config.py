"""The gcloud commands that make Cloud Scheduler's jobs match scheduler.yaml (parsed by schedules.config)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

import yaml

from jobs.base import ExternalTarget
from schedules.config import LIST_DELIMITERS, SchedulerJob

APP_YAML = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app.yaml")


def app_service(path: str = APP_YAML) -> str:
    """The App Engine service app.yaml deploys (``default`` when it names none).

    Read from app.yaml itself, so the Scheduler jobs that name no service are sent
    where the app runs: left unset, Scheduler sends them to the ``default`` service,
    which here is another app's (or a placeholder's).
    """
    with open(path, encoding="utf-8") as handle:
        return str((yaml.safe_load(handle) or {}).get("service") or "default")


# -- gcloud ---------------------------------------------------------------------------------


def gcloud_commands(job: SchedulerJob, exists: bool, external: ExternalTarget | None = None) -> list[list[str]]:
    """The gcloud commands that make Cloud Scheduler's job match the declaration.

    An update clears the headers, then sets the declared ones (gcloud cannot
    replace them in one command), so a header removed from the file goes too.
    An App Engine target always names its service (the job's, else app.yaml's),
    never left to Scheduler's default.  An ``external`` job's is an HTTP target
    calling its handler with an OIDC token from its caller's service account.
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


def target_type(external: ExternalTarget | None) -> str:
    """gcloud's name of the Scheduler job's target type: ``app-engine`` for this app's jobs,
    ``http`` for an external job's handler."""
    return "app-engine" if external is None else "http"


def pause_commands(job: SchedulerJob, live_state: str, created: bool) -> list[list[str]]:
    """Pause a job the plan creates (or makes again) paused: ``paused: true``, or paused before and
    not ``paused: false``.

    An existing job's pause is the app's to change (schedules.history: the app applies the
    file's ``paused`` when a version that changes it first runs, in its record and in Cloud
    Scheduler), so the file and an operator's pause or resume never fight over it.
    """
    target = [job.name, f"--project={job.project}", f"--location={job.location}"]
    if created and (job.paused is True or (live_state == "PAUSED" and job.paused is not False)):
        return [["gcloud", "scheduler", "jobs", "pause", *target]]
    return []


def update_warnings(job: SchedulerJob, external: ExternalTarget | None = None) -> list[str]:
    """What an update cannot undo: gcloud has no --clear-version or --clear-description (an HTTP
    target has no version)."""
    fields = (
        (("description", job.description),)
        if external
        else (("version", job.version), ("description", job.description))
    )
    return [
        f"{job.name}: no {field} declared; gcloud cannot clear it, so the live job keeps any it has"
        for field, value in fields
        if not value
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
