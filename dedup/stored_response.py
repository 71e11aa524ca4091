"""An HTTP response as the guard keeps it, and which responses it keeps.

The ledger stores a kept response as a JSON document in the run's result
(or error); a replay rebuilds the response from it.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from dedup.http_status import is_retryable_status
from dedup.runner import Verdict


@dataclasses.dataclass(frozen=True)
class StoredResponse:
    """Status, body and chosen headers; the body as text when it is UTF-8, else base64 (``binary``)."""

    status: int
    body: str = ""
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    binary: bool = False

    @classmethod
    def from_body(cls, status: int, body: bytes, headers: Mapping[str, str]) -> StoredResponse:
        try:
            return cls(status, body.decode("utf-8"), headers)
        except UnicodeDecodeError:
            return cls(status, base64.b64encode(body).decode("ascii"), headers, binary=True)

    def body_bytes(self) -> bytes:
        return base64.b64decode(self.body) if self.binary else self.body.encode("utf-8")

    def document(self) -> dict[str, Any]:
        document: dict[str, Any] = {"status": self.status, "body": self.body, "headers": dict(self.headers)}
        if self.binary:
            document["binary"] = True
        return document

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> StoredResponse:
        return cls(
            int(document["status"]),
            document.get("body", ""),
            dict(document.get("headers") or {}),
            bool(document.get("binary")),
        )

    @staticmethod
    def is_document(value: Any) -> bool:
        """Written by ``document()``: a job result that merely has a status and a body is not one."""
        return (
            isinstance(value, dict)
            and isinstance(value.get("status"), int)
            and isinstance(value.get("headers"), dict)
            and "body" in value
            and set(value) <= {"status", "body", "headers", "binary"}
        )


# A request the view found malformed: its corrected retry, under the same key, must run.
VALIDATION_STATUSES = frozenset({400, 422})


def response_verdict(
    keep_validation_errors: bool = False, keep_server_errors: bool = False
) -> Callable[[Any], Verdict]:
    """How a view's answer is kept: 2xx-3xx as results, business refusals (402, 403, 404, ...)
    as failures; not kept (the key free again): answers a retry may cure (408, 409, 425, 429,
    5xx) and, unless ``keep_validation_errors``, 400 and 422, as Stripe saves nothing when
    parameters fail validation.  ``keep_server_errors`` keeps 5xx too (Stripe's rule): then a
    view that failed after its side effect is never run again for that key, and neither is one
    that failed before it."""

    def classify(document: Mapping[str, Any]) -> Verdict:
        status = document["status"]
        if status >= 500:
            return Verdict.FAILED if keep_server_errors else Verdict.RELEASED
        if is_retryable_status(status) or (status in VALIDATION_STATUSES and not keep_validation_errors):
            return Verdict.RELEASED
        return Verdict.FAILED if status >= 400 else Verdict.COMPLETED

    return classify


classify_response = response_verdict()
