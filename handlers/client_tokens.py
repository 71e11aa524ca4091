"""A manual run as a request asks for it: its client token and its parameters.

Read from the run API's request (``read_manual_run_request``) and checked by the same
rule as the dashboard's forms (``client_token_problem``), whose tokens are made when the
page is rendered (``new_form_token``).  The run itself is ``service.runs.run_manually``.
"""

from __future__ import annotations

import uuid
from typing import Any

from dedup.adapters.flask_guard import Fingerprint, GuardRejected, KeyFrom
from dedup.adapters.flask_json import json_payload
from service.runs import ManualRunRequest

MAX_TOKEN_LENGTH = 64
BODY_KEYS = frozenset({"clientToken", "parameters"})


def client_token_problem(token: str) -> str | None:
    """ECS's rule: case-sensitive, 1 to 64 characters, each ASCII 33 to 126."""
    if not 1 <= len(token) <= MAX_TOKEN_LENGTH:
        return f"clientToken must be 1 to {MAX_TOKEN_LENGTH} characters long; it has {len(token)}"
    for position, char in enumerate(token):
        if not 33 <= ord(char) <= 126:
            return (
                "clientToken may contain only ASCII characters 33 to 126 (no spaces, control "
                f"or non-ASCII characters); character {position + 1} is {char!r}"
            )
    return None


def new_form_token() -> str:
    """The client token a rendered form carries: one run however often the form is sent."""
    return str(uuid.uuid4())


def retry_token(run_id: str) -> str:
    """The client token of the retry of ``run_id``: the run's own, so retrying it is one decision.

    A failed manual run never changes, so however many pages, tabs or
    resends ask to retry it, they ask for the same new run (within the
    token's lifetime); a retry that fails too is retried from its own page.
    """
    return f"retry-{run_id}"[:MAX_TOKEN_LENGTH]


def manual_run_parameters(also: frozenset[str] = frozenset()) -> dict[str, Any]:
    payload = json_payload()
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise GuardRejected('the request body must be a JSON object: {"clientToken", "parameters"}')
    unknown = sorted(set(payload) - BODY_KEYS - also)
    if unknown:
        raise GuardRejected(f"unknown field(s) {', '.join(unknown)}; allowed: clientToken, parameters")
    parameters = payload.get("parameters", {})
    if not isinstance(parameters, dict):
        raise GuardRejected("parameters must be a JSON object")
    return parameters


# The token: the body's clientToken or the Idempotency-Key header (a fresh one when neither).
# ECS's clientToken is a string: a number in its place is refused, as ECS refuses it.
MANUAL_RUN_KEY = KeyFrom.field(
    "clientToken",
    header="Idempotency-Key",
    required=False,
    generate=True,
    validate=client_token_problem,
    integers=False,
)


def read_manual_run_request(also: frozenset[str] = frozenset()) -> ManualRunRequest:
    """The run API's request as a manual run; GuardRejected or InvalidJson (a 400) for a bad
    token, body or parameters.  ``also``: the body's other fields, read by its caller (the
    dispatched task's, whose body is the API's with the job and who asked)."""
    token = MANUAL_RUN_KEY.read() or str(uuid.uuid4())
    return ManualRunRequest(token, Fingerprint.of(lambda: manual_run_parameters(also)).parameters())


def earlier_manual_run_request(token: str, parameters: dict[str, Any]) -> ManualRunRequest:
    """A dispatched manual run as the version before queued it (its token named ``client_token``):
    the token under the same rule; its parameters were bounded when that version queued them."""
    problem = client_token_problem(token)
    if problem:
        raise GuardRejected(problem)
    return ManualRunRequest(token, parameters)
