"""IAP: ``X-Goog-IAP-JWT-Assertion`` verified as Google documents (ES256, IAP's keys, issuer,
audience, lifetime), the ``email`` claim as the principal.  Every bad assertion is a 401
with a fixed message that echoes nothing configured, and writes nothing."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from handlers.auth import AuthConfigError, AuthSettings, IapAssertions
from tests.support.callers import (  # noqa: F401 - fixtures
    IAP_AUDIENCE,
    OFF_GAE,
    OPERATOR,
    app_with,
    as_person,
    iap,
    iap_app,
    iap_environ,
    nothing_written,
)
from tests.support.deliveries import scheduler_headers
from tests.support.manual_runs import start
from tests.support.oidc import TokenIssuer, segment
from tests.support.problems import code_and_message

HEADER = "X-Goog-IAP-JWT-Assertion"
MALFORMED = "the IAP assertion is malformed"
SIGNATURE = "the IAP assertion's signature does not verify"
EXPIRED = "the IAP assertion has expired or is not valid yet"
AUDIENCE_WRONG = "the IAP assertion has the wrong audience"
ISSUER_WRONG = "the IAP assertion's issuer is not IAP"
NO_EMAIL = "the IAP assertion names no email"
TOO_LARGE = "the IAP assertion is too large"


def good(iap, **claims):
    return iap.assertion(audience=IAP_AUDIENCE, email=OPERATOR, extra=claims or None)


def hs256(iap, key: bytes) -> str:
    """An HS256 assertion keyed with ``key`` (the published public key, the classic confusion)."""
    header = segment({"alg": "HS256", "kid": iap.kid, "typ": "JWT"})
    payload = segment(json.loads(_payload(good(iap))))
    mac = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{segment(mac)}"


def _payload(token: str) -> bytes:
    import base64

    part = token.split(".")[1]
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


RSA = TokenIssuer()  # a Google ID token issuer: right shape, wrong algorithm and key

CASES = [
    ("wrong-key", lambda i: i.assertion(audience=IAP_AUDIENCE, email=OPERATOR, rogue=True), SIGNATURE),
    ("unknown-key-id", lambda i: i.assertion(audience=IAP_AUDIENCE, email=OPERATOR, header={"kid": "k9"}), SIGNATURE),
    (
        "no-key-id-wrong-key",
        lambda i: i.signed(segment({"alg": "ES256"}), segment(json.loads(_payload(good(i)))), rogue=True),
        SIGNATURE,
    ),
    ("rs256", lambda i: RSA.token(audience=IAP_AUDIENCE, email=OPERATOR), SIGNATURE),
    ("hs256-with-public-key", lambda i: hs256(i, i.certificate_pem.encode()), SIGNATURE),
    ("alg-none", lambda i: f"{segment({'alg': 'none'})}.{segment(json.loads(_payload(good(i))))}.AA", SIGNATURE),
    ("alg-not-a-string", lambda i: i.assertion(audience=IAP_AUDIENCE, email=OPERATOR, header={"alg": 7}), SIGNATURE),
    ("kid-not-a-string", lambda i: i.assertion(audience=IAP_AUDIENCE, email=OPERATOR, header={"kid": 1}), MALFORMED),
    ("wrong-audience", lambda i: i.assertion(audience="/projects/1/apps/other", email=OPERATOR), AUDIENCE_WRONG),
    ("audience-as-list", lambda i: good(i, aud=[IAP_AUDIENCE]), MALFORMED),
    (
        "wrong-issuer",
        lambda i: i.assertion(audience=IAP_AUDIENCE, email=OPERATOR, issuer="https://accounts.google.com"),
        ISSUER_WRONG,
    ),
    ("expired", lambda i: i.assertion(audience=IAP_AUDIENCE, email=OPERATOR, issued_ago=3600), EXPIRED),
    ("not-yet-valid", lambda i: i.assertion(audience=IAP_AUDIENCE, email=OPERATOR, issued_ago=-600), EXPIRED),
    ("expiry-not-a-number", lambda i: good(i, exp="tomorrow"), MALFORMED),
    ("expiry-a-boolean", lambda i: good(i, exp=True), MALFORMED),
    ("no-issued-at", lambda i: good(i, iat=None), MALFORMED),
    ("no-email", lambda i: good(i, email=""), NO_EMAIL),
    ("email-not-an-email", lambda i: good(i, email="alice"), NO_EMAIL),
    ("email-with-control-characters", lambda i: good(i, email="alice@example.com\nuser:eve@example.com"), NO_EMAIL),
    ("email-not-a-string", lambda i: good(i, email=["alice@example.com"]), MALFORMED),
    ("sub-not-a-string", lambda i: good(i, sub=12), MALFORMED),
    ("garbage", lambda i: "garbage", MALFORMED),
    ("two-segments", lambda i: "a.b", MALFORMED),
    ("four-segments", lambda i: "a.b.c.d", MALFORMED),
    ("empty", lambda i: "", MALFORMED),
    ("padding", lambda i: good(i) + "==", MALFORMED),
    ("outside-the-alphabet", lambda i: good(i).replace(".", ".+", 1), MALFORMED),
    ("bad-base64-length", lambda i: "a.b.c", MALFORMED),
    ("payload-not-json", lambda i: i.signed(segment({"alg": "ES256", "kid": i.kid}), segment(b"\xff\xfe")), MALFORMED),
    ("payload-an-array", lambda i: i.signed(segment({"alg": "ES256", "kid": i.kid}), segment([1, 2])), MALFORMED),
    ("header-not-json", lambda i: i.signed(segment(b"{"), segment({})), MALFORMED),
    (
        "deeply-nested-payload",
        lambda i: i.signed(segment({"alg": "ES256", "kid": i.kid}), segment(b"[" * 1500 + b"]" * 1500)),
        MALFORMED,
    ),
    ("oversized", lambda i: good(i, padding="x" * 9000), TOO_LARGE),
]


@pytest.mark.sample(8)
@pytest.mark.parametrize("build, message", [pytest.param(b, m, id=c) for c, b, m in CASES])
def test_every_bad_assertion_is_401_and_writes_nothing(iap_app, iap, ndb_client, build, message):
    headers = {HEADER: build(iap)}
    for response in (
        start(iap_app, headers=headers, status=401),
        iap_app.get("/admin/", headers=headers, status=401),
        iap_app.get("/api/v1/runs", headers=headers, status=401),
    ):
        assert code_and_message(response.json) == {"error": "Unauthenticated", "message": message}
        assert IAP_AUDIENCE not in response.text and iap.certs_url not in response.text
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert nothing_written(ndb_client)


def test_a_verified_operator_runs_a_job(iap_app, iap):
    response = start(iap_app, headers=as_person(iap, OPERATOR), status=201)
    assert response.json["status"] == "completed"
    assert response.json["requested_by"] == f"user:{OPERATOR}"


def test_the_email_compares_without_case(iap_app, iap):
    start(iap_app, headers=as_person(iap, OPERATOR.upper()), status=201)


def test_keys_are_fetched_once_and_cached_per_cache_control(iap_app, iap):
    before = iap.fetches
    for _ in range(3):
        iap_app.get("/api/v1/runs", headers=as_person(iap, OPERATOR), status=200)
    assert iap.fetches - before <= 1


@pytest.mark.parametrize("cache_control", ["no-cache, max-age=0", "public, MAX-AGE=0", "max-age=-5"])
def test_keys_are_kept_a_minute_at_least(datastore, ndb_client, jobs_file, clock, iap, cache_control):
    iap.cache_control = cache_control
    try:
        app = app_with(iap_environ(iap), datastore, ndb_client, jobs_file, clock)
        before = iap.fetches
        for _ in range(3):
            app.get("/api/v1/runs", headers=as_person(iap, OPERATOR), status=200)
        assert iap.fetches - before == 1
    finally:
        iap.cache_control = "public, max-age=3600"


def test_keys_that_cannot_be_fetched_are_a_500_naming_nothing(datastore, ndb_client, jobs_file, clock, iap):
    environ = iap_environ(iap, DEDUP_IAP_CERTS_URL="http://127.0.0.1:9/iap/verify/public_key")
    app = app_with(environ, datastore, ndb_client, jobs_file, clock)
    response = start(app, headers=as_person(iap, OPERATOR), status=500)
    assert response.json["error"] == "InternalError"
    assert "127.0.0.1:9" not in response.text
    assert nothing_written(ndb_client)


def test_a_bad_assertion_refuses_the_request_even_beside_a_good_marker(iap_app, iap, ndb_client):
    # Evidence that does not verify is never set aside for other evidence.
    forged = {HEADER: iap.assertion(audience=IAP_AUDIENCE, email=OPERATOR, rogue=True)}
    refused = iap_app.post(
        "/jobs/invoice", headers=scheduler_headers(**{"X-Appengine-Cron": "true"}, **forged), status=401
    )
    assert refused.json["message"] == SIGNATURE
    iap_app.post("/jobs/invoice", headers=scheduler_headers(**{"X-Appengine-Cron": "true"}), status=200)


def test_an_iap_identity_never_delivers(iap_app, iap, ndb_client):
    iap_app.post("/jobs/invoice", headers=scheduler_headers(**as_person(iap, OPERATOR)), status=403)
    assert nothing_written(ndb_client)


@pytest.mark.parametrize(
    "audience",
    ["", "123456789012", "/projects/acme/apps/acme-prod", "/projects/1/apps/", "/projects/1/apps/a b", "https://x"],
)
def test_a_bad_iap_audience_stops_the_app(audience):
    with pytest.raises(AuthConfigError, match="DEDUP_IAP_AUDIENCE"):
        AuthSettings.from_environ({**OFF_GAE, "DEDUP_AUTH": "appengine,iap", "DEDUP_IAP_AUDIENCE": audience})


def test_the_production_defaults_point_at_iap():
    settings = AuthSettings.from_environ({"DEDUP_AUTH": "iap", "DEDUP_IAP_AUDIENCE": IAP_AUDIENCE})
    assert settings.verifier(IapAssertions).iap_certs_url == "https://www.gstatic.com/iap/verify/public_key"
    assert settings.modes == ("iap",)
