"""``cloud_run_job`` jobs: run a Cloud Run job, once per run.

``jobs.run`` takes no request id and cannot label the execution, so the run
marks it through the container's environment (overrides): IDEMPOTENCY_KEY
(the run's key), SCHEDULE_TIME and RUN_ATTEMPT; the job's own code can
deduplicate on the key too.  The execution's name is recorded as soon as
the API answers, and a takeover adopts it.  An execution started by an
attempt that could not record it (its lease ran out, the answer was lost)
is found by listing the job's newest executions (executions.list has no
filter) and matching the environment, and adopted instead of starting a
second: right after a ``jobs.run`` whose answer leaves open whether it
started one, and before the ``jobs.run`` of every attempt after the first.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from dedup.errors import PermanentJobError
from dedup.keys import format_utc
from jobs.base import JobKind, RunContext
from jobs.declared import BaseUrl, check, mapping_of
from jobs.kinds.google_api import Created, CreateInDoubt, GoogleApi, GoogleApiDeclaration, create_once, resource_name

DEFAULT_API_BASE = "https://run.googleapis.com"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEY_ENV = "IDEMPOTENCY_KEY"
TIME_ENV = "SCHEDULE_TIME"
ATTEMPT_ENV = "RUN_ATTEMPT"
RESERVED_ENV = frozenset({KEY_ENV, TIME_ENV, ATTEMPT_ENV})
# Where to look for an execution an earlier attempt started: the job's newest executions.
EXECUTIONS_PAGE_SIZE = 50
EXECUTIONS_PAGES = 2


def _args(value: Any) -> list[str] | None:
    if value is not None and not (isinstance(value, list) and all(isinstance(a, str) for a in value)):
        raise ValueError("must be a list of strings")
    return value


def _container(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError("must be the name of the container to override")
    return value


class CloudRunJobDeclaration(GoogleApiDeclaration):
    """A cloud_run_job job: run a Cloud Run job, once per run."""

    # executions.list (attempts after the first), jobs.run, executions.list again (a run in
    # doubt): up to EXECUTIONS_PAGES pages each.
    calls_per_attempt = 2 * EXECUTIONS_PAGES + 1
    kind: Literal["cloud_run_job"]
    job: Annotated[str, resource_name("jobs")]
    """projects/PROJECT/locations/LOCATION/jobs/NAME"""
    args: Annotated[list[str] | None, check(_args, list[str] | None)] = None
    """The container's arguments, instead of its own ([] clears them)."""
    env: Annotated[dict[str, Any], check(mapping_of(env_problem), dict[str, str | int | float | bool])] = {}
    """Environment variables set for the execution (IDEMPOTENCY_KEY, SCHEDULE_TIME and RUN_ATTEMPT are the app's)."""
    container: Annotated[str | None, check(_container, str | None)] = None
    """The container to override, when the job has several."""
    api_base: BaseUrl = DEFAULT_API_BASE
    """The API's base URL: production's by default, a stand-in's in tests."""

    def build(self, job_id: str) -> CloudRunJob:
        env = {name: str(value) for name, value in self.env.items()}
        return CloudRunJob(self.job, self.args, env, self.container, self.api())


class CloudRunJob(JobKind):
    name = "cloud_run_job"
    declaration = CloudRunJobDeclaration

    def __init__(
        self, job: str, args: list[str] | None, env: Mapping[str, str], container: str | None, api: GoogleApi
    ) -> None:
        self.job = job
        self.args = args
        self.env = dict(env)
        self.container = container
        self.api = api

    def calls(self) -> str:
        return f"an execution of the Cloud Run job {self.job}"

    def run(self, context: RunContext) -> Any:
        if context.downstream:
            return {"execution": context.downstream, "adopted": True}
        args, env = self.args, dict(self.env)
        for name, value in context.parameters.items():
            if name == "args":
                if not (isinstance(value, list) and all(isinstance(a, str) for a in value)):
                    raise PermanentJobError("the parameter 'args' must be a list of strings")
                args = value
                continue
            problem = env_problem(name, value)
            if problem:
                raise PermanentJobError(f"parameter {name!r}: {problem}")
            env[name] = value if isinstance(value, str) else _env_text(value)
        env[KEY_ENV] = context.downstream_key
        env[TIME_ENV] = format_utc(context.schedule_time) if context.schedule_time else ""
        env[ATTEMPT_ENV] = str(context.attempt)
        override: dict[str, Any] = {"env": [{"name": k, "value": v} for k, v in env.items()]}
        if args:
            override["args"] = args
        elif args is not None:
            override["clearArgs"] = True  # an empty list would mean "no override"
        if self.container:
            override["name"] = self.container

        def run_job() -> Created:
            body = {"overrides": {"containerOverrides": [override]}}
            operation = self.api.call("POST", f"v2/{self.job}:run", body=body, creates=True)
            operation_name = operation.get("name")
            if not operation_name:
                raise CreateInDoubt(
                    f"jobs.run answered 2xx (so it may have started one) without an operation name: {operation!r}"
                )
            execution = (operation.get("metadata") or {}).get("name") or operation_name
            return Created(execution, adopted=False, extra={"operation": operation_name})

        # On the first attempt nothing can exist yet: no list, unless its own create is in doubt.
        made = create_once(
            context,
            lambda: self._find_execution(env),
            run_job,
            search_first=context.attempt > 1,
            call_seconds=self.api.timeout_seconds,
        )
        return {"execution": made.name, **made.extra, "adopted": made.adopted}

    def _find_execution(self, env: Mapping[str, str]) -> str | None:
        """An execution an earlier attempt of this run started: the oldest carrying its env.

        executions.list has no filter, so list the job's newest executions
        (EXECUTIONS_PAGES pages of EXECUTIONS_PAGE_SIZE, deleted ones too: a
        deleted execution still ran) and match here: IDEMPOTENCY_KEY and every
        other variable this run sets, so that an expired client token reused
        for another request does not adopt the old request's execution.  Not
        RUN_ATTEMPT, which differs from attempt to attempt.
        """
        wanted = {name: value for name, value in env.items() if name != ATTEMPT_ENV}
        params = {"pageSize": str(EXECUTIONS_PAGE_SIZE), "showDeleted": "true"}
        matches = []
        for _ in range(EXECUTIONS_PAGES):
            listing = self.api.call("GET", f"v2/{self.job}/executions", params=params)
            matches += [e for e in listing.get("executions") or [] if e.get("name") and _carries(e, wanted)]
            if not listing.get("nextPageToken"):
                break
            params = {**params, "pageToken": listing["nextPageToken"]}
        if not matches:
            return None
        return str(min(matches, key=lambda e: (_created(e), e["name"]))["name"])


def _carries(execution: Mapping[str, Any], wanted: Mapping[str, str]) -> bool:
    """One of the execution's containers has every variable in ``wanted`` (the job's own may be
    there besides).  Proto3 JSON leaves an empty value out, so a missing value reads as ""."""
    for container in (execution.get("template") or {}).get("containers") or []:
        env = {
            item.get("name"): item.get("value", "")
            for item in container.get("env") or []
            if isinstance(item, dict) and "valueSource" not in item
        }
        if all(env.get(name) == value for name, value in wanted.items()):
            return True
    return False


def _created(execution: Mapping[str, Any]) -> datetime.datetime:
    """The execution's createTime (RFC 3339, 0 to 9 fractional digits: not comparable as text)."""
    try:
        created = datetime.datetime.fromisoformat(execution["createTime"])
    except (KeyError, TypeError, ValueError):
        created = datetime.datetime.max
    return created if created.tzinfo else created.replace(tzinfo=datetime.UTC)


def env_problem(name: Any, value: Any) -> str | None:
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        return f"{name!r} is not a valid environment variable name"
    if name in RESERVED_ENV:
        return f"{name} is set by the app"
    if isinstance(value, (dict, list)) or value is None:
        return f"the value of {name} must be a string, number or boolean"
    return None


def _env_text(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)
