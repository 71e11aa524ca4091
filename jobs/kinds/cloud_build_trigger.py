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
from typing import Any

from dedup.errors import PermanentJobError
from dedup.keys import format_utc
from jobs.base import JobKind, RunContext, checked_mapping
from jobs.errors import JobsConfigError
from jobs.kinds.google_api import GoogleApi, resource_name

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


class CloudBuildTriggerJob(JobKind):
    name = "cloud_build_trigger"
    required_keys = frozenset({"trigger"})
    optional_keys = frozenset({"substitutions", "branch", "tag", "commit", "api_base", "timeout_seconds"})

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

    @classmethod
    def from_config(cls, job_id: str, options: Mapping[str, Any], lease_seconds: float) -> CloudBuildTriggerJob:
        trigger, parts = resource_name(job_id, "trigger", options["trigger"], "triggers")
        substitutions = checked_mapping(job_id, "substitutions", options.get("substitutions", {}), substitution_problem)
        revision = {}
        for key, field in (("branch", "branchName"), ("tag", "tagName"), ("commit", "commitSha")):
            if key in options:
                revision[field] = _text(job_id, key, options[key])
        if len(revision) > 1:
            raise JobsConfigError(job_id, "branch", "give at most one of branch, tag and commit")
        # triggers.get (first run only), builds.list, triggers.run
        api = GoogleApi.from_config(job_id, options, lease_seconds, DEFAULT_API_BASE, calls_per_attempt=3)
        return cls(trigger, parts, substitutions, revision, api)

    def run(self, context: RunContext) -> Any:
        substitutions = dict(self.substitutions)
        for name, value in context.parameters.items():
            problem = substitution_problem(name, value)
            if problem:
                raise PermanentJobError(f"parameter {name!r}: {problem}")
            substitutions[name] = value
        substitutions[KEY_SUBSTITUTION] = context.downstream_key
        substitutions[TIME_SUBSTITUTION] = format_utc(context.schedule_time) if context.schedule_time else ""
        existing = context.started_before(lambda: self._find_build(substitutions))
        if existing:
            return {"build": existing, "adopted": True}
        operation = self.api.call(
            "POST",
            f"v1/{self.trigger}:run",
            body={
                "projectId": self.parts["project"],
                "triggerId": self.parts["name"],
                "source": {**self.revision, "substitutions": substitutions},
            },
        )
        build = (operation.get("metadata") or {}).get("build") or {}
        build_name = build.get("name") or (
            f"projects/{self.parts['project']}/locations/{self.parts['location']}/builds/{build['id']}"
            if build.get("id")
            else operation.get("name")
        )
        if not build_name:
            raise RuntimeError(f"triggers.run answered without a build or operation: {operation!r}")
        context.record_downstream(build_name)
        return {"build": build_name, "operation": operation.get("name"), "adopted": False}

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


def _text(job_id: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise JobsConfigError(job_id, field, "must be a non-empty string")
    return value
