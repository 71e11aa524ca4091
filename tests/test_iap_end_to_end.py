"""Scripts through IAP, end to end: dedupctl → a stand-in for Identity-Aware Proxy → the app on gunicorn.

The stand-in does what IAP does for a script: it takes the caller's Google ID
token (audience: IAP's OAuth client id), refuses the request itself when the
token does not verify, drops any client-sent assertion, and forwards the
request with the ``X-Goog-IAP-JWT-Assertion`` it signs (ES256) for the token's
email.  The app runs in ``appengine,iap`` mode as a deployment would, with
one operator and one viewer service account.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys

import google.auth.jwt
import pytest
import requests

from dedupctl.client import Exit
from tests.support.callers import IAP_AUDIENCE, OFF_GAE, iap, issuer  # noqa: F401 - fixtures
from tests.support.live import serving
from tests.support.proxies import LocalServer, relay

pytestmark = pytest.mark.live

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT_ID = "123456789012-abc.apps.googleusercontent.com"  # IAP's OAuth client id: the scripts' audience
CI = "ci@acme-prod.iam.gserviceaccount.com"
READER = "reader@acme-prod.iam.gserviceaccount.com"
JOBS = """
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 30
"""


class IapFront:
    """IAP in front of the app; ``plan`` "drop" forwards a request and loses its answer."""

    def __init__(self, target: str, issuer, iap) -> None:
        self.target, self.plan = target, []
        front = self
        certs = dict(issuer.certs)

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _email(self) -> str | None:
                scheme, _, token = self.headers.get("Authorization", "").partition(" ")
                try:
                    claims = google.auth.jwt.decode(token, certs=certs, audience=CLIENT_ID)
                except (ValueError, google.auth.exceptions.GoogleAuthError):
                    return None
                return claims.get("email") if scheme == "Bearer" else None

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                email = self._email()
                if email is None:
                    self.send_response(401)  # IAP answers itself: the app never sees the request
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "x-goog-iap-jwt-assertion")
                }
                headers["X-Goog-IAP-JWT-Assertion"] = iap.assertion(audience=IAP_AUDIENCE, email=email)
                answer = requests.request(method, front.target + self.path, data=body, headers=headers, timeout=60)
                if front.plan and front.plan.pop(0) == "drop":
                    self.close_connection = True
                    return
                relay(self, answer)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

        self.local = LocalServer(Handler)
        self.url = self.local.url

    def close(self) -> None:
        self.local.close()


@pytest.fixture(scope="module")
def app_server(emulator, tmp_path_factory, iap):
    environ = {
        **OFF_GAE,  # gunicorn here plays App Engine: nothing strips X-Appengine-* headers
        "DEDUP_AUTH": "appengine,iap",
        "DEDUP_IAP_AUDIENCE": IAP_AUDIENCE,
        "DEDUP_IAP_CERTS_URL": iap.certs_url,
        "DEDUP_OPERATORS": f"serviceAccount:{CI}",
        "DEDUP_VIEWERS": f"serviceAccount:{READER}",
    }
    folder = tmp_path_factory.mktemp("iap")
    with serving(emulator, folder, JOBS, workers=1, threads=4, quiet=True, extra_env=environ) as running:
        yield running


@pytest.fixture
def front(app_server, datastore, issuer, iap):
    running = IapFront(app_server.url, issuer, iap)
    yield running
    running.close()


def dedupctl(*args, email: str | None, issuer=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEDUPCTL_ID_TOKEN": issuer.token(audience=CLIENT_ID, email=email) if email else ""}
    return subprocess.run(
        [sys.executable, "-m", "dedupctl", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def effects(directory) -> list[dict]:
    return [json.loads(line) for name in os.listdir(directory) for line in (directory / name).read_text().splitlines()]


def test_an_operator_runs_and_reads_through_iap_and_a_lost_answer_is_one_run(front, issuer, tmp_path):
    front.plan = ["drop"]
    parameters = json.dumps({"dir": str(tmp_path)})
    done = dedupctl(
        "run", "effect", "--url", front.url, "--parameters-json", parameters, "--backoff", "0.05",
        email=CI, issuer=issuer,
    )  # fmt: skip
    assert done.returncode == Exit.OK, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == "completed" and answer["requested_by"] == f"serviceAccount:{CI}"
    assert len(effects(tmp_path)) == 1  # asked twice, run once
    for email in (CI, READER):
        listed = dedupctl("runs", "list", "--url", front.url, "--job", "effect", email=email, issuer=issuer)
        assert listed.returncode == Exit.OK, listed.stderr
        assert [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == [answer["run_id"]]
        shown = dedupctl("runs", "show", answer["run_id"], "--url", front.url, email=email, issuer=issuer)
        assert json.loads(shown.stdout)["requested_by"] == f"serviceAccount:{CI}"


def test_a_viewer_cannot_run_and_a_stranger_cannot_read(front, issuer, tmp_path):
    parameters = json.dumps({"dir": str(tmp_path)})
    refused = dedupctl(
        "run", "effect", "--url", front.url, "--parameters-json", parameters, email=READER, issuer=issuer
    )
    assert refused.returncode == Exit.REFUSED, refused.stderr
    assert json.loads(refused.stdout)["error"] == "Forbidden"
    stranger = "someone@elsewhere.iam.gserviceaccount.com"
    listed = dedupctl("runs", "list", "--url", front.url, email=stranger, issuer=issuer)
    assert listed.returncode == Exit.REFUSED, listed.stderr
    assert json.loads(listed.stdout)["error"] == "Forbidden"
    unsigned = dedupctl("runs", "list", "--url", front.url, email=None)
    assert unsigned.returncode == Exit.REFUSED
    assert not os.listdir(tmp_path)


def test_going_around_iap_with_forged_evidence_is_401(app_server, iap, datastore):
    forged = iap.assertion(audience=IAP_AUDIENCE, email=CI, rogue=True)
    response = requests.post(
        f"{app_server.url}/api/v1/jobs/effect/runs",
        json={"clientToken": "around-iap"},
        headers={"X-Goog-IAP-JWT-Assertion": forged},
        timeout=30,
    )
    assert response.status_code == 401 and response.json()["message"] == "the IAP assertion's signature does not verify"
    # Nor do App Engine's unsigned signed-in-user headers name anyone behind IAP.
    forged_admin = {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": CI}
    for headers in (forged_admin, {**forged_admin, "X-Goog-IAP-JWT-Assertion": forged}):
        response = requests.post(
            f"{app_server.url}/api/v1/jobs/effect/runs", json={"clientToken": "around"}, headers=headers, timeout=30
        )
        assert response.status_code == 401, response.text
    assert requests.get(f"{app_server.url}/api/v1/runs", headers=forged_admin, timeout=30).status_code == 401
