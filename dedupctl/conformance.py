"""A runnable conformance suite for an endpoint guarded by idempotency keys: real requests, judged.

``run_suite(base_url, path, options)`` sends each rule's requests to ``base_url + path`` (a POST
endpoint that takes a JSON body and an ``Idempotency-Key``) and judges the answers;
``format_table(results)`` prints them with the source of each rule; ``dedupctl conformance``
runs both.  Every rule makes its own fresh keys (``Options.key_prefix``, a UUID4 per run), so a
rerun against the same service never meets an earlier run's keys.

The rules follow draft-ietf-httpapi-idempotency-key-header-09 (2026-11-21), the latest listed,
with the conventions clients are taught beside it: Stripe's (the replay marker, 255-character
keys, validation errors not saved, keys on GET ignored), Powertools' (JSON compared
canonically) and Amazon ECS's client tokens (a new token is a new request).

Section numbers.  The -09 text was not available here.  §2 and its subsections (§2.1 Syntax,
§2.2 Uniqueness, §2.3 Validity and Expiry, §2.4 Fingerprint, §2.5 Responsibilities, §2.6
Enforcement, §2.7 Error Handling, titled "Error Scenarios" up to -05) were checked against the
working group's source of -06 (2025-02-26), and their headings have been stable since -01; they
are cited as "draft-09 §2.x" on that basis.  The security considerations are section 5 of -06
(after IANA Considerations and Implementation Status, which the RFC Editor removes); that number
could not be checked for -09, so the rule cites the section by name.  §2.5 holds no rule: what
it asks of a server (publish the key's specification) is documentation, not an answer.

Decisions, each a rule's verdict where the sources leave room:

- Keys are sent as the draft's Structured Field String (``Idempotency-Key: "k"``).  A service
  that reads the field as opaque text still passes: ``"k"`` is then consistently the key ``"k"``.
- ``key-bare-token``: the guard also takes a bare ``k`` as the key of ``"k"`` (lenient).  The draft
  does not ask for it, so a service that refuses the bare token (400) or takes it as another
  key is "n/a", not a failure; it fails only on an answer no reading of the draft allows (a
  5xx, a 409 or 422, a replay of another answer).
- ``expiry-published``: §2.3 asks that the expiry policy be published in the documentation,
  not in a header, so a missing ``Idempotency-Expires`` (this project's header) is "n/a"; when
  present it must be a time (RFC 3339, or an HTTP date) after the answer's ``Date``.
- ``concurrent-409``: whether a 409 is seen depends on timing.  It passes when exactly one
  answer ran the request and every other is a 409 or a replay of that answer; seeing no 409
  is reported, not failed (the endpoint was too fast to catch in flight).
- ``problem-details``: RFC 9457 makes every member optional; the suite asks, as the draft's
  example does, for a string ``type`` and ``title`` in ``application/problem+json``, and a
  ``status``, when there is one, equal to the HTTP status.  With no error answer to judge it is
  "n/a".
- Replays are recognised by Stripe's ``Idempotent-Replayed: true`` (the draft defines no
  marker): from outside, a replay and a second run that answers alike look the same.  So a
  service that follows the draft but sends no marker fails ``retry-replays`` and
  ``concurrent-409``, and ``new-key-new-request``, ``caller-scope`` and ``get-no-effect`` can
  only catch a wrongful replay that is marked.
- ``key-list-400`` with ``--key-optional``: a field that does not parse is ignored (RFC 8941),
  so an unguarded 2xx is "n/a", not a failure.
- ``key-255``: a key of 255 characters is sent as an sf-string; if that is refused (400), as a
  bare token, since a service reading the field as opaque text counts the quotes (257).
- ``caller-scope``: another caller's request under the same key and body must run as its own
  (2xx, not replayed); a 409 or 422 says the key was shared between callers, which fails too.
- ``json-respelled``: the draft leaves the fingerprint open (§2.4, MAY); the suite follows
  Powertools, so a service comparing raw bytes fails this one rule.
- Bodies are compared as JSON when both are JSON, otherwise byte for byte.

A rule's verdict depends on the answers only: each can fail (tests/test_conformance.py serves a
service with each flaw and checks that its rule fails).  Needs requests alone.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import enum
import http.client
import json
import textwrap
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests
from requests.structures import CaseInsensitiveDict

DRAFT = "draft-ietf-httpapi-idempotency-key-header-09"
DRAFT_DATE = "2026-11-21"
DRAFT_SHORT = "draft-09"
KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"  # Stripe's
EXPIRES_HEADER = "Idempotency-Expires"  # this project's
PROBLEM_MEDIA_TYPE = "application/problem+json"
STRIPE_MAX_KEY_CHARS = 255
SAFE_METHOD_NA = (404, 405, 501)  # no GET at this path: the GET rule does not apply


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "n/a"


@dataclasses.dataclass(frozen=True)
class Options:
    """What the suite sends.  ``body``: a JSON value the endpoint accepts (2xx);
    ``other_body``: one it also accepts but that differs in what the fingerprint covers
    (None: ``body`` with its first string changed); ``invalid_body``: JSON text it refuses with
    400 or 422 (None: that rule is n/a); ``caller_a``/``caller_b``: headers saying who calls
    (``caller_b`` None: the caller rule is n/a); ``key_required``: False makes the
    missing-key rule n/a; ``key_prefix``: unique per run, so reruns never collide."""

    body: Any = dataclasses.field(default_factory=lambda: {"item": "conformance"})
    other_body: Any = None
    invalid_body: str | None = None
    caller_a: Mapping[str, str] = dataclasses.field(default_factory=dict)
    caller_b: Mapping[str, str] | None = None
    key_required: bool = True
    timeout: float = 30.0
    concurrency: int = 8
    key_prefix: str = dataclasses.field(default_factory=lambda: f"conformance-{uuid.uuid4()}")


@dataclasses.dataclass(frozen=True)
class Answer:
    """What one request got back, read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def replayed(self) -> bool:
        return self.headers.get(REPLAYED_HEADER, "").strip().lower() == "true"

    def brief(self) -> str:
        """``201``, ``201 (replayed)``, or an error status with the start of its body."""
        text = f"{self.status}{' (replayed)' if self.replayed else ''}"
        if not self.ok:
            snippet = self.body[:100].decode("utf-8", "replace").replace("\n", " ").strip()
            text += f" {snippet}" if snippet else ""
        return text


@dataclasses.dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    detail: str


def passed(detail: str) -> Judgement:
    return Judgement(Verdict.PASS, detail)


def failed(detail: str) -> Judgement:
    return Judgement(Verdict.FAIL, detail)


def not_applicable(detail: str) -> Judgement:
    return Judgement(Verdict.NOT_APPLICABLE, detail)


class Probe:
    """The requests the rules send to one endpoint, each under a key of its own."""

    def __init__(self, base_url: str, path: str, options: Options) -> None:
        self.url = f"{base_url.rstrip('/')}/{path.lstrip('/')}"
        self.options = options
        self.session = requests.Session()
        self._counter = 0
        self._lock = threading.Lock()

    def key(self, label: str) -> str:
        with self._lock:
            self._counter += 1
            return f"{self.options.key_prefix}-{label}-{self._counter}"

    def post(
        self,
        body: str,
        key: str | None,
        *,
        spelled: str | None = None,
        caller: Mapping[str, str] | None = None,
        session: requests.Session | None = None,
    ) -> Answer:
        """POST ``body`` (JSON text) with ``key`` as a String (or the header ``spelled`` as given)."""
        headers = {**(self.options.caller_a if caller is None else caller), "Content-Type": "application/json"}
        if spelled is not None:
            headers[KEY_HEADER] = spelled
        elif key is not None:
            headers[KEY_HEADER] = sf_string(key)
        return self._send("POST", body.encode("utf-8"), headers, session)

    def get(self, key: str | None) -> Answer:
        headers = dict(self.options.caller_a)
        if key is not None:
            headers[KEY_HEADER] = sf_string(key)
        return self._send("GET", None, headers, None)

    def _send(
        self, method: str, body: bytes | None, headers: Mapping[str, str], session: requests.Session | None
    ) -> Answer:
        # No redirects: a POST turned into a GET (a sign-in page, http -> https) is not an answer.
        response = (session or self.session).request(
            method, self.url, data=body, headers=dict(headers), timeout=self.options.timeout, allow_redirects=False
        )
        return Answer(response.status_code, response.headers, response.content)

    def post_with_fields(self, body: str, fields: Sequence[tuple[str, str]]) -> Answer:
        """A POST with header lines as given, repeated names included (requests folds them)."""
        parts = urllib.parse.urlsplit(self.url)
        connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = connection_class(parts.netloc, timeout=self.options.timeout)
        try:
            connection.putrequest("POST", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")))
            payload = body.encode("utf-8")
            lines = [*self.options.caller_a.items(), ("Content-Type", "application/json"), *fields]
            for name, value in [*lines, ("Content-Length", str(len(payload)))]:
                connection.putheader(name, value)
            connection.endheaders(payload)
            response = connection.getresponse()
            content = response.read()
            return Answer(response.status, CaseInsensitiveDict(response.getheaders()), content)
        finally:
            connection.close()

    # The bodies the rules send.

    def body(self) -> str:
        return json.dumps(self.options.body, ensure_ascii=False, separators=(",", ":"))

    def respelled_body(self) -> str:
        """The same JSON value spelled otherwise: members in reverse order, other whitespace, non-ASCII escaped."""
        return "\n " + json.dumps(_reversed_members(self.options.body), indent=2, ensure_ascii=True) + "\n"

    def other_body(self) -> str:
        other = self.options.other_body if self.options.other_body is not None else _changed(self.options.body)
        return json.dumps(other, ensure_ascii=False, separators=(",", ":"))


def sf_string(key: str) -> str:
    """``key`` as an RFC 8941 String (sf-string): quoted, with ``"`` and ``\\`` escaped."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _reversed_members(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: _reversed_members(value[name]) for name in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_members(item) for item in value]
    return value


def _changed(value: Any) -> Any:
    """Another request: the first string changed (else the first integer), else a member added."""
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, int) and not isinstance(value, bool):
        return value + 1
    if isinstance(value, dict):
        for name, member in value.items():
            if isinstance(member, str) or (isinstance(member, int) and not isinstance(member, bool)):
                return {**value, name: _changed(member)}
        return {**value, "conformance": "other"}
    if isinstance(value, list):
        return [*value, "other"]
    return {"conformance": "other"}


def same_body(first: bytes, second: bytes) -> bool:
    """Equal as JSON when both are JSON (a replay may be re-serialized), else byte for byte."""
    try:
        return json.loads(first) == json.loads(second)
    except ValueError:
        return first == second


def same_answer(first: Answer, second: Answer) -> bool:
    return first.status == second.status and same_body(first.body, second.body)


def _first_success(probe: Probe, key: str) -> Answer | Judgement:
    """The first request under a fresh key: its answer, or the rule's failure when it was no success."""
    answer = probe.post(probe.body(), key)
    if not answer.ok:
        return failed(f"a first request with a fresh key was answered {answer.brief()}, not 2xx")
    if answer.replayed:
        return failed(f"a first request with a fresh key was marked {REPLAYED_HEADER}")
    return answer


# The rules.  Each sends its requests and judges what came back.


def check_retry_replays(probe: Probe) -> Judgement:
    key = probe.key("retry")
    first = _first_success(probe, key)
    if isinstance(first, Judgement):
        return first
    retry = probe.post(probe.body(), key)
    if not retry.replayed:
        effect = " and another body: a second effect" if not same_body(first.body, retry.body) else ""
        return failed(f"the retry was answered {retry.brief()}{effect}, without {REPLAYED_HEADER}: true")
    if not same_answer(first, retry):
        return failed(
            f"the retry was marked replayed but answered {retry.status} with another body than {first.status}"
        )
    return passed(f"{first.status}, then {retry.status} with the same body and {REPLAYED_HEADER}: true")


def check_new_key(probe: Probe) -> Judgement:
    first = _first_success(probe, probe.key("first"))
    if isinstance(first, Judgement):
        return first
    second = probe.post(probe.body(), probe.key("second"))
    if second.replayed or not second.ok:
        return failed(f"the same body under a new key was answered {second.brief()}: not run as a new request")
    return passed(f"the same body under two keys: {first.status}, then {second.status}, not replayed")


def check_key_sf_string(probe: Probe) -> Judgement:
    key = probe.key("string")
    answer = probe.post(probe.body(), key)
    if not answer.ok:
        return failed(f"a quoted key (an sf-string) was answered {answer.brief()}")
    if answer.replayed:
        return failed(f"a fresh key's first answer was marked {REPLAYED_HEADER}")
    return passed(f"a quoted key (an sf-string) was accepted: {answer.status}")


def check_key_bare_token(probe: Probe) -> Judgement:
    key = probe.key("bare")
    first = _first_success(probe, key)
    if isinstance(first, Judgement):
        return first
    bare = probe.post(probe.body(), None, spelled=key)
    if bare.replayed and same_answer(first, bare):
        return passed(f'"k" then bare k: replayed ({bare.status}), one key (a lenient extension)')
    if bare.replayed:
        return failed(f"the bare token was answered {bare.status} marked replayed, with another body than the first")
    if bare.status == 400:
        return not_applicable("info: the bare token is refused (400): the strict reading of an sf-string")
    if bare.ok:
        return not_applicable(f"info: the bare token is another key ({bare.status}, not replayed): opaque keys")
    return failed(f"the bare token was answered {bare.brief()}: neither the same key, another one, nor refused")


def check_key_list(probe: Probe) -> Judgement:
    first, second = probe.key("list-a"), probe.key("list-b")
    answer = probe.post_with_fields(probe.body(), [(KEY_HEADER, sf_string(first)), (KEY_HEADER, sf_string(second))])
    if answer.status == 400:
        return passed(f"{KEY_HEADER} sent twice (a List, not an Item) was refused: 400")
    if not probe.options.key_required and answer.ok and not answer.replayed:
        # RFC 8941: a field that does not parse is ignored, so an optional key means an unguarded run.
        return not_applicable(f"info: {KEY_HEADER} sent twice was ignored ({answer.status}); the key is optional")
    return failed(f"{KEY_HEADER} sent twice was answered {answer.brief()}, not 400")


def _long_key(probe: Probe) -> str:
    key = probe.key("long")
    return (key + "x" * STRIPE_MAX_KEY_CHARS)[:STRIPE_MAX_KEY_CHARS]


def check_key_255(probe: Probe) -> Judgement:
    answer = probe.post(probe.body(), _long_key(probe))
    if answer.ok and not answer.replayed:
        return passed(f"a {STRIPE_MAX_KEY_CHARS}-character key (an sf-string) was accepted: {answer.status}")
    if answer.status != 400:
        return failed(f"a {STRIPE_MAX_KEY_CHARS}-character key was answered {answer.brief()}")
    # A service that takes the field's text as the key counts the quotes: 257 characters.
    bare = probe.post(probe.body(), None, spelled=_long_key(probe))
    if bare.ok and not bare.replayed:
        return passed(f"{STRIPE_MAX_KEY_CHARS} characters accepted as a bare token ({bare.status}); quoted, 400")
    return failed(f"a {STRIPE_MAX_KEY_CHARS}-character key was answered {answer.brief()}, and bare {bare.brief()}")


def check_missing_key(probe: Probe) -> Judgement:
    if not probe.options.key_required:
        return not_applicable("the key is optional at this endpoint (--key-optional)")
    answer = probe.post(probe.body(), None)
    if answer.status == 400:
        return passed("no key: 400")
    if answer.ok:
        return failed(f"no key was answered {answer.status}: the request ran unguarded")
    return failed(f"no key was answered {answer.brief()}, not 400")


def check_conflict(probe: Probe) -> Judgement:
    key = probe.key("conflict")
    first = _first_success(probe, key)
    if isinstance(first, Judgement):
        return first
    other = probe.post(probe.other_body(), key)
    if other.status == 422:
        return passed("the same key with another body: 422")
    if other.replayed:
        return failed(f"another body under a used key was served the first answer ({other.status}, replayed)")
    if other.ok:
        return failed(f"another body under a used key ran again: {other.status}")
    return failed(f"another body under a used key was answered {other.brief()}, not 422")


def check_respelled(probe: Probe) -> Judgement:
    key = probe.key("respelled")
    first = _first_success(probe, key)
    if isinstance(first, Judgement):
        return first
    respelled = probe.post(probe.respelled_body(), key)
    if respelled.replayed and same_answer(first, respelled):
        return passed(f"the JSON re-spelled (member order, whitespace) was replayed: {respelled.status}")
    if respelled.status == 422:
        return failed("the JSON re-spelled was answered 422: the body is compared byte for byte, not as JSON")
    return failed(f"the JSON re-spelled under the same key was answered {respelled.brief()}, not the replay")


def problem_details_issue(answer: Answer) -> str | None:
    """What keeps an error answer from being RFC 9457 problem details; None when it is one."""
    media_type = answer.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if media_type != PROBLEM_MEDIA_TYPE:
        return f"Content-Type {media_type or 'none'}, not {PROBLEM_MEDIA_TYPE}"
    try:
        document = json.loads(answer.body)
    except ValueError:
        return "a body that is not JSON"
    if not isinstance(document, dict):
        return "a JSON body that is not an object"
    missing = [name for name in ("type", "title") if not isinstance(document.get(name), str)]
    if missing:
        return f"no string {' or '.join(missing)}"
    # RFC 9457 makes status optional (the draft's own example has none); when given, it is the status.
    status = document.get("status")
    if status is None:
        return None
    if isinstance(status, bool) or not isinstance(status, int):
        return f"status {status!r} is not a number"
    if status != answer.status:
        return f"status {status} in the body, {answer.status} on the response"
    return None


def check_problem_details(probe: Probe) -> Judgement:
    answers: list[tuple[str, Answer]] = []
    if probe.options.key_required:
        answers.append(("no key", probe.post(probe.body(), None)))
    key = probe.key("problem")
    first = probe.post(probe.body(), key)
    if first.ok:
        answers.append(("another body", probe.post(probe.other_body(), key)))
    errors = [(what, answer) for what, answer in answers if 400 <= answer.status < 500]
    if not errors:
        return not_applicable("no error answer to judge (the 400 and 422 rules say why)")
    issues = [
        f"{what} ({answer.status}): {issue}" for what, answer in errors if (issue := problem_details_issue(answer))
    ]
    if issues:
        return failed("; ".join(issues))
    return passed(f"{', '.join(str(answer.status) for _, answer in errors)}: problem details with type, title, status")


def check_concurrent(probe: Probe) -> Judgement:
    key = probe.key("concurrent")
    count = max(2, probe.options.concurrency)
    start = threading.Barrier(count)
    answers: list[Answer | None] = [None] * count
    errors: list[str] = []

    def send(index: int) -> None:
        with requests.Session() as session:
            try:
                start.wait(timeout=probe.options.timeout)
                answers[index] = probe.post(probe.body(), key, session=session)
            except (requests.RequestException, threading.BrokenBarrierError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=send, args=(index,), daemon=True) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(probe.options.timeout * 2)
    got = [answer for answer in answers if answer is not None]
    if errors or len(got) != count:
        return failed(f"{count - len(got)} of {count} requests got no answer: {'; '.join(errors)[:200]}")
    originals = [answer for answer in got if answer.ok and not answer.replayed]
    if len(originals) != 1:
        statuses = ", ".join(answer.brief()[:40] for answer in got)
        return failed(f"{len(originals)} of {count} same-key requests ran (want 1): {statuses}")
    original = originals[0]
    conflicts, replays, odd = [], [], []
    for answer in got:
        if answer is original:
            continue
        if answer.status == 409:
            conflicts.append(answer)
        elif answer.replayed and same_answer(original, answer):
            replays.append(answer)
        else:
            odd.append(answer)
    if odd:
        listed = ", ".join(answer.brief()[:40] for answer in odd)
        return failed(f"beside the one that ran, answers neither 409 nor its replay: {listed}")
    if not conflicts:
        return passed(f"{count} at once: 1 ran, {len(replays)} replays, no 409 seen (too fast to catch in flight)")
    return passed(f"{count} at once: 1 ran, {len(conflicts)} got 409, {len(replays)} replays")


def check_validation_not_kept(probe: Probe) -> Judgement:
    if probe.options.invalid_body is None:
        return not_applicable("no invalid body given (--invalid-body)")
    key = probe.key("invalid")
    refused = probe.post(probe.options.invalid_body, key)
    if refused.status not in (400, 422):
        return failed(f"the invalid body was answered {refused.brief()}, not 400 or 422")
    corrected = probe.post(probe.body(), key)
    if corrected.ok and not corrected.replayed:
        return passed(f"{refused.status}, then the corrected request under the same key ran: {corrected.status}")
    return failed(f"after a {refused.status}, the corrected request under the same key got {corrected.brief()}")


def check_get_no_effect(probe: Probe) -> Judgement:
    baseline = probe.get(None)
    if baseline.status in SAFE_METHOD_NA:
        return not_applicable(f"GET is answered {baseline.status} here")
    key = probe.key("get")
    first, second = probe.get(key), probe.get(key)
    odd = [answer for answer in (first, second) if answer.replayed or answer.status != baseline.status]
    if odd:
        return failed(f"GET without a key {baseline.status}; with one: {first.brief()}, then {second.brief()}")
    return passed(f"GET with a key twice: {first.status}, {second.status}, as without one; neither replayed")


def check_caller_scope(probe: Probe) -> Judgement:
    if probe.options.caller_b is None:
        return not_applicable("no second caller given (--caller-b)")
    key = probe.key("caller")
    first = _first_success(probe, key)
    if isinstance(first, Judgement):
        return first
    other = probe.post(probe.body(), key, caller=probe.options.caller_b)
    if other.replayed:
        return failed(f"caller B, sending caller A's key and body, was served A's answer ({other.status}, replayed)")
    if other.status in (409, 422):
        return failed(f"caller B's request under A's key was answered {other.brief()}: the key is shared")
    if not other.ok:
        return failed(f"caller B's request was answered {other.brief()}: give caller B headers it may call with")
    return passed(f"caller B under caller A's key and body ran its own request: {other.status}, not replayed")


def parse_time(value: str) -> datetime.datetime | None:
    """RFC 3339 (``...Z``) or an HTTP date, as an aware datetime; None when it is neither."""
    text = value.strip()
    try:
        moment = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "Zz" else text)
    except ValueError:
        try:
            moment = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
    return moment if moment.tzinfo is not None else None


def check_expiry(probe: Probe) -> Judgement:
    key = probe.key("expiry")
    first = _first_success(probe, key)
    if isinstance(first, Judgement):
        return first
    answer = first if EXPIRES_HEADER in first.headers else probe.post(probe.body(), key)
    value = answer.headers.get(EXPIRES_HEADER)
    if value is None:
        return not_applicable(f"info: no {EXPIRES_HEADER} header; the draft asks for the policy in the documentation")
    expires = parse_time(value)
    if expires is None:
        return failed(f"{EXPIRES_HEADER}: {value[:40]} is not a time (RFC 3339 or an HTTP date)")
    answered = parse_time(answer.headers.get("Date", "")) or datetime.datetime.now(datetime.UTC)
    hours = (expires - answered).total_seconds() / 3600
    if hours <= 0:
        return failed(f"{EXPIRES_HEADER}: {value} is not after the answer ({answered.isoformat()})")
    note = "" if hours >= 23.9 else ", less than Stripe's 24 h"
    return passed(f"{EXPIRES_HEADER}: {value}, {hours:.1f} h after the answer{note}")


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    checks: str  # what it checks, in one line
    source: str  # where the rule comes from
    check: Callable[[Probe], Judgement] = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Result:
    rule: Rule
    verdict: Verdict
    detail: str


D = DRAFT_SHORT
RULES: tuple[Rule, ...] = (
    Rule(
        "retry-replays",
        "a retry gets the same status and body, marked replayed",
        f"{D} §2.6; Stripe",
        check_retry_replays,
    ),
    Rule("new-key-new-request", "the same body under a new key is a new request", f"{D} §2.2; ECS", check_new_key),
    Rule("key-sf-string", 'a key sent as an sf-string ("k") is accepted', f"{D} §2.1; RFC 8941", check_key_sf_string),
    Rule("key-bare-token", '"k" then bare k is one key (n/a if not)', "lenient extension", check_key_bare_token),
    Rule("key-list-400", "the key field sent twice (a List) is 400", f"{D} §2.1; RFC 8941", check_key_list),
    Rule("key-255", "a 255-character key is accepted", "Stripe", check_key_255),
    Rule("missing-key-400", "no key where one is required is 400", f"{D} §2.7", check_missing_key),
    Rule("conflict-422", "the same key with another body is 422", f"{D} §2.2, §2.7", check_conflict),
    Rule("json-respelled", "the same JSON re-spelled is the same request", f"Powertools; {D} §2.4", check_respelled),
    Rule("problem-details", "the 400 and 422 are problem details", f"RFC 9457; {D} §2.7", check_problem_details),
    Rule(
        "concurrent-409",
        "same-key requests at once: one runs, the others 409 or its replay",
        f"{D} §2.6, §2.7; Stripe",
        check_concurrent,
    ),
    Rule("validation-not-kept", "a refused request (400/422) is not kept", "Stripe", check_validation_not_kept),
    Rule("get-no-effect", "a key on GET has no effect (never replayed)", "Stripe", check_get_no_effect),
    Rule(
        "caller-scope",
        "another caller is never served a caller's answer",
        f"{D} Security Considerations",
        check_caller_scope,
    ),
    Rule("expiry-published", f"the key's expiry is published ({EXPIRES_HEADER})", f"{D} §2.3", check_expiry),
)
RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}
ERRORS_OF_A_RULE = (requests.RequestException, OSError, http.client.HTTPException)


def run_suite(base_url: str, path: str, options: Options | None = None, rules: Sequence[Rule] = RULES) -> list[Result]:
    """Every rule against ``base_url + path``, in order; a rule whose requests fail (no answer) fails."""
    probe = Probe(base_url, path, options or Options())
    results = []
    with probe.session:
        for rule in rules:
            try:
                judgement = rule.check(probe)
            except ERRORS_OF_A_RULE as exc:
                judgement = failed(f"no answer: {type(exc).__name__}: {exc}"[:300])
            results.append(Result(rule, judgement.verdict, judgement.detail))
    return results


def all_passed(results: Sequence[Result]) -> bool:
    """Every rule passed or did not apply."""
    return all(result.verdict != Verdict.FAIL for result in results)


DETAIL_WIDTH = 56


def format_table(results: Sequence[Result], target: str | None = None) -> str:
    """A plain-text table (rule, source, verdict, detail), the draft it follows, and the tally."""
    header = ("rule", "source", "verdict", "detail")
    rows = [(result.rule.id, result.rule.source, result.verdict.value, result.detail) for result in results]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(3)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, [*widths, 0], strict=True)).rstrip()

    lines = [
        f"Idempotency-key conformance{f' of {target}' if target else ''}",
        f"{DRAFT_SHORT} = {DRAFT} ({DRAFT_DATE}), the draft these rules follow",
        "",
        line(header),
        line(["-" * width for width in widths] + ["-" * DETAIL_WIDTH]),
    ]
    for row in rows:
        wrapped = textwrap.wrap(row[3], DETAIL_WIDTH) or [""]
        lines.append(line([*row[:3], wrapped[0]]))
        lines.extend(line(["", "", "", more]) for more in wrapped[1:])
    tally = {verdict: sum(result.verdict == verdict for result in results) for verdict in Verdict}
    lines += ["", ", ".join(f"{count} {verdict.value}" for verdict, count in tally.items())]
    return "\n".join(lines)
