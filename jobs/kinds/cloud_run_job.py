"""``cloud_run_job`` jobs: run a Cloud Run job, once per run.

``jobs.run`` takes no request id.  The run's key reaches the container as
the environment variables IDEMPOTENCY_KEY and SCHEDULE_TIME (overrides), so
the job's own code can deduplicate; the execution's name is recorded as
soon as the API answers, and a takeover adopts it.  Cloud Run cannot list
executions by such a key, so a ``jobs.run`` whose answer is lost after the
request was sent is recorded as a permanent failure (to be checked by a
person) rather than retried into a possible second execution.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from dedup.errors import PermanentJobError
from dedup.keys import format_utc
from jobs.base import JobKind, RunContext
from jobs.declared import BaseUrl, check, mapping_of
from jobs.kinds.google_api import GoogleApi, GoogleApiDeclaration, resource_name

DEFAULT_API_BASE = "https://run.googleapis.com"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = frozenset({"IDEMPOTENCY_KEY", "SCHEDULE_TIME"})


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

    kind: Literal["cloud_run_job"]
    job: Annotated[str, resource_name("jobs")]
    """projects/PROJECT/locations/LOCATION/jobs/NAME"""
    args: Annotated[list[str] | None, check(_args, list[str] | None)] = None
    """The container's arguments, instead of its own ([] clears them)."""
    env: Annotated[dict[str, Any], check(mapping_of(env_problem), dict[str, str | int | float | bool])] = {}
    """Environment variables set for the execution (IDEMPOTENCY_KEY and SCHEDULE_TIME are the app's)."""
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
        env["IDEMPOTENCY_KEY"] = context.downstream_key
        env["SCHEDULE_TIME"] = format_utc(context.schedule_time) if context.schedule_time else ""
        override: dict[str, Any] = {"env": [{"name": k, "value": v} for k, v in env.items()]}
        if args:
            override["args"] = args
        elif args is not None:
            override["clearArgs"] = True  # an empty list would mean "no override"
        if self.container:
            override["name"] = self.container
        operation = self.api.call(
            "POST",
            f"v2/{self.job}:run",
            body={"overrides": {"containerOverrides": [override]}},
            starts_execution_without_search=True,
        )
        operation_name = operation.get("name")
        if not operation_name:
            raise RuntimeError(f"jobs.run answered without an operation name: {operation!r}")
        execution = (operation.get("metadata") or {}).get("name") or operation_name
        context.record_downstream(execution)
        return {"execution": execution, "operation": operation_name, "adopted": False}


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
