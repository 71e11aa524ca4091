"""Issue 22 §1: the guard where the field's rules say a second effect or a leak would follow.

- Lifetime: a guarded call is remembered at least 24 h after it finishes (Stripe,
  idempot-js); manual runs keep the ECS rule, min(created + 24 h, finished + 1 h).
- Fingerprint: a JSON body is compared as canonical JSON, so a retry re-spelled by
  another client library or a proxy is the same request; other bodies by their bytes.
- Scope: keys are per caller by default (the IETF draft's security considerations);
  ``scope=unscoped`` is the explicit opt-out.
"""

from __future__ import annotations

import datetime
import json

import pytest
import webtest
from flask import Flask, request

from dedup.adapters.flask_guard import Fingerprint, KeyFrom, idempotent, install_guard, unscoped
from dedup.idempotency import DEFAULT_POLICY, GUARD_KEY_LIFETIME_SECONDS
from dedup.ledger import Ledger
from handlers import NdbContextMiddleware
from handlers.errors import register as register_error_handlers


def make_app(ndb_client, clock, caller=True):
    """A payments service whose callers say who they are in X-Caller (a stand-in for its auth)."""
    app = Flask("payments")
    install_guard(app, Ledger(clock), caller=(lambda: request.headers["X-Caller"]) if caller else None)
    register_error_handlers(app)
    effects: list = []

    @app.post("/payments")
    @idempotent("payments")
    def pay():
        effects.append((request.headers.get("X-Caller"), request.get_data()))
        return {"payment": len(effects)}, 201

    @app.post("/shared")
    @idempotent("shared", scope=unscoped)
    def shared():
        effects.append(("shared", request.get_data()))
        return {"n": len(effects)}, 201

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)
    return webtest.TestApp(app), effects


@pytest.fixture
def service(datastore, ndb_client, clock):
    return make_app(ndb_client, clock)


def pay(app, body, key="k-1", caller="alice", path="/payments", content_type="application/json", status="*"):
    headers = {"Idempotency-Key": key, "X-Caller": caller, "Content-Type": content_type}
    return app.post(path, body, headers=headers, status=status)


# -- lifetime ----------------------------------------------------------------------------------


@pytest.mark.parametrize("hours_after", [1.5, 12, 23.9])
def test_a_guarded_call_is_remembered_a_day_after_it_finishes(service, clock, hours_after):
    app, effects = service
    first = pay(app, b'{"amount": 10}', status=201)
    clock.advance(hours_after * 3600)  # an outage longer than the ECS rule's hour
    again = pay(app, b'{"amount": 10}', status=201)
    assert again.headers["Idempotent-Replayed"] == "true" and again.json == first.json and len(effects) == 1


def test_after_its_day_the_key_is_free_again(service, clock):
    app, effects = service
    pay(app, b'{"amount": 10}', status=201)
    clock.advance(GUARD_KEY_LIFETIME_SECONDS + DEFAULT_POLICY.lease_seconds + 1)
    assert "Idempotent-Replayed" not in pay(app, b'{"amount": 10}', status=201).headers
    assert len(effects) == 2


def test_the_expiry_a_replay_states_is_a_day_after_the_finish(service, clock):
    app, _ = service
    pay(app, b'{"amount": 10}', status=201)
    expires = pay(app, b'{"amount": 10}', status=201).headers["Idempotency-Expires"]
    stated = datetime.datetime.fromisoformat(expires.replace("Z", "+00:00"))
    assert stated - clock.now() >= datetime.timedelta(seconds=GUARD_KEY_LIFETIME_SECONDS - 1)


# -- fingerprint -------------------------------------------------------------------------------

SAME_JSON = [
    b'{"amount":10,"currency":"EUR"}',
    b'{"currency": "EUR", "amount": 10}',
    b'  {\n  "amount" : 10 ,\n  "currency" : "EUR"\n}\n',
    b'{"amount":10,"currency":"\\u0045UR"}',  # the same string, escaped
]


@pytest.mark.parametrize("retry", SAME_JSON[1:])
def test_a_json_body_re_spelled_is_the_same_request(service, retry):
    app, effects = service
    first = pay(app, SAME_JSON[0], status=201)
    again = pay(app, retry, status=201)
    assert again.headers["Idempotent-Replayed"] == "true" and again.json == first.json and len(effects) == 1


@pytest.mark.parametrize("content_type", ["application/json", "application/merge-patch+json"])
@pytest.mark.parametrize(
    "other", [b'{"amount": 11, "currency": "EUR"}', b'{"amount": 10}', b'{"amount": 10.0, "currency": "EUR"}']
)
def test_a_json_body_that_means_something_else_is_refused(service, content_type, other):
    app, effects = service
    pay(app, SAME_JSON[0], content_type=content_type, status=201)
    refused = pay(app, other, content_type=content_type, status=422)
    assert "key" in json.dumps(refused.json) and len(effects) == 1


def test_other_bodies_are_compared_byte_for_byte(service):
    app, effects = service
    pay(app, b"amount=10&currency=EUR", content_type="application/x-www-form-urlencoded", status=201)
    pay(app, b"currency=EUR&amount=10", content_type="application/x-www-form-urlencoded", status=422)
    # JSON-typed but not strict JSON (NaN): its bytes are all that can be compared.
    pay(app, b'{"amount": NaN}', key="k-2", status=201)
    pay(app, b'{"amount":NaN}', key="k-2", status=422)
    assert len(effects) == 2


# -- scope -------------------------------------------------------------------------------------


def test_another_caller_with_the_same_key_and_body_is_another_request(service):
    app, effects = service
    alice = pay(app, SAME_JSON[0], caller="alice", status=201)
    mallory = pay(app, SAME_JSON[0], caller="mallory", status=201)
    assert "Idempotent-Replayed" not in mallory.headers and mallory.json != alice.json
    assert pay(app, SAME_JSON[0], caller="alice", status=201).json == alice.json  # alice's own retry
    assert [caller for caller, _ in effects] == ["alice", "mallory"]


def test_unscoped_keys_are_shared_on_purpose(service):
    app, effects = service
    first = pay(app, SAME_JSON[0], caller="alice", path="/shared", status=201)
    assert pay(app, SAME_JSON[0], caller="bob", path="/shared", status=201).json == first.json
    assert len(effects) == 1


def test_an_app_that_names_no_caller_shares_keys(datastore, ndb_client, clock):
    app, effects = make_app(ndb_client, clock, caller=False)
    first = pay(app, SAME_JSON[0], caller="alice", status=201)
    assert pay(app, SAME_JSON[0], caller="bob", status=201).json == first.json and len(effects) == 1


def test_this_apps_guard_scopes_keys_by_its_principal(datastore, ndb_client, clock, jobs_file):
    from flask import g

    from dedup.adapters.flask_guard import GUARD_EXTENSION
    from handlers import create_app
    from handlers.access import Principal

    jobs = jobs_file("jobs:\n  report:\n    kind: python\n    target: tests.job_targets:record\n")
    app = create_app(jobs_file=jobs, clock=clock, ndb_client=ndb_client)
    with app.test_request_context("/"):
        g.principal = Principal(name="user:alice@example.com", granted=frozenset())
        assert app.extensions[GUARD_EXTENSION].caller() == "user:alice@example.com"


# -- §2: not refusing good requests --------------------------------------------------------------


def rules_app(ndb_client, clock, **options):
    """A view that validates its body (400/422), refuses (404), fails (500), or serves GET."""
    app = Flask("rules")
    install_guard(app, Ledger(clock), caller=lambda: "alice")
    register_error_handlers(app)
    effects: list = []

    @app.route("/orders", methods=["GET", "POST"])
    @idempotent("orders", **options)
    def orders():
        if request.method in ("GET", "HEAD"):
            return {"orders": len(effects)}
        body = request.get_json()
        effects.append(body)
        if "item" not in body:
            return {"error": "item is required"}, 400
        if body["item"] == "":
            return {"error": "item is empty"}, 422
        if body["item"] == "gone":
            return {"error": "no such item"}, 404
        if body["item"] == "boom":
            return {"error": "the warehouse fell over"}, 500
        return {"order": len(effects), "item": body["item"]}, 201

    @app.post("/by-field")
    @idempotent("by-field", key=KeyFrom.field("requestId"), fingerprint=Fingerprint.fields("item"))
    def by_field():
        effects.append(request.get_json())
        return {"n": len(effects)}, 201

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)
    return webtest.TestApp(app), effects


def post(app, body, key="k-1", status="*", path="/orders", header=None):
    headers = {"Idempotency-Key": header if header is not None else key}
    return app.post_json(path, body, headers=headers, status=status)


@pytest.mark.parametrize("invalid, status", [({}, 400), ({"item": ""}, 422)])
def test_a_corrected_request_after_a_validation_error_runs(datastore, ndb_client, clock, invalid, status):
    app, effects = rules_app(ndb_client, clock)
    post(app, invalid, status=status)
    fixed = post(app, {"item": "book"}, status=201)  # the same key, the body corrected
    assert "Idempotent-Replayed" not in fixed.headers and fixed.json["item"] == "book"
    assert post(app, {"item": "book"}, status=201).headers["Idempotent-Replayed"] == "true"


def test_validation_errors_are_kept_when_the_view_asks(datastore, ndb_client, clock):
    app, effects = rules_app(ndb_client, clock, keep_validation_errors=True)
    post(app, {}, status=400)
    assert post(app, {}, status=400).headers["Idempotent-Replayed"] == "true" and len(effects) == 1
    post(app, {"item": "book"}, status=422)  # the key is spent on the refused request


def test_business_refusals_are_kept_and_server_errors_only_on_request(datastore, ndb_client, clock):
    app, effects = rules_app(ndb_client, clock)
    post(app, {"item": "gone"}, key="k-404", status=404)
    assert post(app, {"item": "gone"}, key="k-404", status=404).headers["Idempotent-Replayed"] == "true"
    post(app, {"item": "boom"}, key="k-500", status=500)
    post(app, {"item": "boom"}, key="k-500", status=500)  # not kept: run again
    assert len(effects) == 3
    kept, kept_effects = rules_app(ndb_client, clock, keep_server_errors=True)
    post(kept, {"item": "boom"}, key="k-500b", status=500)
    assert post(kept, {"item": "boom"}, key="k-500b", status=500).headers["Idempotent-Replayed"] == "true"
    assert len(kept_effects) == 1  # Stripe's rule: a retry after a 5xx is answered, not run


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_safe_methods_pass_straight_through(datastore, ndb_client, clock, method):
    app, effects = rules_app(ndb_client, clock)
    post(app, {"item": "book"}, status=201)
    for headers in ({}, {"Idempotency-Key": "k-1"}):  # no key is no 400; a key is never replayed stale
        answer = app.request("/orders", method=method, headers=headers, status="*")
        assert answer.status_int in (200, 405) and "Idempotent-Replayed" not in answer.headers
    if method == "GET":
        post(app, {"item": "pen"}, key="k-2", status=201)
        assert app.get("/orders", headers={"Idempotency-Key": "k-1"}).json == {"orders": 2}


def test_the_guarded_methods_are_an_option(datastore, ndb_client, clock):
    app, effects = rules_app(ndb_client, clock, methods=("GET", "POST"))
    app.get("/orders", status=400)  # guarded now: a key is required
    first = app.get("/orders", headers={"Idempotency-Key": "g-1"}, status=200)
    assert app.get("/orders", headers={"Idempotency-Key": "g-1"}).headers["Idempotent-Replayed"] == "true"
    assert first.json == {"orders": 0}


@pytest.mark.parametrize(
    "spelling, same_as",
    [('"abc"', "abc"), ("abc", "abc"), ('"a,b"', '"a,b"'), ('"a\\"b"', '"a\\"b"'), ('"abc";v=1', "abc")],
)
def test_a_structured_field_string_and_its_bare_spelling_are_one_key(datastore, ndb_client, clock, spelling, same_as):
    app, effects = rules_app(ndb_client, clock)
    post(app, {"item": "book"}, header=same_as, status=201)
    assert post(app, {"item": "book"}, header=spelling, status=201).headers["Idempotent-Replayed"] == "true"
    assert len(effects) == 1


@pytest.mark.parametrize("header", ['"a", "b"', "a, b", '"abc', '"a\\x"', '"abc" junk', '"a";p=1, "b"'])
def test_a_list_or_a_broken_string_is_400(datastore, ndb_client, clock, header):
    app, effects = rules_app(ndb_client, clock)
    assert post(app, {"item": "book"}, header=header, status=400).json["error"] == "InvalidIdempotencyRequest"
    assert effects == []


def test_an_integer_key_is_its_decimal_string(datastore, ndb_client, clock):
    app, effects = rules_app(ndb_client, clock)
    app.post_json("/by-field", {"requestId": 42}, status=201)
    assert app.post_json("/by-field", {"requestId": "42"}, status=201).headers["Idempotent-Replayed"] == "true"
    assert len(effects) == 1


@pytest.mark.parametrize(
    "value, kind", [(True, "a boolean"), (4.2, "float"), ({}, "dict"), ([], "list"), (None, "null")]
)
def test_other_key_values_are_refused_saying_what_they_were(datastore, ndb_client, clock, value, kind):
    app, effects = rules_app(ndb_client, clock)
    refused = app.post_json("/by-field", {"requestId": value}, status=400)
    assert f"requestId must be a string or an integer, not {kind}" in refused.json["message"] and effects == []
