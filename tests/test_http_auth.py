"""``http`` jobs with ``auth``: an ID token of the app's service account on every call (issue 40 §1).

The token comes as on App Engine: google-auth's ``fetch_id_token`` asks the metadata server
(devtools/google_fakes.py, minting with a local issuer) for one audience.  The service called
verifies it as Cloud Run and IAP do, with google-auth against the issuer's keys served locally:
signature, audience and expiry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import google.auth.exceptions
import google.auth.transport.requests
import google.oauth2.id_token
import pytest

from devtools.google_fakes import SERVICE_ACCOUNT
from devtools.json_server import JsonServer
from jobs.config import parse_jobs
from jobs.errors import JobsConfigError
from jobs.id_tokens import ID_TOKENS
from tests.support.deliveries import scheduler_headers
from tests.support.oidc import TokenIssuer

IAP_CLIENT_ID = "1234567890-abcdefghij.apps.googleusercontent.com"


class VerifyingService:
    """A service that answers 200 only to a valid ID token for ``audience`` (else 401), recording
    the claims of each token it took and the Authorization header of each call."""

    def __init__(self, issuer: TokenIssuer) -> None:
        self.audience = ""
        self.accepted: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.authorizations: list[str] = []
        self.issuer = issuer
        self.revoked: set[str] = set()  # tokens refused though valid: signed by a key since rotated out
        self.local = JsonServer(self._answer, ("POST",))
        self.url = self.local.url

    def _answer(self, method: str, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        header = headers.get("Authorization", "")
        self.authorizations.append(header)
        try:
            if not header.startswith("Bearer "):
                raise ValueError("no bearer token")
            if header.removeprefix("Bearer ") in self.revoked:
                raise ValueError("signed by a key no longer published")
            claims = google.oauth2.id_token.verify_token(
                header.removeprefix("Bearer "),
                google.auth.transport.requests.Request(),
                audience=self.audience,
                certs_url=self.issuer.certs_url,
            )
        except (ValueError, google.auth.exceptions.GoogleAuthError) as exc:
            self.refused.append(str(exc))
            return 401, {"error": "unauthenticated"}
        self.accepted.append(claims)
        return 200, {"ok": True}


@pytest.fixture(scope="module")
def issuer() -> Iterator[TokenIssuer]:
    minted = TokenIssuer()
    yield minted
    minted.close()


@pytest.fixture
def service(issuer) -> Iterator[VerifyingService]:
    running = VerifyingService(issuer)
    yield running
    running.local.close()


@pytest.fixture
def minted(google, issuer) -> list[str]:
    """The metadata server mints tokens of an hour for the app's service account; each one is listed."""
    tokens: list[str] = []

    def mint(audience: str) -> str:
        tokens.append(issuer.token(audience=audience, email=SERVICE_ACCOUNT, lifetime=minted_lifetime[0]))
        return tokens[-1]

    google.id_token_for = mint
    ID_TOKENS.clear()
    yield tokens
    ID_TOKENS.clear()


minted_lifetime = [3600]


@pytest.fixture
def lifetime():
    """The lifetime of the tokens the metadata server mints in this test."""
    yield minted_lifetime
    minted_lifetime[0] = 3600


def jobs(service: VerifyingService, auth: str) -> str:
    return f"""
        jobs:
          sync:
            kind: http
            url: {service.url}/hooks/sync?src=scheduler
            timeout_seconds: 5
            lease_seconds: 30
            auth: {auth}
    """


def deliver(client, hour: int = 0, status: Any = "*"):
    return client.post(
        "/jobs/sync?project=acme-prod&location=us-central1",
        b"{}",
        headers=scheduler_headers(schedule_time=f"2030-01-01T{hour:02d}:00:00Z"),
        status=status,
    )


def identity_fetches(google) -> int:
    return len([call for call in google.calls if call.path.endswith("/identity")])


def test_oidc_by_default_is_for_the_urls_origin_as_cloud_run_checks_it(make_client, service, minted, google):
    service.audience = service.url  # scheme, host and port: a Cloud Run service's URL
    client = make_client(jobs(service, "{kind: oidc}"))
    assert deliver(client).status_int == 200
    [claims] = service.accepted
    assert claims["aud"] == service.url and claims["email"] == SERVICE_ACCOUNT
    [fetch] = [call for call in google.calls if call.path.endswith("/identity")]
    assert fetch.query["audience"] == service.url


def test_oidc_for_a_given_audience(make_client, service, minted):
    service.audience = "https://sync.internal.acme.dev"
    client = make_client(jobs(service, "{kind: oidc, audience: 'https://sync.internal.acme.dev'}"))
    assert deliver(client).status_int == 200 and service.accepted[0]["aud"] == "https://sync.internal.acme.dev"


def test_iap_is_a_token_for_the_oauth_client_id(make_client, service, minted):
    service.audience = IAP_CLIENT_ID
    client = make_client(jobs(service, f"{{kind: iap, audience: '{IAP_CLIENT_ID}'}}"))
    assert deliver(client).status_int == 200 and service.accepted[0]["aud"] == IAP_CLIENT_ID


def test_none_and_no_auth_send_no_token(make_client, service, minted, google):
    service.audience = service.url
    for auth in ("{kind: none}", "null"):
        client = make_client(jobs(service, auth))
        assert deliver(client, hour=len(service.authorizations)).status_int == 422  # the service wants one
    assert service.authorizations == ["", ""] and identity_fetches(google) == 0


def test_a_token_is_reused_until_shortly_before_it_expires(make_client, service, minted, google, lifetime):
    service.audience = service.url
    client = make_client(jobs(service, "{kind: oidc}"))
    for hour in range(3):
        assert deliver(client, hour=hour).status_int == 200
    assert identity_fetches(google) == 1 and len(set(service.authorizations)) == 1
    # Tokens of two minutes: inside google-auth's refresh margin, so each call asks for a new one.
    ID_TOKENS.clear()
    lifetime[0] = 120
    for hour in range(3, 6):
        assert deliver(client, hour=hour).status_int == 200
    assert identity_fetches(google) == 1 + 3 and len(service.accepted) == 6


def test_a_refused_token_fails_the_run_and_is_not_kept(make_client, service, minted, google):
    service.audience = "https://another-service.run.app"  # the job names the wrong audience
    client = make_client(jobs(service, "{kind: oidc}"))
    failed = deliver(client, status=422).json
    assert "answered 401" in failed["error"]["message"] and service.accepted == []
    assert "audience" in service.refused[0].lower()
    deliver(client, hour=1, status=422)
    assert identity_fetches(google) == 2  # forgotten after the 401: the next run asked anew


def test_no_identity_to_be_had_is_retryable_and_names_the_audience(make_client, service, minted, google):
    google.id_token_for = None  # the metadata server has no identity endpoint for it
    service.audience = service.url
    client = make_client(jobs(service, "{kind: oidc}"))
    answer = deliver(client, status=500).json
    cause = answer["cause"]["message"]
    assert cause.startswith(f"no ID token for the audience {service.url!r}: Failed to retrieve http://")
    assert "Status: 404" in cause and "object at" not in cause
    assert service.authorizations == []


def test_the_token_is_never_logged_nor_stored(make_client, service, minted, caplog):
    caplog.set_level(logging.DEBUG)
    service.audience = service.url
    client = make_client(jobs(service, "{kind: oidc}"))
    run_id = deliver(client, status=200).json["run_id"]
    [token] = minted
    record = client.get(f"/api/v1/runs/{run_id}").text
    assert token not in record and token not in caplog.text
    assert token.split(".")[2] not in record + caplog.text  # not even its signature


@pytest.mark.parametrize(
    "auth, expected",
    [
        ("{kind: iap}", "field 'auth.audience': an iap token needs the OAuth client id"),
        ("{kind: none, audience: x}", "field 'auth.audience': none sends no token"),
        ("{kind: oidc, audience: ''}", "field 'auth.audience': must be a non-empty string"),
        ("{kind: basic}", "field 'auth.kind': must be 'oidc', 'iap' or 'none'"),
        ("oidc", "field 'auth': must be a mapping"),
        ("{kind: oidc, service_account: a@b.iam.gserviceaccount.com}", "field 'auth.service_account'"),
    ],
)
def test_a_bad_auth_block_is_refused_saying_what_to_write(auth, expected):
    with pytest.raises(JobsConfigError) as caught:
        parse_jobs(f"jobs:\n  sync:\n    kind: http\n    url: https://sync.acme.dev/run\n    auth: {auth}\n")
    assert expected in str(caught.value)


def test_a_configured_authorization_header_and_a_token_are_one_too_many():
    with pytest.raises(JobsConfigError) as caught:
        parse_jobs(
            "jobs:\n  sync:\n    kind: http\n    url: https://sync.acme.dev/run\n    auth: {kind: oidc}\n"
            "    headers: {authorization: Bearer static}\n"
        )
    assert "field 'headers': 'Authorization' is set by auth" in str(caught.value)
    # Without auth, a static Authorization header (an API key) is the job's own to send.
    parse_jobs(
        "jobs:\n  sync:\n    kind: http\n    url: https://sync.acme.dev/run\n    headers: {Authorization: Bearer k}\n"
    )


def test_a_kept_token_refused_is_replaced_and_the_call_made_once_more(make_client, service, minted, google, lifetime):
    """A kept token the service no longer takes (its key rotated, a clock apart): a 401 means the
    service did nothing, so the call is made again at once with a new token, not failed."""
    service.audience = service.url
    client = make_client(jobs(service, "{kind: oidc}"))
    assert deliver(client, hour=0).status_int == 200
    service.revoked.add(minted[0])
    lifetime[0] = 3599  # the new token differs from the old (tokens of one second are alike)
    assert deliver(client, hour=1).status_int == 200
    assert identity_fetches(google) == 2 and len(service.authorizations) == 3  # one call refused, made again
    assert service.authorizations[1] == f"Bearer {minted[0]}" and service.authorizations[2] == f"Bearer {minted[1]}"


def test_fetching_a_token_spends_the_calls_time_and_never_more(make_client, service, minted, google):
    """A metadata server slower than the call's timeout: the run is released for a retry, the
    service never called, and the fetch gave up with the call's time."""
    import time as clock

    slow = google.id_token_for

    def late(audience: str) -> str:
        clock.sleep(3)
        return slow(audience)

    google.id_token_for = late
    service.audience = service.url
    client = make_client(jobs(service, "{kind: oidc}").replace("timeout_seconds: 5", "timeout_seconds: 1"))
    answer = deliver(client, status=500).json
    assert answer["cause"]["message"].startswith(f"no ID token for the audience {service.url!r}")
    assert service.authorizations == []
