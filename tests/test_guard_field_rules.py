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

from dedup.idempotency import DEFAULT_POLICY, GUARD_KEY_LIFETIME_SECONDS
from dedup.ledger import Ledger
from handlers import NdbContextMiddleware
from handlers.errors import register as register_json_errors
from handlers.idempotent import idempotent, install_guard, unscoped


def make_app(ndb_client, clock, caller=True):
    """A payments service whose callers say who they are in X-Caller (a stand-in for its auth)."""
    app = Flask("payments")
    install_guard(app, Ledger(clock), caller=(lambda: request.headers["X-Caller"]) if caller else None)
    register_json_errors(app)
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

    from handlers import create_app
    from handlers.access import Principal
    from handlers.idempotent import GUARD_EXTENSION

    jobs = jobs_file("jobs:\n  report:\n    kind: python\n    target: tests.job_targets:record\n")
    app = create_app(jobs_file=jobs, clock=clock, ndb_client=ndb_client)
    with app.test_request_context("/"):
        g.principal = Principal(name="user:alice@example.com", granted=frozenset())
        assert app.extensions[GUARD_EXTENSION].caller() == "user:alice@example.com"
