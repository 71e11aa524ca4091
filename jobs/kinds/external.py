"""``external`` jobs: a handler of their own, served elsewhere with the library, runs them.

A Cloud Run service or function (or an App Engine app called at its URL) made exactly-once with
``cloud-scheduler-dedup`` (docs/library.md) writes the same run records as this app, under the
job id its ``Deliveries`` name.  Declared here as an ``external`` job, its Scheduler jobs are
listed, audited, alerted on and shown on the operator's page beside the app's own jobs, from
those records.  Its Scheduler jobs are HTTP targets calling ``url`` with an OIDC token from
``service_account`` (``python -m deploy scheduler``), and the operator's runs of its slots
(run this slot, catch-up, a missed slot's misfire) are Cloud Tasks HTTP tasks to the same URL
with the same token and the slot's Scheduler headers: the handler keys them as that slot's
delivery, so a run and Scheduler's own delivery are one execution.  Every call carries an OIDC
token, so the handler admits it with ``dedup.callers.Callers``, never ``AppEngineCallers``.

This app never runs such a job itself: a run it claimed would hold the key the handler's
delivery claims.  So its runner refuses (``RunsElsewhere``), and every way of asking the app to
run one in its own process is refused before anything is recorded (service.runs.runs_here).
"""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Any, Literal, Self

from pydantic import model_validator

from dedup.callers import normal_email
from dedup.errors import PermanentJobError
from jobs.base import ExternalTarget, JobKind, RunContext, is_loopback_url, without_credentials
from jobs.declared import HttpUrl, JobDeclaration, OmittableText, check, field_problem


def _email(value: Any) -> str:
    email = normal_email(value) if isinstance(value, str) else None
    if email is None:
        raise ValueError(f"must be a service account's email, got {value!r}")
    return email


class ExternalDeclaration(JobDeclaration):
    """An external job: a handler served elsewhere with the library runs it (docs/library.md)."""

    kind: Literal["external"]
    url: HttpUrl
    """The handler's absolute https URL (its Scheduler jobs and the operator's slot runs call it)."""
    service_account: Annotated[str, check(_email)]
    """The service account whose OIDC token the calls carry (it may invoke the handler)."""
    audience: OmittableText = None
    """The token's audience: by default the url without its query."""

    @model_validator(mode="after")
    def only_what_the_library_does(self) -> Self:
        # The handler's Deliveries, not this app, runs the job: keys whose rules it would not apply are refused.
        if self.overlap != "allow":
            raise field_problem("overlap", "must be allow: the library's handler holds no job lock")
        if self.max_delay_seconds is not None:
            raise field_problem("max_delay_seconds", "is not applied by the library's handler: leave it out")
        if self.fingerprint_exclude:
            raise field_problem("fingerprint_exclude", "applies to manual runs, which an external job has none of")
        if urllib.parse.urlsplit(self.url).scheme != "https" and not is_loopback_url(self.url):
            raise field_problem("url", "must be https: the calls carry an OIDC token (http only to loopback, to test)")
        return self

    def build(self, job_id: str) -> ExternalJob:
        audience = self.audience or without_credentials(self.url)
        return ExternalJob(ExternalTarget(self.url, self.service_account, audience))


class ExternalJob(JobKind):
    name = "external"
    declaration = ExternalDeclaration

    def __init__(self, target: ExternalTarget) -> None:
        self.target = target

    @property
    def external(self) -> ExternalTarget:
        return self.target

    def calls(self) -> str:
        parts = urllib.parse.urlsplit(self.target.url)
        return f"its own handler at {parts.scheme}://{parts.netloc}{parts.path or '/'} (a Cloud Tasks HTTP task)"

    def run(self, context: RunContext) -> Any:
        # Never reached through the app's own paths (service.runs.runs_here refuses them first).
        raise PermanentJobError(f"{context.job_id} runs in its own handler at {self.target.url}, not in this app")
