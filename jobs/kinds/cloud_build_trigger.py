"""``cloud_build_trigger`` jobs: run a Cloud Build trigger, once per run.

``triggers.run`` takes no request id.  The run's key travels in the
substitutions ``_IDEMPOTENCY_KEY`` and ``_SCHEDULE_TIME``; an attempt looks
for a build an earlier attempt started (the recorded name, else the
trigger's recent builds carrying the key) and adopts it instead of starting
another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import model_validator

from dedup.errors import PermanentJobError
from dedup.keys import format_utc
from jobs.base import JobKind, RunContext
from jobs.declared import BaseUrl, OmittableText, check, field_problem, mapping_of
from jobs.kinds.google_api import (
    Created,
    CreateInDoubt,
    GoogleApi,
    GoogleApiDeclaration,
    create_once,
    resource_name,
    resource_parts,
)

DEFAULT_API_BASE = "https://cloudbuild.googleapis.com"
KEY_SUBSTITUTION = "_IDEMPOTENCY_KEY"
TIME_SUBSTITUTION = "_SCHEDULE_TIME"
# Where to look for a build an earlier attempt started: the newest builds of the trigger.
BUILDS_PAGE_SIZE = 50
BUILDS_PAGES = 2
# User-defined substitutions: an underscore, then upper-case letters, digits and underscores.
_SUBSTITUTION = re.compile(r"_[A-Z0-9_]+")


def substitution_problem(name: Any, value: Any) -> str | None:
    if not isinstance(name, str) or not _SUBSTITUTION.fullmatch(name):
        return f"{name!r} is not a user substitution (an underscore, then A-Z, 0-9 and _)"
    if name in (KEY_SUBSTITUTION, TIME_SUBSTITUTION):
        return f"{name} is set by the app"
    if not isinstance(value, str):
        return f"the value of {name} must be a string"
    return None


class CloudBuildTriggerDeclaration(GoogleApiDeclaration):
    """A cloud_build_trigger job: run a Cloud Build trigger, once per run."""

    calls_per_attempt = 3  # triggers.get (first run only), builds.list, triggers.run
    kind: Literal["cloud_build_trigger"]
    trigger: Annotated[str, resource_name("triggers")]
    """projects/PROJECT/locations/LOCATION/triggers/NAME"""
    substitutions: Annotated[dict[str, str], check(mapping_of(substitution_problem), dict[str, str])] = {}
    """User substitutions (_NAME: value); _IDEMPOTENCY_KEY and _SCHEDULE_TIME are the app's."""
    branch: OmittableText = None
    """The branch to build (at most one of branch, tag and commit)."""
    tag: OmittableText = None
    """The tag to build."""
    commit: OmittableText = None
    """The commit to build."""
    api_base: BaseUrl = DEFAULT_API_BASE
    """The API's base URL: production's by default, a stand-in's in tests."""

    @model_validator(mode="after")
    def one_revision(self) -> Self:
        if len(self.revision()) > 1:
            raise field_problem("branch", "give at most one of branch, tag and commit")
        return self

    def revision(self) -> dict[str, str]:
        given = {"branchName": self.branch, "tagName": self.tag, "commitSha": self.commit}
        return {field: value for field, value in given.items() if value is not None}

    def build(self, job_id: str) -> CloudBuildTriggerJob:
        parts = resource_parts(self.trigger, "triggers")
        return CloudBuildTriggerJob(self.trigger, parts, self.substitutions, self.revision(), self.api())


class CloudBuildTriggerJob(JobKind):
    name = "cloud_build_trigger"
    declaration = CloudBuildTriggerDeclaration

    def __init__(
        self,
        trigger: str,
        parts: dict[str, str],
        substitutions: Mapping[str, str],
        revision: dict[str, str],
        api: GoogleApi,
    ) -> None:
        self.trigger = trigger
        self.parts = parts
        self.substitutions = dict(substitutions)
        self.revision = revision
        self.api = api
        self._trigger_uuid: str | None = None

    def calls(self) -> str:
        return f"a build of the Cloud Build trigger {self.trigger}"

    def run(self, context: RunContext) -> Any:
        substitutions = dict(self.substitutions)
        for name, value in context.parameters.items():
            problem = substitution_problem(name, value)
            if problem:
                raise PermanentJobError(f"parameter {name!r}: {problem}")
            substitutions[name] = value
        substitutions[KEY_SUBSTITUTION] = context.downstream_key
        substitutions[TIME_SUBSTITUTION] = format_utc(context.schedule_time) if context.schedule_time else ""

        def create() -> Created:
            operation = self.api.call(
                "POST",
                f"v1/{self.trigger}:run",
                body={
                    "projectId": self.parts["project"],
                    "triggerId": self.parts["name"],
                    "source": {**self.revision, "substitutions": substitutions},
                },
                creates=True,
            )
            build = (operation.get("metadata") or {}).get("build") or {}
            build_name = build.get("name") or (
                f"projects/{self.parts['project']}/locations/{self.parts['location']}/builds/{build['id']}"
                if build.get("id")
                else operation.get("name")
            )
            if not build_name:
                raise CreateInDoubt(
                    f"triggers.run answered 2xx (it may have started one) without a build or operation: {operation!r}"
                )
            return Created(build_name, adopted=False, extra={"operation": operation.get("name")})

        find = lambda: self._find_build(substitutions)  # noqa: E731 - one search, named for reading
        made = create_once(context, find, create, search_first=True, call_seconds=self.api.timeout_seconds)
        return {"build": made.name, **made.extra, "adopted": made.adopted}

    def _find_build(self, substitutions: Mapping[str, str]) -> str | None:
        """A build an earlier attempt of this run started.

        builds.list filters only on documented fields, so list this trigger's
        builds (newest first) and match here: the key and every other
        substitution (an expired client token reused for another request
        must not adopt the old request's build).
        """
        params = {"filter": f'trigger_id="{self._trigger_id()}"', "pageSize": str(BUILDS_PAGE_SIZE)}
        matches = []
        for _ in range(BUILDS_PAGES):
            listing = self.api.call(
                "GET",
                f"v1/projects/{self.parts['project']}/locations/{self.parts['location']}/builds",
                params=params,
            )
            matches += [
                build
                for build in listing.get("builds") or []
                if _carries(build.get("substitutions") or {}, substitutions)
            ]
            if not listing.get("nextPageToken"):
                break
            params = {**params, "pageToken": listing["nextPageToken"]}
        if not matches:
            return None
        build = min(matches, key=lambda b: b.get("createTime", ""))
        return build.get("name") or (
            f"projects/{self.parts['project']}/locations/{self.parts['location']}/builds/{build['id']}"
        )

    def _trigger_id(self) -> str:
        """The trigger's UUID (what builds record), from triggers.get once per process."""
        if self._trigger_uuid is None:
            trigger = self.api.call("GET", f"v1/{self.trigger}")
            if not trigger.get("id"):
                raise RuntimeError(f"triggers.get answered without an id: {trigger!r}")
            self._trigger_uuid = trigger["id"]
        return self._trigger_uuid


def _carries(found: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """The build carries every substitution this run sends (Cloud Build may add built-in ones)."""
    return all(found.get(name) == value for name, value in wanted.items())
