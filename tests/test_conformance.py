"""Issue 22 §4: the idempotency-key conformance suite (dedupctl/conformance.py, dedupctl conformance).

The project passes it: the guard, served by gunicorn on the emulator (tests.guard_app), passes
every rule; the table is printed and kept in test-artifacts/conformance.txt.  The suite can
fail: a small in-memory service in this module passes it as it is, and each of its flaws, once
switched on, makes its own rule fail, so no rule is a pass written in advance.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from click.testing import CliRunner
from flask import Flask, Response, request
from werkzeug.serving import WSGIRequestHandler, make_server

from dedupctl.cli import cli
from dedupctl.conformance import (
    DRAFT,
    RULES,
    RULES_BY_ID,
    Options,
    Result,
    Verdict,
    format_table,
    parse_time,
    run_suite,
)
from devtools.gunicorn import GunicornServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACT = os.path.join(ROOT, "test-artifacts", "conformance.txt")
# What tests.guard_app's /orders is sent: it answers 400 to a body without "item".
GUARD_OPTIONS = dict(invalid_body="{}", caller_a={"X-Caller": "alice"}, caller_b={"X-Caller": "bob"})
GUARD_ARGS = ["--invalid-body", "{}", "--caller-a", "X-Caller: alice", "--caller-b", "X-Caller: bob"]


def verdicts(results: Sequence[Result]) -> dict[str, Verdict]:
    return {result.rule.id: result.verdict for result in results}


def row(table: str, rule_id: str) -> str:
    """A rule's row of the printed table, its wrapped detail joined again."""
    lines = iter(table.splitlines())
    found = next(line for line in lines if line.startswith(rule_id + " "))
    joined = [found.rstrip()]
    for line in lines:
        if not line.startswith(" "):
            break
        joined.append(line.strip())
    return " ".join(joined)


# The project passes: the guard on gunicorn and the emulator, as tests/test_guard_rules_live.py serves it.


@pytest.fixture(scope="module")
def server(emulator, tmp_path_factory):
    folder = tmp_path_factory.mktemp("conformance")
    (folder / "jobs.yaml").write_text("jobs: {}\n")
    env = {"GUARD_EFFECTS_DIR": str(folder), "DEDUP_FINISHED_CACHE_ENTRIES": "0"}
    with GunicornServer(emulator, str(folder / "jobs.yaml"), 2, 2, app="tests.guard_app:app", extra_env=env) as running:
        yield running


@pytest.fixture
def guarded(server, datastore):
    return server


@pytest.mark.live
def test_the_guard_passes_every_rule(guarded, capsys):
    results = run_suite(guarded.url, "/orders", Options(**GUARD_OPTIONS))
    table = format_table(results, target=f"{guarded.url}/orders (tests.guard_app, gunicorn, the emulator)")
    os.makedirs(os.path.dirname(ARTIFACT), exist_ok=True)
    with open(ARTIFACT, "w", encoding="utf-8") as handle:
        handle.write(table + "\n")
    with capsys.disabled():
        print("\n" + table)
    assert [result.rule.id for result in results] == [rule.id for rule in RULES]
    failing = {result.rule.id: result.detail for result in results if result.verdict != Verdict.PASS}
    assert failing == {}, table


@pytest.mark.live
def test_the_command_passes_the_guard_and_prints_the_table(guarded):
    result = CliRunner().invoke(cli, ["conformance", guarded.url, "/orders", *GUARD_ARGS], standalone_mode=False)
    assert result.exception is None, result.output
    assert result.return_value == 0, result.output
    assert DRAFT in result.output and "(2026-11-21)" in result.output
    for rule in RULES:
        assert rule.id in result.output and rule.source in result.output
    assert f"{len(RULES)} pass, 0 fail, 0 n/a" in result.output


def documented_command() -> list[str]:
    """The arguments of the command docs/manual-runs.md shows, after ``dedupctl``."""
    with open(os.path.join(ROOT, "docs", "manual-runs.md"), encoding="utf-8") as handle:
        (line,) = [line for line in handle.read().splitlines() if line.startswith("dedupctl conformance ")]
    return shlex.split(line)[1:]


@pytest.mark.live
def test_the_documented_command_passes_the_payments_example(emulator, datastore, tmp_path):
    """docs/manual-runs.md's command, against examples/guarded_payments.py on gunicorn as it says."""
    arguments = documented_command()
    assert arguments[1] == "http://127.0.0.1:8000"  # gunicorn's default address, as the docs serve it
    (tmp_path / "jobs.yaml").write_text("jobs: {}\n")
    with GunicornServer(emulator, str(tmp_path / "jobs.yaml"), 1, 4, app="examples.guarded_payments:app") as server:
        arguments[1] = server.url
        result = CliRunner().invoke(cli, arguments, standalone_mode=False)
    assert result.exception is None and result.return_value == 0, result.output
    # The example refuses no body and serves no GET: those two rules do not apply to it.
    shown = {rule.id: re.split(r"\s{2,}", row(result.output, rule.id))[2] for rule in RULES}
    assert {rule: verdict for rule, verdict in shown.items() if verdict != "pass"} == {
        "validation-not-kept": "n/a",
        "get-no-effect": "n/a",
    }


# The suite can fail: a service of its own, correct as it is, with flaws to switch on.


class Orders:
    """An in-memory idempotency-key service at /orders, like tests.guard_app's, and its flaws.

    Keys are per caller (``X-Caller``), bodies compared as canonical JSON, validation errors
    not kept, GET left alone, errors as problem details, a request in flight is 409.
    """

    VARIANTS = frozenset(
        {
            "ignores-keys",  # runs every POST
            "unmarked-replays",  # replays without Idempotent-Replayed
            "replays-rerun",  # marks a retry replayed but runs it again
            "keys-by-body",  # finds the record by the body, whatever the key
            "refuses-quoted-keys",  # takes only bare tokens
            "bare-token-500",  # fails on a bare token
            "first-of-list",  # takes the first of two key fields
            "short-keys",  # at most 64 characters
            "key-optional",  # runs without a key
            "conflict-replays",  # another body under a used key gets the first answer
            "raw-body",  # compares bodies byte for byte
            "plain-errors",  # errors as application/json
            "no-lock",  # looks, runs, then stores: requests at once all run
            "keeps-validation-errors",  # keeps a 400 as the key's answer
            "guards-get",  # keeps and replays GETs too
            "shared-keys",  # keys shared between callers
            "expiry-past",  # Idempotency-Expires before the answer
            # Not flaws: what the draft allows, which the suite reports as n/a.
            "opaque-keys",  # the field's text is the key, quotes and all
            "strict-strings",  # refuses a bare token: only an sf-string is a key
            "no-expiry-header",  # the expiry is in its documentation alone
        }
    )

    def __init__(self, flaws: frozenset[str] = frozenset()) -> None:
        assert flaws <= self.VARIANTS, flaws - self.VARIANTS
        self.flaws = flaws
        self.lock = threading.Lock()
        self.records: dict[tuple, dict] = {}
        self.effects = 0
        self.app = Flask(__name__)
        self.app.add_url_rule("/orders", view_func=self.orders, methods=["GET", "POST"])

    def error(self, status: int, detail: str) -> Response:
        if "plain-errors" in self.flaws:
            return Response(json.dumps({"error": detail}), status, mimetype="application/json")
        document = {"type": "/problems/orders", "title": "Order refused", "status": status, "detail": detail}
        return Response(json.dumps(document), status, mimetype="application/problem+json")

    def key(self, raw: str) -> str:
        text = raw.strip()
        if "opaque-keys" in self.flaws:
            if "," in text:
                raise ValueError("one key, please")
            key = text
        elif text.startswith('"'):
            if "refuses-quoted-keys" in self.flaws:
                raise ValueError("keys are tokens")
            end = text.find('"', 1)
            if end < 0:
                raise ValueError("no closing quote")
            key, rest = text[1:end], text[end + 1 :].strip()
            if rest and not (rest.startswith(",") and "first-of-list" in self.flaws):
                raise ValueError("one key, please")
        else:
            if "bare-token-500" in self.flaws:
                raise RuntimeError("bare token")
            if "strict-strings" in self.flaws:
                raise ValueError("the key must be an sf-string")
            key = text
        if not 1 <= len(key) <= (64 if "short-keys" in self.flaws else 255):
            raise ValueError("1 to 255 characters")
        return key

    def run(self) -> tuple[int, bytes]:
        """The effect: an order numbered by the count of effects so far."""
        try:
            body = json.loads(request.get_data())
        except ValueError:
            body = None
        if not isinstance(body, dict) or "item" not in body:
            refused = self.error(400, "item is required")
            return refused.status_code, refused.get_data()
        time.sleep(0.02)
        with self.lock:
            self.effects += 1
            return 201, json.dumps({"order": self.effects}).encode()

    def answer(self, status: int, body: bytes, replayed: bool = False) -> Response:
        response = Response(body, status, mimetype="application/json")
        if status >= 400 and body.startswith(b'{"type"'):
            response.mimetype = "application/problem+json"
        if "no-expiry-header" not in self.flaws:
            hours = -1 if "expiry-past" in self.flaws else 24
            expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=hours)
            response.headers["Idempotency-Expires"] = expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if replayed and "unmarked-replays" not in self.flaws:
            response.headers["Idempotent-Replayed"] = "true"
        return response

    def orders(self) -> Response:
        raw = request.headers.get("Idempotency-Key")
        if request.method == "GET" and not (raw is not None and "guards-get" in self.flaws):
            return Response(json.dumps({"listed": True}), 200, mimetype="application/json")
        if raw is None or "ignores-keys" in self.flaws:
            if "key-optional" in self.flaws or "ignores-keys" in self.flaws:
                return self.answer(*self.run())
            return self.error(400, "Idempotency-Key is required")
        try:
            key = self.key(raw)
        except ValueError as exc:
            return self.error(400, str(exc))
        data = request.get_data()
        if "raw-body" in self.flaws:
            fingerprint = hashlib.sha256(data).hexdigest()
        else:
            try:
                fingerprint = hashlib.sha256(json.dumps(json.loads(data), sort_keys=True).encode()).hexdigest()
            except ValueError:
                fingerprint = hashlib.sha256(data).hexdigest()
        caller = "" if "shared-keys" in self.flaws else request.headers.get("X-Caller", "")
        slot = (request.method, caller, fingerprint if "keys-by-body" in self.flaws else key)
        if "no-lock" in self.flaws:
            record = self.records.get(slot)
            time.sleep(0.2)  # the window between looking and storing
            if record is None:
                status, body = self.run()
                self.records[slot] = {"fingerprint": fingerprint, "answer": (status, body)}
                return self.answer(status, body)
        else:
            with self.lock:
                record = self.records.get(slot)
                if record is None:
                    self.records[slot] = {"fingerprint": fingerprint, "answer": None}
        if record is not None:
            if record["fingerprint"] != fingerprint and "conflict-replays" not in self.flaws:
                return self.error(422, "Idempotency-Key already used with another body")
            if record["answer"] is None:
                return self.error(409, "a request with this key is in flight")
            if "replays-rerun" in self.flaws:
                return self.answer(*self.run(), replayed=True)
            return self.answer(*record["answer"], replayed=True)
        if request.method == "GET":
            status, body = 200, json.dumps({"listed": True}).encode()
        else:
            status, body = self.run()
        with self.lock:
            if status in (400, 422) and "keeps-validation-errors" not in self.flaws:
                del self.records[slot]
            else:
                self.records[slot]["answer"] = (status, body)
        return self.answer(status, body)


class QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: object) -> None:
        pass  # a line per request would bury a failure's table


@contextlib.contextmanager
def serving(flaws: frozenset[str] = frozenset()) -> Iterator[str]:
    """Orders with ``flaws`` on 127.0.0.1 (a free port) in a thread: its URL, for as long as it is used."""
    server = make_server("127.0.0.1", 0, Orders(flaws).app, threaded=True, request_handler=QuietHandler)
    # A 20 ms poll, as the other test servers: shutdown() waits out one poll.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


@pytest.fixture
def orders() -> Iterator[str]:
    with serving() as url:
        yield url


FLAW_BREAKS = {
    "ignores-keys": "retry-replays",
    "unmarked-replays": "retry-replays",
    "replays-rerun": "retry-replays",
    "keys-by-body": "new-key-new-request",
    "refuses-quoted-keys": "key-sf-string",
    "bare-token-500": "key-bare-token",
    "first-of-list": "key-list-400",
    "short-keys": "key-255",
    "key-optional": "missing-key-400",
    "conflict-replays": "conflict-422",
    "raw-body": "json-respelled",
    "plain-errors": "problem-details",
    "no-lock": "concurrent-409",
    "keeps-validation-errors": "validation-not-kept",
    "guards-get": "get-no-effect",
    "shared-keys": "caller-scope",
    "expiry-past": "expiry-published",
}


# What the draft leaves open: the rule does not apply, and nothing fails.
ALLOWED_DOES_NOT_APPLY = {
    "opaque-keys": "key-bare-token",
    "strict-strings": "key-bare-token",
    "no-expiry-header": "expiry-published",
}


def test_every_flaw_names_a_rule_and_every_rule_has_a_flaw():
    assert set(FLAW_BREAKS) | set(ALLOWED_DOES_NOT_APPLY) == Orders.VARIANTS
    assert set(FLAW_BREAKS.values()) == set(RULES_BY_ID)


def test_the_service_without_flaws_passes_every_rule(orders):
    results = run_suite(orders, "/orders", Options(**GUARD_OPTIONS))
    assert {rule: verdict for rule, verdict in verdicts(results).items() if verdict != Verdict.PASS} == {}, (
        format_table(results)
    )


@pytest.mark.parametrize("flaw", sorted(FLAW_BREAKS))
def test_each_flaw_fails_its_rule(flaw):
    """Each rule sends its own requests under its own keys, so the flawed rule alone is judged."""
    rule = RULES_BY_ID[FLAW_BREAKS[flaw]]
    with serving(frozenset({flaw})) as url:
        results = run_suite(url, "/orders", Options(**GUARD_OPTIONS), rules=[rule])
        assert verdicts(results) == {rule.id: Verdict.FAIL}, format_table(results)


@pytest.mark.parametrize("variant", sorted(ALLOWED_DOES_NOT_APPLY))
def test_what_the_draft_leaves_open_does_not_apply_and_fails_nothing(variant):
    with serving(frozenset({variant})) as url:
        results = verdicts(run_suite(url, "/orders", Options(**GUARD_OPTIONS)))
    assert {rule for rule, verdict in results.items() if verdict != Verdict.PASS} == {ALLOWED_DOES_NOT_APPLY[variant]}
    assert results[ALLOWED_DOES_NOT_APPLY[variant]] == Verdict.NOT_APPLICABLE


def test_a_rule_without_its_option_does_not_apply(orders):
    results = verdicts(run_suite(orders, "/orders", Options(key_required=False)))
    not_applying = {rule for rule, verdict in results.items() if verdict == Verdict.NOT_APPLICABLE}
    assert not_applying == {"missing-key-400", "validation-not-kept", "caller-scope"}
    assert Verdict.FAIL not in results.values()


def test_a_service_that_is_not_there_fails_every_rule_that_sends():
    with socket.socket() as bound:  # a port of ours that nothing listens on: connections are refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        results = run_suite(url, "/orders", Options(**GUARD_OPTIONS, timeout=2))
    assert set(verdicts(results).values()) == {Verdict.FAIL}
    assert all("no answer" in result.detail for result in results)


def test_the_command_fails_a_flawed_service_and_refuses_bad_arguments():
    with serving(frozenset({"shared-keys"})) as url:
        result = CliRunner().invoke(cli, ["conformance", url, "/orders", *GUARD_ARGS], standalone_mode=False)
        assert result.exception is None and result.return_value == 1, result.output
        caller_row = row(result.output, "caller-scope")
        assert (
            " fail " in caller_row and "caller B, sending caller A's key and body, was served A's answer" in caller_row
        )
    for bad in (["--body", "{nope"], ["--caller-a", "no colon"], ["--invalid-body", "[1,"]):
        refused = CliRunner().invoke(cli, ["conformance", "http://127.0.0.1:9", "/orders", *bad])
        assert refused.exit_code == 2, (bad, refused.output)


def test_times_are_read_as_rfc_3339_or_http_dates():
    utc = datetime.UTC
    assert parse_time("2026-11-29T20:44:42.226636Z") == datetime.datetime(2026, 11, 29, 20, 44, 42, 226636, utc)
    assert parse_time("Sun, 29 Nov 2026 20:44:42 GMT") == datetime.datetime(2026, 11, 29, 20, 44, 42, tzinfo=utc)
    assert parse_time("2026-11-29T20:44:42") is None  # no offset: not a time a client can compare
    assert parse_time("tomorrow") is None


@pytest.mark.parametrize(
    "document, issue",
    [
        ({"type": "about:blank", "title": "Conflict"}, None),  # the draft's example: no status, and none needed
        ({"type": "/p/x", "title": "X", "status": 422}, None),
        ({"type": "/p/x", "title": "X", "status": 409}, "status 409 in the body, 422 on the response"),
        ({"type": "/p/x", "title": "X", "status": "422"}, "status '422' is not a number"),
        ({"title": "X"}, "no string type"),
    ],
)
def test_a_problem_needs_a_type_and_a_title_and_a_status_only_if_it_gives_one(document, issue):
    from dedupctl.conformance import PROBLEM_MEDIA_TYPE, Answer, problem_details_issue

    answer = Answer(422, {"Content-Type": PROBLEM_MEDIA_TYPE}, json.dumps(document).encode())
    assert problem_details_issue(answer) == issue


def test_with_an_optional_key_a_list_of_keys_may_be_ignored():
    """RFC 8941: a field that does not parse is ignored, so an optional key runs the request unguarded."""
    with serving(frozenset({"first-of-list", "key-optional"})) as url:
        results = run_suite(
            url, "/orders", Options(**GUARD_OPTIONS, key_required=False), rules=[RULES_BY_ID["key-list-400"]]
        )
    assert verdicts(results) == {"key-list-400": Verdict.NOT_APPLICABLE}
