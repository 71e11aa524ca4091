"""What tests hold of a problem (RFC 9457, ``handlers.problems``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from handlers.problems import MEDIA_TYPE, TYPES_BY_ERROR


def code_and_message(body: Mapping[str, Any]) -> dict[str, Any]:
    """The ``error`` and ``message`` members: what every error said before it was a problem."""
    return {"error": body["error"], "message": body["message"]}


def problem_violations(status: int, content_type: str, body: bytes, path: str) -> list[str]:
    """How an error answer breaks the app's rule: every error is a problem (RFC 9457), but the
    dashboard's HTML pages for browsers, and a failed run's own document (a 422 run, as replayed)."""
    if status < 400:
        return []
    mimetype = content_type.split(";")[0].strip()
    if mimetype == "text/html":
        return []
    try:
        document = json.loads(body)
    except ValueError:
        return [f"{status} {path}: not JSON: {body[:80]!r}"]
    if mimetype == "application/json" and status == 422 and document.get("status") == "failed":
        return []  # the run's document: what GET /api/v1/runs/<id> shows of it too
    problems = []
    if mimetype != MEDIA_TYPE:
        problems.append(f"{status} {path}: Content-Type {content_type!r}, not {MEDIA_TYPE}")
    kind = TYPES_BY_ERROR.get(document.get("error"))
    expected = {
        "type": kind.uri if kind else "about:blank",
        "title": kind.title if kind else HTTPStatus(status).phrase,
        "status": status,
        "detail": document.get("message"),
        "instance": path,
    }
    for member, value in expected.items():
        if document.get(member) != value:
            problems.append(f"{status} {path}: {member} is {document.get(member)!r}, not {value!r}")
    if not isinstance(document.get("detail"), str) or not document["detail"]:
        problems.append(f"{status} {path}: no detail")
    if not isinstance(document.get("retryable"), bool):
        problems.append(f"{status} {path}: retryable is {document.get('retryable')!r}")
    return problems
