"""Cloud Scheduler's jobs made to match scheduler.yaml through its API (google-cloud-scheduler):
``python -m deploy scheduler plan`` and ``apply``.

The plan reads the live jobs (jobs.list, once per project and location) and gives each declared job
one step: create it, update it (one jobs.patch whose update mask names every field that differs,
so a field the file no longer declares is cleared), make it again (delete, create: a changed
target type or HTTP method), or leave it.  ``apply`` takes the steps in order and stops at the
first the API refuses, saying what was done and what was not.

The client speaks REST to ``DEDUP_SCHEDULER_API_BASE`` (Google's by default).  Against an
``http://`` base (a local stand-in: devtools/cloud_scheduler_fake.py) it sends no credentials,
as the app's Cloud Tasks client does; against ``https://`` it uses Application Default
Credentials.  REST rather than gRPC: the stand-in is a plain HTTP server like the others, and an
``http://`` endpoint needs no TLS and no channel of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import google.auth.exceptions
import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import scheduler_v1

from deploy.scheduler_config import (
    Change,
    api_path,
    changes,
    declared_job,
    gcloud_commands,
    job_command,
    job_parent,
    job_path,
    made_paused,
    remake_reason,
    shown,
    target_type,
    update_warnings,
)
from jobs.base import ExternalTarget
from schedules.config import SchedulerJob
from settings import is_local_api_base

CALL_TIMEOUT_SECONDS = 60.0
# What a call to the API raises when it is refused or never answered.
API_ERRORS = (api_exceptions.GoogleAPIError, google.auth.exceptions.GoogleAuthError, requests.RequestException)


class SchedulerApiError(Exception):
    """The API refused, or could not be reached: the message says what was and was not done."""


@dataclasses.dataclass(frozen=True)
class Step:
    """What apply does to one declared job, and what the plan says of it."""

    job: SchedulerJob
    external: ExternalTarget | None
    declared: scheduler_v1.Job
    live: scheduler_v1.Job | None  # None: no such job (or not asked: --assume-new)
    changes: tuple[Change, ...] = ()  # an update's: the fields that differ (its mask)
    remake: str | None = None  # why the live job is deleted and created again
    pause: bool = False  # pause the job once created

    @property
    def action(self) -> str:
        """``create``, ``recreate``, ``update`` or ``unchanged``."""
        if self.live is None:
            return "create"
        if self.remake is not None:
            return "recreate"
        return "update" if self.changes else "unchanged"

    @property
    def fields(self) -> list[str]:
        """The update's mask."""
        return [change.field for change in self.changes]

    @property
    def live_state(self) -> str | None:
        return None if self.live is None else self.live.state.name


def scheduler_client(api_base: str) -> scheduler_v1.CloudSchedulerClient:
    """A Cloud Scheduler client over REST to ``api_base``: anonymous to an ``http://`` stand-in,
    with Application Default Credentials to Google's (raising google-auth's error without them)."""
    return scheduler_v1.CloudSchedulerClient(
        transport="rest",
        client_options=ClientOptions(api_endpoint=api_base),
        credentials=AnonymousCredentials() if is_local_api_base(api_base) else None,  # type: ignore[no-untyped-call]
    )


def live_jobs(client: scheduler_v1.CloudSchedulerClient, jobs: Iterable[SchedulerJob]) -> dict[str, scheduler_v1.Job]:
    """The live jobs of every project and location ``jobs`` are in, by resource name: one jobs.list each."""
    found: dict[str, scheduler_v1.Job] = {}
    for parent in dict.fromkeys(job_parent(job) for job in jobs):
        try:
            for live in client.list_jobs(parent=parent, timeout=CALL_TIMEOUT_SECONDS):
                found[live.name] = live
        except API_ERRORS as exc:
            raise SchedulerApiError(f"Cloud Scheduler did not list the jobs of {parent}: {exc}") from None
    return found


def plan_steps(
    jobs: Iterable[SchedulerJob],
    externals: Mapping[str, ExternalTarget | None],
    live: Mapping[str, scheduler_v1.Job] | None,
) -> list[Step]:
    """A step per declared job, against the ``live`` jobs (None: none asked, so every job is created).

    ``externals``: each jobs.yaml target's external target (None for the app's own jobs).
    """
    steps = []
    for job in jobs:
        external = externals[job.target]
        declared = declared_job(job, external)
        found = None if live is None else live.get(job_path(job))
        if found is None:
            steps.append(Step(job, external, declared, None, pause=made_paused(job, None)))
            continue
        remake = remake_reason(job, external, found)
        if remake is not None:
            steps.append(Step(job, external, declared, found, remake=remake, pause=made_paused(job, found.state.name)))
            continue
        # A job left UPDATE_FAILED by an update runs no more until one succeeds (job.proto): every field is sent.
        failed = found.state == scheduler_v1.Job.State.UPDATE_FAILED
        steps.append(Step(job, external, declared, found, changes=tuple(changes(declared, found, every=failed))))
    return steps


def plan_lines(step: Step) -> list[str]:
    """What the plan says of a step: a line naming it, then each changed field, ``old -> new``."""
    name = f"{step.job.name} ({job_path(step.job)})"
    if step.action == "unchanged":
        lines = [f"unchanged {name}"]
    elif step.action == "update":
        lines = [f"update {name}: {', '.join(api_path(field) for field in step.fields)}"]
        lines += [
            f"    {api_path(change.field)}: {shown(change.live)} -> {shown(change.declared)}" for change in step.changes
        ]
    elif step.action == "recreate":
        lines = [f"recreate {name}: delete it, then create it as {target_type(step.external)} {step.job.method}"]
    else:
        lines = [f"create {name}: {target_type(step.external)} {step.job.method}"]
    # Exclusion windows live in the app, not in Cloud Scheduler: said so the plan shows the downtime.
    excluded = [f"    excluded ({step.job.time_zone}): {window.words()}" for window in step.job.exclude]
    after = step.job.catch_up_after_exclusion
    if step.job.exclude and after != "none":
        excluded.append(
            "    after each window: "
            + ("its newest slot runs" if after == "latest" else "one run of its newest slot stands for its others")
        )
    return lines + excluded + ([f"pause {name}"] if step.pause else [])


def notes(step: Step) -> list[str]:
    """What an operator should know of a step beside it: a job made again, a pause left to the app."""
    job, state = step.job, step.live_state
    if step.remake is not None:
        return [f"warning: {job.name}: {step.remake}; it is deleted and created again"]
    if state is None:
        return []
    if state == "UPDATE_FAILED":
        return [f"warning: {job.name} is UPDATE_FAILED in Cloud Scheduler (an update failed); it is updated again"]
    if job.paused is not None and (state == "PAUSED") != job.paused:
        return [
            f"note: {job.name} is {state.lower()} in Cloud Scheduler; the app makes it "
            f"{'paused' if job.paused else 'enabled'} when the version that changes paused: first runs"
        ]
    if job.paused is None and state == "PAUSED":
        return [f"note: {job.name} is paused in Cloud Scheduler and left so (paused: false resumes it)"]
    return []


def step_commands(step: Step) -> tuple[list[list[str]], list[str]]:
    """The gcloud commands that do what the step does, and what they would leave undone."""
    job, external = step.job, step.external
    if step.action == "unchanged":
        return [], []
    if step.action == "update":
        return gcloud_commands(job, exists=True, external=external), update_warnings(job, step.fields)
    commands = [job_command("delete", job, "--quiet")] if step.action == "recreate" else []
    commands += gcloud_commands(job, exists=False, external=external)
    return commands + ([job_command("pause", job)] if step.pause else []), []


def apply_steps(client: scheduler_v1.CloudSchedulerClient, steps: list[Step], say: Callable[[str], None]) -> None:
    """Take the steps in order, ``say``-ing each call once the API has answered it.

    The first call the API refuses stops the run: SchedulerApiError names it, what was done
    before it, and what was not, so nothing half-done is reported as done.
    """
    done: list[str] = []
    for index, step in enumerate(steps):
        calls = _calls(client, step)
        for position, (verb, call) in enumerate(calls):
            try:
                call()
            except API_ERRORS as exc:
                left = [f"{_VERBS[later]} {step.job.name}" for later, _ in calls[position:]]
                left += [f"{s.action} {s.job.name}" for s in steps[index + 1 :] if s.action != "unchanged"]
                raise SchedulerApiError(_refusal(step, verb, exc, done, left)) from None
            done.append(f"{verb} {step.job.name}")
            say(done[-1])


def _calls(client: scheduler_v1.CloudSchedulerClient, step: Step) -> list[tuple[str, Callable[[], Any]]]:
    """The API calls a step makes, each with the word for it done."""
    name, timeout = job_path(step.job), CALL_TIMEOUT_SECONDS
    calls: list[tuple[str, Callable[[], Any]]] = []
    if step.action == "update":
        mask = {"paths": list(step.fields)}
        calls.append(("updated", lambda: client.update_job(job=step.declared, update_mask=mask, timeout=timeout)))
    if step.action == "recreate":
        calls.append(("deleted", lambda: client.delete_job(name=name, timeout=timeout)))
    if step.action in ("create", "recreate"):
        parent = job_parent(step.job)
        calls.append(("created", lambda: client.create_job(parent=parent, job=step.declared, timeout=timeout)))
    if step.pause:
        calls.append(("paused", lambda: client.pause_job(name=name, timeout=timeout)))
    return calls


_VERBS = {"updated": "update", "deleted": "delete", "created": "create", "paused": "pause"}


def _refusal(step: Step, verb: str, exc: BaseException, done: list[str], left: list[str]) -> str:
    job = step.job
    lines = [f"Cloud Scheduler did not {_VERBS[verb]} {job.name} ({job_path(job)}): {exc}"]
    if isinstance(exc, api_exceptions.Conflict) and verb == "created":
        lines.append(f"{job.name} exists already: without --assume-new, apply updates it")
    if verb == "created" and step.action == "recreate":
        lines.append(f"{job.name} was deleted and not created again: apply again creates it")
    if verb == "paused":
        lines.append(f"{job.name} was created and is not paused: run {' '.join(job_command('pause', job))}")
    lines.append(f"done: {', '.join(done) or 'nothing'}")
    lines.append(f"not done: {', '.join(left)}")
    return "\n".join(lines)
