"""The idempotency guard as a Flask decorator, for any mutating endpoint.

    @app.post("/payments")
    @idempotent("payments", fingerprint=Fingerprint.fields("amount", "currency"), scope=current_tenant)
    def create_payment(): ...

A first request runs the view and its response (status, body, chosen
headers) is kept; a retry with the same key and fields gets that response
again with ``Idempotent-Replayed: true``; a retry while the first is running
gets 409 (or waits, with ``Prefer: wait=N``); the same key with other fields
gets 422.  Answers a retry may cure (408, 409, 425, 429, 5xx, exceptions)
are not kept.  The app must give each request an NDB context
(handlers.NdbContextMiddleware).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Any

from flask import Flask, Response, current_app, g, make_response, request
from werkzeug.exceptions import HTTPException

from dedup.idempotency import (
    DEFAULT_POLICY,
    IdempotencyGuard,
    canonical_json,
)
from dedup.ledger import Ledger, RunPolicy
from dedup.outcomes import Attempt
from dedup.runner import Waiting, WaitSlots, storable_json_problem
from handlers.answers import note_outcome
from handlers.problems import problem
from handlers.replayed_response import StoredResponse, response_verdict
from handlers.responses import guarded_response
from handlers.strict_json import InvalidJson, json_payload, strict_json
from jobs.config import MAX_JOB_ID_CHARS  # a guard's namespace and job_id(), as jobs.yaml's job ids
from models import RunSource
from settings import DEFAULT_MAX_WAITERS

log = logging.getLogger(__name__)

GUARD_EXTENSION = "dedup.idempotency"
# What a guard guards by default: the methods that change things (GET, HEAD and OPTIONS are safe).
GUARDED_METHODS = ("POST", "PUT", "PATCH", "DELETE")
MAX_WAIT_SECONDS = 60  # Prefer: wait=N is capped here
_PREFER_WAIT = re.compile(r'^\s*wait\s*=\s*"?(\d+)"?\s*$', re.IGNORECASE)
# A kept response must fit in the record beside everything else.
MAX_KEPT_BODY_BYTES = 256 * 1024
# The most a run's parameters may take as stored JSON (uncompressed): with the
# kept response (at most 512 KiB) and the rest of the record they stay under
# Datastore's 1 MiB, and a reader of the record never gets more than this of them.
MAX_STORED_PARAMETER_BYTES = 256 * 1024


class GuardRejected(Exception):
    """Raised by key, scope and parameter callables: the request is refused with 400 (naming
    ``field``, when one field is at fault, as a member of the problem too)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclasses.dataclass(frozen=True)
class GuardedCall:
    """What a guarded view can read from ``flask.g.idempotency``."""

    key: str
    key_generated: bool
    claim: Attempt

    @property
    def run_id(self) -> str:
        return self.claim.run_id

    @property
    def attempt(self) -> int:
        return self.claim.number

    @property
    def attempt_id(self) -> str:
        return self.claim.attempt_id


def default_key_problem(key: str) -> str | None:
    """The IETF draft leaves the key's form open: 1 to 255 printable ASCII characters."""
    if not 1 <= len(key) <= 255:
        return f"the idempotency key must be 1 to 255 characters long, got {len(key)}"
    if any(not 32 <= ord(ch) <= 126 for ch in key):
        return "the idempotency key may contain only printable ASCII characters"
    return None


def unscoped() -> str:
    """``scope=unscoped``: keys shared by every caller (the documented opt-out of caller scope)."""
    return ""


@dataclasses.dataclass(frozen=True)
class GuardRegistry:
    """What the guard needs of its app, in one place: the ledger its records go to, the
    bound on requests waiting at once (``Prefer: wait``), and who the caller is."""

    ledger: Ledger
    wait_slots: WaitSlots
    # The caller's identity, every guarded key's default scope: two callers who send one key
    # are two requests, and neither is ever served the other's answer (the IETF draft's
    # security considerations).  None: the app has no identity to give; keys are then shared.
    caller: Callable[[], str] | None = None


def install_guard(
    app: Flask, ledger: Ledger, wait_slots: WaitSlots | None = None, caller: Callable[[], str] | None = None
) -> GuardRegistry:
    """Give ``app``'s guarded views their ledger, wait bound and caller identity; call once, in the app factory."""
    registry = GuardRegistry(ledger, wait_slots or WaitSlots(DEFAULT_MAX_WAITERS), caller)
    app.extensions[GUARD_EXTENSION] = registry
    return registry


def guard_registry() -> GuardRegistry:
    registry = current_app.extensions.get(GUARD_EXTENSION)
    if registry is None:
        raise RuntimeError(
            "this app serves @idempotent views but never called handlers.idempotent.install_guard(app, ledger)"
        )
    return registry


@dataclasses.dataclass(frozen=True)
class KeyFrom:
    """Where a request's idempotency key comes from, and what happens without one.

    ``KeyFrom.header()`` (the IETF draft's ``Idempotency-Key``), ``KeyFrom.field(name,
    header=...)`` (a JSON body field, optionally also a header: both given and
    different is 400) or ``KeyFrom.function(f, header=... or field=...)`` (naming where
    ``f`` reads it).  No key: 400 when ``required``, naming the header or field to send; a
    fresh UUID4 with ``generate``, otherwise the view runs unguarded.  A required key that
    names neither is refused when it is declared (ValueError): its 400 could name nothing.
    """

    header_name: str | None = "Idempotency-Key"
    field_name: str | None = None
    from_function: Callable[[], str | None] | None = None
    required: bool = True
    generate: bool = False
    validate: Callable[[str], str | None] = default_key_problem
    # A body field's integer is its decimal string (42 and "42" one key); False: strings only.
    integers: bool = True

    @classmethod
    def header(cls, name: str = "Idempotency-Key", **options: Any) -> KeyFrom:
        return cls(header_name=name, **options)

    @classmethod
    def field(cls, name: str, header: str | None = None, **options: Any) -> KeyFrom:
        return cls(header_name=header, field_name=name, **options)

    @classmethod
    def function(
        cls, key: Callable[[], str | None], header: str | None = None, field: str | None = None, **options: Any
    ) -> KeyFrom:
        """``key()`` reads the key; ``header`` or ``field`` names where, for the 400 a request without one gets."""
        return cls(header_name=header, field_name=field, from_function=key, **options)

    def __post_init__(self) -> None:
        if self.required and not self.generate and not (self.header_name or self.field_name):
            raise ValueError(
                "KeyFrom: a required key names no header or body field, so a request without one "
                "could not be told what to send: give header= or field= (KeyFrom.function(f, header=...))"
            )

    def read(self) -> str | None:
        """The request's key, validated; None when it has none (GuardRejected when it is bad)."""
        token = self.from_function() if self.from_function is not None else self._from_request()
        if token is None:
            return None
        problem = self.validate(token)
        if problem:
            raise GuardRejected(problem)
        return token

    def missing(self) -> GuardRejected:
        """The 400 of a request without a key: it names each place a key may come from."""
        places = [f"the {self.field_name} field"] if self.field_name else []
        places += [f"the {self.header_name} header"] if self.header_name else []
        return GuardRejected(f"{' or '.join(places)} is required for this request", self.field_name or self.header_name)

    def _from_request(self) -> str | None:
        from_field = from_header = None
        if self.field_name:
            payload = json_payload()
            if isinstance(payload, dict) and self.field_name in payload:
                from_field = _field_key(self.field_name, payload[self.field_name], self.integers)
        if self.header_name:
            raw = request.headers.get(self.header_name)
            from_header = None if raw is None else header_key(self.header_name, raw)
        if from_field is not None and from_header is not None and from_field != from_header:
            raise GuardRejected(f"{self.field_name} and the {self.header_name} header are both given and differ")
        return from_field if from_field is not None else from_header


def _field_key(name: str, value: Any, integers: bool) -> str:
    """A body field's key: a string, or (``integers``) an integer as its decimal string (``42``
    and ``"42"`` are one key); anything else is refused, saying what it was."""
    if isinstance(value, str):
        return value
    if integers and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    kind = "a boolean" if isinstance(value, bool) else "null" if value is None else type(value).__name__
    wanted = "a string or an integer" if integers else "a string"
    raise GuardRejected(f"{name} must be {wanted}, not {kind}")


_SF_STRING_CHARS = re.compile(r"[\x20-\x21\x23-\x5b\x5d-\x7e]")


def header_key(name: str, raw: str) -> str:
    """The key of an ``Idempotency-Key`` field, which the IETF draft defines as an RFC 8941
    Item that is a String: ``"abc"`` is the key ``abc`` (``\\"`` and ``\\\\`` unescaped, a
    comma inside legal).  A bare value without quotes is taken as a lenient spelling of the
    same key; a List (the header sent twice, which servers join with commas) is refused."""
    text = raw.strip(" \t")
    if not text.startswith('"'):
        if "," in text:
            raise GuardRejected(
                f"the {name} header holds a comma outside a quoted key: it was sent more than once; send one key"
            )
        return text
    key, index = [], 1
    while index < len(text):
        char = text[index]
        if char == "\\":
            if index + 1 >= len(text) or text[index + 1] not in '"\\':
                raise GuardRejected(f"the {name} header's quoted key may escape only \" and \\")
            key.append(text[index + 1])
            index += 2
        elif char == '"':
            rest = text[index + 1 :].strip(" \t")
            if "," in rest:
                raise GuardRejected(f"the {name} header holds a list of keys: it was sent more than once; send one")
            if rest and not rest.startswith(";"):  # parameters (;name=value) are allowed and ignored
                raise GuardRejected(f"the {name} header's quoted key is followed by {rest[:20]!r}")
            return "".join(key)
        elif _SF_STRING_CHARS.fullmatch(char):
            key.append(char)
            index += 1
        else:
            raise GuardRejected(f"the {name} header's quoted key holds a character a String may not")
    raise GuardRejected(f"the {name} header's quoted key has no closing quote")


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What makes two requests with one key the same request.

    ``Fingerprint.body()`` (the body: a JSON one as canonical JSON, any other by its
    bytes, by SHA-256), ``Fingerprint.fields(*names)``
    (those JSON fields) or ``Fingerprint.of(f)`` (the parameters ``f()`` returns); the
    names in ``exclude`` (or returned by it) are left out.
    """

    field_names: tuple[str, ...] | None = None
    from_function: Callable[[], Mapping[str, Any]] | None = None
    exclude: Collection[str] | Callable[[], Collection[str]] = ()

    @classmethod
    def body(cls) -> Fingerprint:
        return cls()

    @classmethod
    def fields(cls, *names: str, exclude: Collection[str] | Callable[[], Collection[str]] = ()) -> Fingerprint:
        return cls(field_names=names, exclude=exclude)

    @classmethod
    def of(
        cls, parameters: Callable[[], Mapping[str, Any]], exclude: Collection[str] | Callable[[], Collection[str]] = ()
    ) -> Fingerprint:
        return cls(from_function=parameters, exclude=exclude)

    def parameters(self) -> dict:
        """The request's parameters, checked to be fingerprintable and small enough to keep."""
        given = dict(self.from_function()) if self.from_function else _fields_of_request(self.field_names)
        _check_fingerprintable(given)
        return given

    def excluded(self) -> frozenset[str]:
        return frozenset(self.exclude() if callable(self.exclude) else self.exclude)


def idempotent(
    namespace: str,
    *,
    key: KeyFrom = KeyFrom(),
    fingerprint: Fingerprint = Fingerprint(),
    scope: Callable[[], str] | None = None,
    replay_headers: Collection[str] = (),
    policy: RunPolicy | Callable[[], RunPolicy] = DEFAULT_POLICY,
    replayed_status: Mapping[int, int] | None = None,
    source: str = RunSource.GUARD,
    job_id: Callable[[], str] | None = None,
    bad_request_error: str = "InvalidIdempotencyRequest",
    methods: Collection[str] = GUARDED_METHODS,
    keep_validation_errors: bool = False,
    keep_server_errors: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Response]]:
    """Make a Flask view idempotent under a client-supplied key (see KeyFrom and Fingerprint).

    Keys are per caller by default (``install_guard(caller=...)``); ``scope()`` makes
    them per tenant (or per job) instead, and ``scope=unscoped`` shares them between
    every caller.  ``replay_headers`` are kept and
    replayed besides Content-Type and Location; ``replayed_status`` maps a kept
    status to the one a replay answers; ``source`` and ``job_id()`` say what the
    record is of; a refused request is 400 with ``bad_request_error``.  Only ``methods``
    are guarded: GET, HEAD and OPTIONS (safe, idempotent by definition) pass straight through.
    ``keep_validation_errors`` and ``keep_server_errors``: see ``response_verdict``.
    """

    if job_id_problem(namespace):
        raise ValueError(f"idempotent({namespace!r}): the namespace {job_id_problem(namespace)}")

    guarded_methods = frozenset(method.upper() for method in methods)
    classify = response_verdict(keep_validation_errors, keep_server_errors)

    def decorate(view: Callable[..., Any]) -> Callable[..., Response]:
        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Response:
            if request.method not in guarded_methods:
                return make_response(view(*args, **kwargs))
            try:
                token, generated = key.read(), False
                if token is None and not key.generate:
                    if key.required:
                        raise key.missing()
                    return make_response(view(*args, **kwargs))
                if token is None:
                    token, generated = str(uuid.uuid4()), True
                given = fingerprint.parameters()
                skipped = fingerprint.excluded()
                chosen_scope = scope() if scope is not None else _caller_scope()
                chosen_policy = policy() if callable(policy) else policy
                chosen_job = _checked_job_id(job_id()) if job_id else None
            except GuardRejected as exc:
                named: dict[str, Any] = {"field": exc.field} if exc.field else {}
                return problem(400, bad_request_error, exc.message, **named)
            except InvalidJson as exc:
                return problem(400, bad_request_error, exc.message)
            registry = guard_registry()
            wait = Waiting(preferred_wait(), registry.wait_slots)
            live: list[Response] = []  # this request's own response, when it ran the view

            def work(attempt: Attempt) -> dict:
                g.idempotency = GuardedCall(token, generated, attempt)
                live.append(_run_view(view, args, kwargs))
                return _document(live[0], replay_headers)

            guard = IdempotencyGuard(registry.ledger, namespace, chosen_policy, source)
            try:
                outcome = guard.run(
                    token,
                    work,
                    scope=chosen_scope,
                    parameters=given,
                    exclude=skipped,
                    classify=classify,
                    wait=wait,
                    job_id=chosen_job,
                )
            except Exception:  # the ledger's (Datastore): the view's own are answered in _run_view
                return ledger_unavailable()
            note_outcome(outcome)
            response = guarded_response(outcome, live, given, skipped, replayed_status or {})
            response.headers["Idempotency-Key"] = token
            if wait.waited and not live:
                # Only when it did wait: beyond the bound the answer is the immediate 409.
                response.headers["Preference-Applied"] = f"wait={wait.seconds}"
            return response

        return guarded

    return decorate


def ledger_unavailable() -> Response:
    """The guard's answer when its records cannot be read or written: the documented JSON 500
    with Retry-After, whatever error pages the host app registers, and never a 503 (App Engine
    targets retry 503 outside their retry count).  A view that ran keeps its claim's lease, so
    the retry is held off (409) until that lease ends, not run beside it."""
    log.exception("the idempotency guard could not reach its ledger")
    response = problem(
        500,
        "InternalError",
        "the idempotency record could not be read or written (Datastore unavailable); "
        "retry the same request with the same key",
    )
    response.headers["Retry-After"] = "1"
    return response


def _caller_scope() -> str:
    caller = guard_registry().caller
    return f"caller:{caller()}" if caller is not None else ""


def job_id_problem(value: Any) -> str | None:
    """What a record's job id (a guard's namespace, or its ``job_id()``) may be: what readers
    are sent and what Datastore indexes, so 1 to 100 printable ASCII characters."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_JOB_ID_CHARS:
        return f"must be a string of 1 to {MAX_JOB_ID_CHARS} characters"
    if any(not 33 <= ord(char) <= 126 for char in value):
        return "may contain only printable ASCII characters without spaces"
    return None


def _checked_job_id(value: Any) -> str:
    problem = job_id_problem(value)
    if problem:
        raise GuardRejected(f"the job this request names {problem}")
    return value


def _check_fingerprintable(given: Mapping[str, Any]) -> None:
    """Fingerprintable, and small enough to be stored beside the largest result.

    Measured as NDB stores a JsonProperty before compressing it (compact ASCII
    JSON), which is also what every reader of the record decodes and sends:
    repetitive parameters that compress to nothing would still cost a reader
    their whole size.  The record holds the parameters and the kept response
    in one entity (1 MiB), so this also keeps a completion from overflowing it.
    """
    try:
        canonical_json(given).encode("utf-8")
        stored = len(json.dumps(given, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError, UnicodeError):
        raise GuardRejected("the request's parameters cannot be fingerprinted as JSON") from None
    if stored > MAX_STORED_PARAMETER_BYTES:
        raise GuardRejected(
            f"the request's parameters take {stored} bytes as stored (JSON, non-ASCII characters "
            f"escaped); at most {MAX_STORED_PARAMETER_BYTES} are kept with a run"
        )


def _fields_of_request(fields: Collection[str] | None) -> dict:
    if fields is None:
        return _body_fingerprint(request.get_data(cache=True))
    payload = json_payload()
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise GuardRejected("the request body must be a JSON object")
    return {name: payload.get(name) for name in fields}


def _body_fingerprint(raw: bytes) -> dict[str, str]:
    """A JSON body by its canonical JSON (sorted keys, no whitespace: what Powertools and
    idempot-js compare), so a retry another client library or a proxy re-spelled is the same
    request; any other body (or one that is not strict JSON) by its bytes."""
    if request.is_json and raw.strip():
        try:
            value = strict_json(raw, "the request body")
        except InvalidJson:
            pass
        else:
            return {"body_json_sha256": hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()}
    return {"body_sha256": hashlib.sha256(raw).hexdigest()}


def preferred_wait() -> int:
    """``Prefer: wait=N`` (RFC 7240, N may be quoted), capped at MAX_WAIT_SECONDS; 0 when absent."""
    for header in request.headers.getlist("Prefer"):
        for preference in header.split(","):
            match = _PREFER_WAIT.match(preference.split(";")[0])
            if match:
                return min(int(match.group(1)[:9]), MAX_WAIT_SECONDS)
    return 0


def _run_view(view: Callable[..., Any], args: tuple, kwargs: dict) -> Response:
    try:
        return make_response(view(*args, **kwargs))
    except HTTPException as exc:
        return make_response(current_app.handle_http_exception(exc))
    except Exception as exc:  # answered 500 and not kept, so a retry runs again
        log.exception("guarded view failed: %r", exc)
        return problem(500, "InternalError", f"{type(exc).__name__}: the request failed; retry it")


def _document(response: Response, replay_headers: Collection[str]) -> dict:
    """What is kept of a response: status, chosen headers, the body (base64 when not UTF-8).

    A body too large to keep is replaced by a note, so replays still say the
    request took effect (the first caller got the whole body).
    """
    kept = {"Content-Type": response.headers.get("Content-Type", "application/octet-stream")}
    for name in ("Location", *replay_headers):
        if name in response.headers:
            kept[name] = response.headers[name]
    response.direct_passthrough = False  # send_file and friends: read the body once, here
    body = response.get_data()
    document = StoredResponse.from_body(response.status_code, body, kept).document()
    # Measured as stored too: escaped as JSON, non-ASCII text can grow sixfold.
    if len(body) > MAX_KEPT_BODY_BYTES or storable_json_problem(document):
        kept["Content-Type"] = "application/json"
        body = json.dumps(
            {
                "error": "ResponseNotKept",
                "message": f"the original response ({len(body)} bytes) was too large to keep; the request took effect",
            }
        ).encode()
        document = StoredResponse.from_body(response.status_code, body, kept).document()
    return document
