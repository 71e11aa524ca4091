"""Malformed credentials are a 401, never a 500.

Whatever an unauthenticated caller presents as an ID token (oversized, badly
encoded, nested deep enough to exhaust the JSON parser, JSON that is not an
object, claims of the wrong type, a signature by the wrong key or algorithm)
is answered 401 with a fixed message that echoes neither the token nor the
configuration, logged as one WARNING line without a traceback, and writes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

import pytest

from tests.support.callers import (  # noqa: F401 (issuer and oidc_app are fixtures)
    AUDIENCE,
    CALLER,
    app_with,
    issuer,
    nothing_written,
    oidc_app,
)
from tests.support.deliveries import scheduler_headers
from tests.support.oidc import segment
from tests.support.problems import code_and_message

OTHER_CALLER = "other@acme-prod.iam.gserviceaccount.com"  # the second allowed email of oidc_app
DEPTH = 1200  # deeper than 3.11's parser goes (its recursion limit of 1000), far deeper than a token may nest

TOO_LARGE = "the ID token is too large"
MALFORMED = "the ID token is malformed"
SIGNATURE = "the ID token's signature does not verify"
EXPIRED = "the ID token has expired or is not valid yet"
AUDIENCE_WRONG = "the ID token has the wrong audience"
ISSUER_WRONG = "the ID token's issuer is not Google"


def nested(text: str) -> bytes:
    """JSON nested deeper than a token may be: on 3.11 it exhausts the parser's stack, on 3.13 it
    parses, and either way it is malformed (checked here, so the case tests what it says)."""
    from dedup.json_depth import nesting_depth_exceeds
    from dedup.signed_tokens import MAX_TOKEN_JSON_DEPTH

    try:
        assert nesting_depth_exceeds(json.loads(text), MAX_TOKEN_JSON_DEPTH)
    except RecursionError:
        pass
    return text.encode()


def arrays(depth: int = DEPTH) -> str:
    return "[" * depth + "]" * depth


def objects(depth: int = 1100) -> str:
    # {"":{"":...}} is 5 bytes a level: 1,100 levels keep the token under the size cap.
    return '{"":' * depth + "0" + "}" * depth


def good(issuer, **extra) -> str:
    """A token that is accepted, but for ``extra`` claims replaced or added."""
    return issuer.token(audience=AUDIENCE, email=CALLER, extra=extra)


def with_payload(issuer, payload: bytes) -> str:
    """A well-formed header, then ``payload`` as the payload segment, validly signed."""
    return issuer.signed(segment(issuer.header()), segment(payload))


def with_header(issuer, header: bytes) -> str:
    """``header`` as the header segment, then a well-formed payload, validly signed."""
    return issuer.signed(segment(header), segment(issuer.claims(audience=AUDIENCE, email=CALLER)))


def replaced(token: str, index: int, value: str) -> str:
    """``token`` with its segment ``index`` (0 header, 1 payload, 2 signature) replaced."""
    segments = token.split(".")
    segments[index] = value
    return ".".join(segments)


def spliced(token: str, index: int, junk: str) -> str:
    """``junk`` inside segment ``index``; Python's lenient base64 would skip it."""
    value = token.split(".")[index]
    return replaced(token, index, value[:10] + junk + value[10:])


def in_signature(token: str, junk: str) -> str:
    return spliced(token, 2, junk)


def hs256(issuer) -> str:
    """The classic algorithm confusion: HMAC keyed with the public certificate."""
    signing_input = f"{segment(issuer.header(alg='HS256'))}.{segment(issuer.claims(audience=AUDIENCE, email=CALLER))}"
    mac = hmac.new(issuer.certificate_pem.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{segment(mac)}"


def unsigned(issuer, signature: str) -> str:
    header = segment(issuer.header(alg="none"))
    return f"{header}.{segment(issuer.claims(audience=AUDIENCE, email=CALLER))}.{signature}"


NOT_OBJECTS = {
    "an-array": b"[]",
    "a-list-of-strings": b'["alg", "RS256"]',
    "a-number": b"5",
    "a-string": b'"RS256"',
    "null": b"null",
    "true": b"true",
    "not-json": b"not json",
    "empty": b"",
}

# (id, Authorization header value built from the issuer, the message expected).
CASES = [
    # JSON nested past the parser's stack, in either segment, even inside an object or validly signed.
    ("header-nested-arrays", lambda i: "Bearer " + with_header(i, nested(arrays())), MALFORMED),
    (
        "header-nested-in-object",
        lambda i: "Bearer " + with_header(i, nested('{"alg": "RS256", "kid": "test-key-1", "x": ' + arrays() + "}")),
        MALFORMED,
    ),
    ("payload-nested-arrays", lambda i: "Bearer " + with_payload(i, nested(arrays())), MALFORMED),
    ("payload-nested-objects", lambda i: "Bearer " + with_payload(i, nested(objects())), MALFORMED),
    # One level past the app's own limit, far short of any parser's: malformed on every Python.
    ("payload-one-level-too-deep", lambda i: "Bearer " + with_payload(i, nested(objects(17))), MALFORMED),
    (
        "payload-nested-in-claim",
        lambda i: (
            "Bearer " + with_payload(i, nested('{"iss": "https://accounts.google.com", "groups": ' + arrays() + "}"))
        ),
        MALFORMED,
    ),
    ("lowercase-bearer-nested", lambda i: "bearer " + with_payload(i, nested(arrays())), MALFORMED),
    # Segments that are not base64url, not UTF-8, not JSON, or not a JSON object.
    *[
        (f"header-is-{name}", lambda i, v=value: "Bearer " + with_header(i, v), MALFORMED)
        for name, value in NOT_OBJECTS.items()
    ],
    *[
        (f"payload-is-{name}", lambda i, v=value: "Bearer " + with_payload(i, v), MALFORMED)
        for name, value in NOT_OBJECTS.items()
    ],
    ("header-not-utf8", lambda i: "Bearer " + with_header(i, b'{"alg": "RS256", "kid": "\xff\xfe"}'), MALFORMED),
    ("payload-not-utf8", lambda i: "Bearer " + with_payload(i, b'{"email": "\xc3\x28"}'), MALFORMED),
    ("payload-latin1", lambda i: "Bearer " + with_payload(i, '{"email": "é"}'.encode("latin-1")), MALFORMED),
    ("base64-impossible-length", lambda i: "Bearer " + replaced(good(i), 2, "AAAAA"), MALFORMED),
    ("base64-standard-alphabet", lambda i: "Bearer " + in_signature(good(i), "+/"), MALFORMED),
    ("base64-padding", lambda i: "Bearer " + good(i) + "==", MALFORMED),
    ("base64-junk-character", lambda i: "Bearer " + in_signature(good(i), "!"), MALFORMED),
    ("control-character", lambda i: "Bearer " + in_signature(good(i), "\x00"), MALFORMED),
    ("delete-character", lambda i: "Bearer " + in_signature(good(i), "\x7f"), MALFORMED),
    ("non-ascii-character", lambda i: "Bearer " + in_signature(good(i), "é"), MALFORMED),
    ("newline-in-header-segment", lambda i: "Bearer " + spliced(good(i), 0, "\n"), MALFORMED),
    # The wrong number of segments, or empty ones.
    ("one-segment", lambda i: "Bearer " + good(i).replace(".", ""), MALFORMED),
    ("two-segments", lambda i: "Bearer " + good(i).rsplit(".", 1)[0], MALFORMED),
    ("four-segments", lambda i: "Bearer " + good(i) + "." + segment(b"more"), MALFORMED),
    ("only-dots", lambda i: "Bearer ..", MALFORMED),
    ("empty-header-segment", lambda i: "Bearer " + replaced(good(i), 0, ""), MALFORMED),
    ("empty-payload-segment", lambda i: "Bearer " + replaced(good(i), 1, ""), MALFORMED),
    ("empty-signature-segment", lambda i: "Bearer " + replaced(good(i), 2, ""), MALFORMED),
    # Larger than any ID token: refused before decoding, even if validly signed.
    ("signed-but-over-the-cap", lambda i: "Bearer " + good(i, padding="x" * 8 * 1024), TOO_LARGE),
    ("several-megabytes", lambda i: "Bearer " + "A" * 5_000_000 + "." + "A" * 4 + "." + "A" * 4, TOO_LARGE),
    (
        "several-megabytes-of-nesting",
        lambda i: "Bearer " + with_payload(i, b"[" * 3_000_000 + b"]" * 3_000_000),
        TOO_LARGE,
    ),
    # Validly signed, but the claims have the wrong types (or impossible values).
    ("exp-a-string", lambda i: "Bearer " + good(i, exp="soon"), MALFORMED),
    ("exp-null", lambda i: "Bearer " + good(i, exp=None), MALFORMED),
    ("exp-a-boolean", lambda i: "Bearer " + good(i, exp=True), MALFORMED),
    ("exp-infinite", lambda i: "Bearer " + good(i, exp=float("inf")), MALFORMED),
    ("exp-nan", lambda i: "Bearer " + good(i, exp=float("nan")), MALFORMED),
    ("iat-a-list", lambda i: "Bearer " + good(i, iat=[1]), MALFORMED),
    ("iat-an-object", lambda i: "Bearer " + good(i, iat={"seconds": 1}), MALFORMED),
    ("aud-a-number", lambda i: "Bearer " + good(i, aud=5), MALFORMED),
    ("aud-a-list", lambda i: "Bearer " + good(i, aud=[AUDIENCE]), MALFORMED),
    ("iss-a-list", lambda i: "Bearer " + good(i, iss=["https://accounts.google.com"]), MALFORMED),
    ("iss-an-object", lambda i: "Bearer " + good(i, iss={"https://accounts.google.com": True}), MALFORMED),
    ("email-an-object", lambda i: "Bearer " + good(i, email={"a": 1}), MALFORMED),
    ("email-a-list", lambda i: "Bearer " + good(i, email=[CALLER]), MALFORMED),
    ("email-verified-a-string", lambda i: "Bearer " + good(i, email_verified="true"), MALFORMED),
    ("email-verified-a-number", lambda i: "Bearer " + good(i, email_verified=1), MALFORMED),
    ("kid-a-list", lambda i: "Bearer " + i.token(audience=AUDIENCE, email=CALLER, header={"kid": [i.kid]}), MALFORMED),
    # Signed by a key no published certificate holds, or not as RS256.
    (
        "unknown-key-id",
        lambda i: "Bearer " + i.token(audience=AUDIENCE, email=CALLER, header={"kid": "nobody"}),
        SIGNATURE,
    ),
    ("rogue-key", lambda i: "Bearer " + i.token(audience=AUDIENCE, email=CALLER, rogue=True), SIGNATURE),
    (
        "another-tokens-signature",
        lambda i: "Bearer " + replaced(good(i), 2, i.token(audience=AUDIENCE, email=OTHER_CALLER).split(".")[2]),
        SIGNATURE,
    ),
    ("alg-none-unsigned", lambda i: "Bearer " + unsigned(i, ""), MALFORMED),
    ("alg-none-with-signature", lambda i: "Bearer " + unsigned(i, segment(b"x" * 32)), SIGNATURE),
    ("alg-hs256", lambda i: "Bearer " + hs256(i), SIGNATURE),
    ("alg-es256", lambda i: "Bearer " + i.token(audience=AUDIENCE, email=CALLER, header={"alg": "ES256"}), SIGNATURE),
    (
        "alg-a-list",
        lambda i: "Bearer " + i.token(audience=AUDIENCE, email=CALLER, header={"alg": ["RS256"]}),
        SIGNATURE,
    ),
    ("alg-missing", lambda i: "Bearer " + with_header(i, b'{"kid": "test-key-1"}'), SIGNATURE),
    # Well-formed and signed, but not for this app: still no configured value in the answer.
    ("wrong-audience", lambda i: "Bearer " + i.token(audience=AUDIENCE + "/other", email=CALLER), AUDIENCE_WRONG),
    ("not-yet-valid", lambda i: "Bearer " + i.token(audience=AUDIENCE, email=CALLER, issued_ago=-3600), EXPIRED),
    ("expired", lambda i: "Bearer " + i.token(audience=AUDIENCE, email=CALLER, issued_ago=7200), EXPIRED),
    (
        "wrong-issuer",
        lambda i: "Bearer " + i.token(audience=AUDIENCE, email=CALLER, issuer="https://evil.example"),
        ISSUER_WRONG,
    ),
]


@pytest.mark.sample(12)
@pytest.mark.parametrize("build, message", [pytest.param(b, m, id=c) for c, b, m in CASES])
def test_malformed_credentials_are_401_never_500(oidc_app, ndb_client, issuer, caplog, build, message):
    authorization = build(issuer)
    caplog.clear()
    response = oidc_app.post(
        "/jobs/invoice", headers=scheduler_headers(Authorization=authorization), expect_errors=True
    )
    assert response.status_int == 401, response.text[:500]
    assert code_and_message(response.json) == {"error": "Unauthenticated", "message": message}
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    for configured in (AUDIENCE, CALLER, OTHER_CALLER, issuer.certs_url):
        assert configured not in response.text
    assert nothing_written(ndb_client)
    refusals = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(refusals) <= 1 and all(r.levelno == logging.WARNING for r in refusals), refusals
    assert not any(r.exc_info for r in caplog.records)


def test_malformed_tokens_are_401_even_when_certificates_cannot_be_fetched(
    datastore, ndb_client, jobs_file, clock, issuer
):
    # Parsing comes before fetching certificates: a bad token is the caller's fault whatever
    # Google's endpoint does; a well-formed one still cannot be checked, so it stays a 500.
    app = app_with(
        {
            "DEDUP_AUTH": "oidc",
            "DEDUP_OIDC_AUDIENCE": AUDIENCE,
            "DEDUP_OIDC_ALLOWED_EMAILS": CALLER,
            "DEDUP_OIDC_CERTS_URL": "http://127.0.0.1:1/oauth2/v1/certs",
        },
        datastore,
        ndb_client,
        jobs_file,
        clock,
    )
    deep = with_payload(issuer, nested(arrays()))
    response = app.post("/jobs/invoice", headers=scheduler_headers(Authorization=f"Bearer {deep}"), status=401)
    assert code_and_message(response.json) == {"error": "Unauthenticated", "message": MALFORMED}
    response = app.post("/jobs/invoice", headers=scheduler_headers(Authorization=f"Bearer {good(issuer)}"), status=500)
    assert response.json["error"] == "InternalError"
    assert "127.0.0.1" not in response.text and AUDIENCE not in response.text  # the details are logged only
    assert nothing_written(ndb_client)
