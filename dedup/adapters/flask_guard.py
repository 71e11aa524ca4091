"""The idempotency guard as a Flask decorator, for any mutating endpoint.

    @app.post("/payments")
    @idempotent("payments", fingerprint=Fingerprint.fields("amount", "currency"), scope=current_tenant)
    def create_payment(): ...

Part of the library (the ``[flask]`` extra): the app's run API and any Flask app of one's own
guard their endpoints with it alike.  A first request runs the view and its response (status,
body, chosen headers) is kept; a retry with the same key and fields gets that response
again with ``Idempotent-Replayed: true``; a retry while the first is running
gets 409 (or waits, with ``Prefer: wait=N``); the same key with other fields
gets 422.  Answers a retry may cure (408, 409, 425, 429, 5xx, exceptions)
are not kept.  The app must give each request an NDB context (the app's
handlers.NdbContextMiddleware, or ``with client.context()`` around its WSGI app).
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
from typing import Any, assert_never

try:
    from flask import Flask, Response, current_app, g, has_request_context, make_response, request
    from werkzeug.exceptions import HTTPException
except ImportError as missing:  # the core installs without it
    raise ImportError(
        "dedup.adapters.flask_guard needs Flask: pip install 'cloud-scheduler-dedup[flask]'", name=missing.name
    ) from missing

from dedup.adapters.flask_json import InvalidJson, json_payload, strict_json
from dedup.answers import answer, outcome_rule, replayed_headers
from dedup.idempotency import (
    DEFAULT_POLICY,
    IdempotencyGuard,
    canonical_json,
    differing_names,
)
from dedup.keys import format_utc
from dedup.ledger import Ledger, RunPolicy
from dedup.outcomes import (
    Attempt,
    Conflict,
    Contended,
    Finished,
    InProgress,
    JobMismatch,
    Overlap,
    Released,
    Replayed,
    RunOutcome,
    Skipped,
    Stale,
)
from dedup.problems import MEDIA_TYPE, RUN_TYPES_BY_ERROR, ProblemType, problem_document
from dedup.run_record import MAX_JOB_ID_CHARS, RunRecord, RunSource
from dedup.runner import DEFAULT_MAX_WAITERS, Waiting, WaitSlots, storable_json_problem
from dedup.stored_response import StoredResponse, response_verdict

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
    # Told every outcome, for the request's log line (the app names it there); None: nothing.
    on_outcome: Callable[[RunOutcome], None] | None = None
    # The problem types an answer may name, by code: the library's, and the host app's own.
    problem_types: Mapping[str, ProblemType] = dataclasses.field(default_factory=lambda: RUN_TYPES_BY_ERROR)


def install_guard(
    app: Flask,
    ledger: Ledger,
    wait_slots: WaitSlots | None = None,
    caller: Callable[[], str] | None = None,
    on_outcome: Callable[[RunOutcome], None] | None = None,
    problem_types: Mapping[str, ProblemType] | None = None,
) -> GuardRegistry:
    """Give ``app``'s guarded views their ledger, wait bound and caller identity (and, for a host
    app, where outcomes are told and its own problem types); call once, in the app factory."""
    types = {**RUN_TYPES_BY_ERROR, **(problem_types or {})}  # the library's, and the host app's own
    registry = GuardRegistry(ledger, wait_slots or WaitSlots(DEFAULT_MAX_WAITERS), caller, on_outcome, types)
    app.extensions[GUARD_EXTENSION] = registry
    return registry


def guard_registry() -> GuardRegistry:
    registry = current_app.extensions.get(GUARD_EXTENSION)
    if not isinstance(registry, GuardRegistry):
        raise RuntimeError(
            "this app serves @idempotent views but never called dedup.adapters.flask_guard.install_guard(app, ledger)"
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

    def parameters(self) -> dict[str, Any]:
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

            def work(attempt: Attempt) -> dict[str, Any]:
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
            if registry.on_outcome is not None:
                registry.on_outcome(outcome)
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
    wrong = job_id_problem(value)
    if wrong:
        raise GuardRejected(f"the job this request names {wrong}")
    return str(value)


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


def _fields_of_request(fields: Collection[str] | None) -> dict[str, Any]:
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


def _run_view(view: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Response:
    try:
        return make_response(view(*args, **kwargs))
    except HTTPException as exc:
        return make_response(current_app.handle_http_exception(exc))
    except Exception as exc:  # answered 500 and not kept, so a retry runs again
        log.exception("guarded view failed: %r", exc)
        return problem(500, "InternalError", f"{type(exc).__name__}: the request failed; retry it")


def _document(response: Response, replay_headers: Collection[str]) -> dict[str, Any]:
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


def problem(
    http_status: int,
    error: str,
    detail: str,
    /,
    *,
    types: Mapping[str, ProblemType] | None = None,
    retryable: bool | None = None,
    **extra: Any,
) -> Response:
    """A problem (RFC 9457) for one error: ``error`` its code, of ``types`` (by default the guard's
    registry's, else the library's; about:blank for another code), ``detail`` what happened."""
    if types is None:
        registry = current_app.extensions.get(GUARD_EXTENSION) if has_request_context() else None
        types = registry.problem_types if isinstance(registry, GuardRegistry) else RUN_TYPES_BY_ERROR
    at = request.path if has_request_context() else None  # the path: its query may hold secrets
    document = problem_document(http_status, error, detail, types=types, retryable=retryable, at=at, **extra)
    # The standard library's JSON: members in the RFC's order, whatever the host app's provider sorts.
    return Response(json.dumps(document), status=http_status, mimetype=MEDIA_TYPE)


EXPIRES_HEADER = "Idempotency-Expires"


def run_answer(outcome: RunOutcome, client: bool = False, **added: Any) -> Response:
    """The library's answer of an outcome (dedup.answers.answer: the run's document for a record
    the table answers with, and what a surface ``added`` to it, else its problem), as Flask sends
    it.  ``client``: asked by a client under its own token (a manual run, a guarded call)."""
    said = answer(outcome, client, at=request.path if has_request_context() else None, **added)
    return Response(said.body(), status=said.status, headers=said.headers, mimetype=said.media_type)


def kept_answer(outcome: Finished | Replayed, replayed_status: Mapping[int, int]) -> Response:
    """A guarded call's record row: the HTTP response it kept, rebuilt; a replay's status as the
    guard's ``replayed_status`` maps it (``{201: 200}``: a retry of a create is told 200)."""
    stored = outcome.record.kept
    if not StoredResponse.is_document(stored):  # not written by a guard: never expected
        return problem(500, "InternalError", "this key's record holds no response")
    kept = StoredResponse.from_document(stored)
    status = replayed_status.get(kept.status, kept.status) if isinstance(outcome, Replayed) else kept.status
    response = Response(kept.body_bytes(), status=status, headers=dict(kept.headers))
    response.headers.update(replayed_headers(outcome))
    return response


def guarded_response(
    outcome: RunOutcome,
    live: list[Response],
    given: Mapping[str, Any],
    exclude: Collection[str],
    replayed_status: Mapping[int, int],
) -> Response:
    """A guarded view's answer: its own response (``live``) when this request ran it, else
    the kept one replayed, or why not (422 other parameters, 409 in progress, ...).

    Every answer about an existing record carries its expiry (``Idempotency-Expires``).
    """
    match outcome:
        case Finished() if live:
            return with_expiry(live[0], outcome.record)  # the view's own response, untouched
        case Finished() | Replayed():
            return with_expiry(kept_answer(outcome, replayed_status), outcome.record)
        case Conflict():
            record = outcome.record
            differing = differing_names(record.parameters, given, exclude)
            rule = outcome_rule(outcome, client=True)
            assert rule.error is not None  # a conflict is a problem
            response = problem(
                rule.status,
                rule.error,
                "this idempotency key was already used with different parameters"
                + (f": {', '.join(differing)}" if differing else "")
                + "; use a new key for a different request",
                run_id=record.run_id,
                differing=differing,
            )
            return with_expiry(response, record)
        case JobMismatch():
            return run_answer(outcome, client=True)
        case Released() if live:
            return live[0]  # a retryable answer, not kept: the key is free again
        case Released():  # the guard's own work failed before the view answered: never expected
            return run_answer(outcome, client=True)
        case InProgress() | Contended() | Overlap() | Stale():
            response = run_answer(outcome, client=True)
            return with_expiry(response, outcome.record) if outcome.record is not None else response
        case Skipped():
            raise TypeError("a guarded call is never skipped: only a late scheduled delivery is")
        case _ as unreachable:
            assert_never(unreachable)


def with_expiry(response: Response, record: RunRecord) -> Response:
    """``response`` with the key's expiry, as every answer about a record carries it."""
    response.headers[EXPIRES_HEADER] = format_utc(record.expire_at)
    return response
