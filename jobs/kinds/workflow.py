"""``workflow`` jobs: start a Workflows execution, once per run.

Workflows' executions.create takes no request id, so the run's key travels
in the execution's ``argument`` (``idempotency_key``, ``schedule_time``) and
in a label, by which an attempt finds an execution that an earlier attempt
started but could not record (a lost lease, a lost response) and adopts it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from dedup.keys import format_utc
from jobs.base import JobKind, RunContext
from jobs.declared import BaseUrl, check
from jobs.kinds.google_api import Created, CreateInDoubt, GoogleApi, GoogleApiDeclaration, create_once, resource_name

DEFAULT_API_BASE = "https://workflowexecutions.googleapis.com"
LABEL_KEY = "idempotency_key"  # "-" would read as negation in a list filter
MAX_LABEL_LENGTH = 63


def label_value(run_id: str) -> str:
    """A label-safe form of the key: lower-case letters, digits, '_' and '-', at most 63.

    run_ids are 64 lower-case hex digits; 63 of them (252 bits) stay unique.
    """
    safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_-") else "-" for ch in run_id.lower())
    return safe[:MAX_LABEL_LENGTH]


def _argument(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be a mapping (the workflow's JSON argument)")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be JSON-serialisable: {exc}") from None
    return value


class WorkflowDeclaration(GoogleApiDeclaration):
    """A workflow job: start a Workflows execution, once per run."""

    calls_per_attempt = 2  # executions.list, executions.create
    kind: Literal["workflow"]
    workflow: Annotated[str, resource_name("workflows")]
    """projects/PROJECT/locations/LOCATION/workflows/NAME"""
    argument: Annotated[dict[str, Any], check(_argument, dict[str, Any])] = {}
    """The execution's JSON argument; the run's parameters and key are added to it."""
    api_base: BaseUrl = DEFAULT_API_BASE
    """The API's base URL: production's by default, a stand-in's in tests."""

    def build(self, job_id: str) -> WorkflowJob:
        return WorkflowJob(self.workflow, self.argument, self.api())


class WorkflowJob(JobKind):
    name = "workflow"
    declaration = WorkflowDeclaration

    def __init__(self, workflow: str, argument: Mapping[str, Any], api: GoogleApi) -> None:
        self.workflow = workflow
        self.argument = dict(argument)
        self.api = api

    def calls(self) -> str:
        return f"a new execution of the workflow {self.workflow}"

    def run(self, context: RunContext) -> Any:
        label = label_value(context.run_id)
        argument = {
            **self.argument,
            **context.parameters,
            "idempotency_key": context.downstream_key,
            "schedule_time": format_utc(context.schedule_time) if context.schedule_time else None,
        }

        def create() -> Created:
            execution = self.api.call(
                "POST",
                f"v1/{self.workflow}/executions",
                body={"argument": json.dumps(argument), "labels": {LABEL_KEY: label}},
                creates=True,
            )
            name = execution.get("name")
            if not name:
                raise CreateInDoubt(
                    f"executions.create answered 2xx (so it may have started one) without a name: {execution!r}"
                )
            return Created(name, adopted=False, extra={"state": execution.get("state")})

        find = lambda: self._find_execution(label, argument)  # noqa: E731 - one search, named for reading
        made = create_once(context, find, create, search_first=True, call_seconds=self.api.timeout_seconds)
        return {"execution": made.name, **made.extra, "adopted": made.adopted}

    def _find_execution(self, label: str, argument: dict[str, Any]) -> str | None:
        """An execution an earlier attempt of this run started: its label and its argument match.

        The argument check keeps an expired client token, reused for another
        request, from adopting the old request's execution.
        """
        listing = self.api.call(
            "GET",
            f"v1/{self.workflow}/executions",
            params={"filter": f'labels.{LABEL_KEY}="{label}"', "view": "FULL", "pageSize": "10"},
        )
        matches = [e for e in listing.get("executions") or [] if _argument_of(e) == argument]
        return min(matches, key=lambda e: e.get("startTime", ""))["name"] if matches else None


def _argument_of(execution: Mapping[str, Any]) -> Any:
    try:
        return json.loads(execution.get("argument") or "null")
    except ValueError:
        return None
