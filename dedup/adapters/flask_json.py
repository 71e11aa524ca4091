"""The request's body as strict JSON: what a fingerprint and a stored record can hold.

Python's ``json`` accepts more than JSON (NaN, Infinity, lone surrogates), and a
body nested deeply enough parses yet overflows the encoders that store and
fingerprint it.  Each of those is refused with a message saying why.
"""

from __future__ import annotations

import json
from typing import Any

try:
    from flask import g, request
except ImportError as missing:  # the core installs without it
    raise ImportError(
        "dedup.adapters.flask_json needs Flask: pip install 'cloud-scheduler-dedup[flask]'", name=missing.name
    ) from missing

from dedup.idempotency import canonical_json
from dedup.json_depth import MAX_JSON_DEPTH, nesting_depth_exceeds


class InvalidJson(ValueError):
    """The body is not strict JSON; ``message`` says why (a 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_NO_PAYLOAD = object()


def json_payload() -> Any:
    """The request's JSON body (None when empty), parsed once; InvalidJson when it is not
    strict JSON (NaN, Infinity, invalid UTF-8, lone surrogates, absurd nesting)."""
    cached = g.get("_idempotency_payload", _NO_PAYLOAD)
    if cached is not _NO_PAYLOAD:
        return cached
    raw = request.get_data(cache=True)
    payload = strict_json(raw, "the request body") if raw.strip() else None
    g._idempotency_payload = payload
    return payload


def strict_json(raw: bytes | str, what: str) -> Any:
    """``raw`` parsed as strict JSON; InvalidJson naming ``what`` when it is not."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(text, parse_constant=_reject_constant)
        if nesting_depth_exceeds(value, MAX_JSON_DEPTH):
            # Parsed fine, but storing it would overflow the stack of NDB's encoder.
            raise RecursionError
        canonical_json(value).encode("utf-8")
    except (ValueError, RecursionError, UnicodeError) as exc:
        reason = (
            f"it is nested more than {MAX_JSON_DEPTH} levels deep"
            if isinstance(exc, RecursionError)
            else str(exc)[:200]
        )
        raise InvalidJson(f"{what} is not valid JSON: {reason}") from None
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
