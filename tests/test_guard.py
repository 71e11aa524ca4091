"""The reusable guard: plain-function wrapper and Flask decorator, on the emulator."""

from __future__ import annotations

import pytest
import webtest
from flask import Flask, Response, g, jsonify, request, send_file

from dedup.adapters.flask_guard import Fingerprint, KeyFrom, idempotent, install_guard
from dedup.errors import PermanentJobError
from dedup.idempotency import IdempotencyConflict, IdempotencyGuard, differing_names, fingerprint
from dedup.ledger import Ledger
from handlers import NdbContextMiddleware
from handlers.errors import register as register_error_handlers


def test_fingerprint_is_canonical_and_skips_excluded_names():
    assert fingerprint({"a": 1, "b": [1, {"y": 2, "x": 1}]}) == fingerprint({"b": [1, {"x": 1, "y": 2}], "a": 1})
    assert fingerprint({"a": 1, "region": "eu"}, exclude={"region"}) == fingerprint({"a": 1}, exclude={"region"})
    assert fingerprint({"a": 1}) != fingerprint({"a": "1"})
    assert fingerprint({"a": None}) != fingerprint({})
    assert differing_names({"a": 1, "b": 2, "z": None}, {"a": 1, "b": 3, "c": 0}) == ["b", "c", "z"]


@pytest.fixture
def guard(ndb_context, clock):
    return IdempotencyGuard(Ledger(clock), "payments")


def test_a_wrapped_function_takes_effect_once_per_key(guard):
    calls = []

    @guard.wrap(key=lambda order, amount: order, parameters=lambda order, amount: {"amount": amount})
    def charge(order: str, amount: int):
        calls.append(order)
        return 0  # falsy, still a result

    assert charge("o-1", 5) == 0
    assert charge("o-1", 5) == 0
    assert charge("o-2", 5) == 0
    assert calls == ["o-1", "o-2"]
    with pytest.raises(IdempotencyConflict) as conflict:
        charge("o-1", 6)
    assert conflict.value.differing == ["amount"]
    assert calls == ["o-1", "o-2"]


def test_a_wrapped_function_releases_on_error_and_keeps_permanent_failures(guard):
    calls = []

    @guard.wrap(key=lambda order: order)
    def ship(order: str):
        calls.append(order)
        if len(calls) == 1:
            raise ConnectionError("carrier unreachable")
        raise PermanentJobError("address rejected")

    with pytest.raises(ConnectionError):
        ship("o-1")
    with pytest.raises(PermanentJobError):
        ship("o-1")  # released: runs again, fails for good
    with pytest.raises(PermanentJobError, match="address rejected"):
        ship("o-1")  # replayed, not run
    assert len(calls) == 2


@pytest.fixture
def service(datastore, ndb_client, clock):
    app = Flask("service")
    install_guard(app, Ledger(clock))
    register_error_handlers(app)
    effects: list = []

    @app.post("/orders")
    @idempotent(
        "orders",
        fingerprint=Fingerprint.fields("item"),
        scope=lambda: request.headers.get("X-Tenant", ""),
        replay_headers=["X-Order-Number"],
    )
    def create_order():
        effects.append((request.headers.get("X-Tenant"), g.idempotency.key))
        body = request.get_json()
        if body.get("item") == "flaky" and len(effects) == 1:
            return jsonify({"error": "warehouse busy"}), 503
        if body.get("item") == "unknown":
            return jsonify({"error": "no such item"}), 404
        response = jsonify({"order": len(effects), "item": body["item"]})
        response.headers["X-Order-Number"] = str(len(effects))
        response.headers["X-Served-By"] = "instance-1"
        return response, 201

    @app.post("/files/<name>")
    @idempotent("files")
    def make_file(name):
        effects.append(name)
        if name == "binary":
            return Response(bytes(range(256)) * 4, status=201, mimetype="application/octet-stream")
        if name == "sent":
            import io

            return send_file(io.BytesIO(b"\x89PNG\r\n\x1a\n" + bytes(100)), mimetype="image/png")
        if name == "latin1":
            return Response("café".encode("latin-1"), mimetype="text/plain; charset=latin-1")
        if name == "huge":
            return jsonify({"rows": ["x" * 100] * 5000}), 201
        if name == "cyrillic":  # under the kept limit as bytes, far over it escaped as JSON
            return Response("щ" * 120_000, status=201, mimetype="text/plain")
        response = jsonify({"ok": True})
        response.set_cookie("session", "abc")
        response.headers["ETag"] = '"v1"'
        return response, 201

    @app.post("/optional")
    @idempotent("optional", key=KeyFrom.field("requestId", required=False))
    def optional():
        effects.append("optional")
        return {"n": len(effects)}

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)
    return webtest.TestApp(app), effects


def order(app, key, item="book", tenant="t-1", status="*"):
    headers = {"X-Tenant": tenant}
    if key is not None:
        headers["Idempotency-Key"] = key
    return app.post_json("/orders", {"item": item, "note": "ignored"}, headers=headers, status=status)


def test_the_stored_response_is_replayed_with_chosen_headers(service):
    app, effects = service
    first = order(app, "k-1", status=201)
    again = order(app, "k-1", status=201)  # the original status, as the IETF draft says
    assert again.json == first.json
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["X-Order-Number"] == "1"
    assert "X-Served-By" not in again.headers
    assert len(effects) == 1


def test_scope_separates_tenants(service):
    app, effects = service
    order(app, "k-1", tenant="t-1", status=201)
    order(app, "k-1", tenant="t-2", status=201)
    assert effects == [("t-1", "k-1"), ("t-2", "k-1")]


def test_a_missing_key_is_400_when_required(service):
    app, effects = service
    response = order(app, None, status=400)
    assert "Idempotency-Key" in response.json["message"]
    assert effects == []


def test_only_chosen_fields_are_fingerprinted(service):
    app, effects = service
    order(app, "k-1", status=201)
    app.post_json(
        "/orders",
        {"item": "book", "note": "changed"},
        headers={"Idempotency-Key": "k-1", "X-Tenant": "t-1"},
        status=201,
    )
    conflict = order(app, "k-1", item="pen", status=422)
    assert conflict.json["differing"] == ["item"]
    assert len(effects) == 1


def test_retryable_answers_are_not_kept_and_client_errors_are(service):
    app, effects = service
    order(app, "k-1", item="flaky", status=503)  # a downstream service may say 503; it is not kept
    order(app, "k-1", item="flaky", status=201)
    order(app, "k-2", item="unknown", status=404)
    replay = order(app, "k-2", item="unknown", status=404)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert len(effects) == 3


def test_an_optional_key_guards_only_when_given(service):
    app, effects = service
    app.post_json("/optional", {}, status=200)
    app.post_json("/optional", {}, status=200)
    app.post_json("/optional", {"requestId": "r-1"}, status=200)
    replay = app.post_json("/optional", {"requestId": "r-1"}, status=200)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert effects == ["optional"] * 3


@pytest.mark.parametrize("name", ["binary", "sent", "latin1"])
def test_bodies_that_are_not_utf8_text_are_kept_byte_for_byte(service, name):
    app, effects = service
    first = app.post(f"/files/{name}", headers={"Idempotency-Key": name})
    again = app.post(f"/files/{name}", headers={"Idempotency-Key": name})
    assert again.body == first.body and again.status_int == first.status_int
    assert again.headers["Content-Type"] == first.headers["Content-Type"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert effects == [name]


@pytest.mark.parametrize("name, size", [("huge", 5000 * 100), ("cyrillic", 120_000 * 2)])
def test_a_response_too_large_to_keep_is_replayed_as_a_note(service, name, size):
    app, effects = service
    first = app.post(f"/files/{name}", headers={"Idempotency-Key": "h"}, status=201)
    assert len(first.body) >= size  # the first caller gets everything
    again = app.post(f"/files/{name}", headers={"Idempotency-Key": "h"}, status=201)
    assert again.json["error"] == "ResponseNotKept" and "took effect" in again.json["message"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert effects == [name]


def test_the_first_response_is_the_views_own(service):
    app, effects = service
    first = app.post("/files/plain", headers={"Idempotency-Key": "p"}, status=201)
    assert "session=abc" in first.headers["Set-Cookie"]
    assert first.headers["ETag"] == '"v1"'
    assert "Idempotency-Expires" in first.headers


def test_a_key_of_another_job_is_refused_by_the_decorator_and_the_wrapper(datastore, ndb_client, clock):
    app = Flask("jobs-service")
    install_guard(app, Ledger(clock))
    register_error_handlers(app)
    effects: list = []

    # One namespace, the job named per request: two jobs can meet under one key.
    @app.post("/exports/<kind>")
    @idempotent("exports", job_id=lambda: request.view_args["kind"])
    def export(kind):
        effects.append(kind)
        return {"kind": kind}, 201

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)
    client = webtest.TestApp(app)
    client.post("/exports/csv", headers={"Idempotency-Key": "k-1"}, status=201)
    refused = client.post("/exports/pdf", headers={"Idempotency-Key": "k-1"}, status=422)
    assert refused.json["error"] == "JobMismatch" and refused.json["recorded_job_id"] == "csv"
    assert effects == ["csv"]

    with ndb_client.context():
        guard = IdempotencyGuard(Ledger(clock), "exports")
        with pytest.raises(IdempotencyConflict) as conflict:
            guard.wrap(key=lambda: "k-1")(lambda: effects.append("wrapped"))()
    assert conflict.value.differing == ["job_id"] and effects == ["csv"]
    assert "'csv'" in str(conflict.value) and "'exports'" in str(conflict.value)


@pytest.mark.parametrize("job", ["x" * 101, "with space", "tab\there", "café", "", 5, None])
def test_a_job_id_a_request_chooses_is_bounded(datastore, ndb_client, clock, job):
    app = Flask("jobs-service")
    install_guard(app, Ledger(clock))
    register_error_handlers(app)

    @app.post("/exports")
    @idempotent("exports", job_id=lambda: job)
    def export():
        raise AssertionError("never runs")

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)
    refused = webtest.TestApp(app).post("/exports", headers={"Idempotency-Key": "k-1"}, status=400)
    assert "the job this request names" in refused.json["message"]


@pytest.mark.parametrize("namespace", ["x" * 101, "two words", ""])
def test_a_namespace_is_checked_when_the_view_is_decorated(namespace):
    with pytest.raises(ValueError, match="namespace"):
        idempotent(namespace)


def test_a_key_header_sent_twice_is_refused_not_joined(service):
    app, effects = service
    # gunicorn joins a header sent twice with a comma ("k-1,k-2"): that would be a third key.
    for key in ("k-1,k-2", "k-1, k-2", ","):
        refused = app.post_json("/orders", {"item": "book"}, headers={"Idempotency-Key": key}, status=400)
        assert "comma" in refused.json["message"]
    assert effects == []


def test_a_guard_may_name_its_own_source_and_deeply_nested_parameters(ndb_context, clock):
    """Anything a caller may give the plain-function guard is kept as given."""
    deep: dict = {}
    for _ in range(600):
        deep = {"p": deep}
    guard = IdempotencyGuard(Ledger(clock), "shipments", source="shipping")
    calls = []

    @guard.wrap(key=lambda order: order, parameters=lambda order: {"route": deep})
    def ship(order: str) -> str:
        calls.append(order)
        return "shipped"

    assert ship("o-1") == ship("o-1") == "shipped" and calls == ["o-1"]


def test_install_guard_tells_each_outcome_and_adds_a_host_apps_problem_types(ndb_client, clock):
    """A host app hears every outcome (the app names it on its log line) and answers with its own
    problem types beside the library's, which still answer what they answer."""
    from dedup.problems import ProblemType

    told: list[str] = []
    refused = ProblemType("PaymentRefused", 400, "Payment refused", False, "The payment request is refused.")
    app = Flask("shop")
    install_guard(app, Ledger(clock), on_outcome=lambda outcome: told.append(type(outcome).__name__),
                  problem_types={"PaymentRefused": refused})  # fmt: skip

    @app.post("/pay")
    @idempotent("pay", bad_request_error="PaymentRefused")
    def pay():
        return {"paid": True}, 201

    def post(body: dict, **headers: str):
        with ndb_client.context():
            return app.test_client().post("/pay", json=body, headers=headers)

    assert post({"amount": 5}, **{"Idempotency-Key": "k-1"}).status_code == 201
    assert post({"amount": 5}, **{"Idempotency-Key": "k-1"}).headers["Idempotent-Replayed"] == "true"
    other = post({"amount": 6}, **{"Idempotency-Key": "k-1"})
    assert told == ["Finished", "Replayed", "Conflict"]
    assert other.status_code == 422 and other.json["type"] == "/problems/conflict-exception"
    missing = post({"amount": 5})  # no key: refused with the host's type
    assert missing.status_code == 400 and missing.json["type"] == "/problems/payment-refused"
    assert missing.json["title"] == "Payment refused" and told == ["Finished", "Replayed", "Conflict"]
