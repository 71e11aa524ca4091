"""`make devserver`: the app under the Cloud SDK's dev_appserver.py, app.yaml as it is.

dev_appserver enforces ``login: admin`` itself and signs people in with its
``dev_appserver_login`` cookie; the app then sees the signed-in admin as App
Engine shows it, in the shipped ``DEDUP_AUTH=appengine`` mode.  Nothing here
strips forged ``X-Appengine-*`` markers, so every server of it listens on
loopback only and the app serves only a loopback ``Host``.  dev_appserver's
virtualenv (``.devserver/``, from requirements.txt) is built before pytest
starts, by ``make devserver-venv`` (a step of ``make test``): these tests never
wait on the package index.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests

from devtools import devserver
from devtools.emulator import free_port
from handlers.auth import NOT_LOOPBACK
from tests.support import sockets

try:
    devserver.find_sdk()
    MISSING = None
except devserver.DevServerMissing as exc:
    MISSING = str(exc)

pytestmark = [
    pytest.mark.live,
    pytest.mark.slow,
    pytest.mark.skipif(MISSING is not None, reason=f"make devserver cannot run here: {MISSING}"),
]

OPERATOR = devserver.login_cookie(devserver.DEFAULT_OPERATOR)
VIEWER = devserver.login_cookie("viewer@example.com")  # an admin, not listed as an operator
TOKEN = re.compile(r'name="clientToken" value="([^"]+)"')


@pytest.fixture(scope="module")
def devserver_process():
    """`make devserver` as a reader runs it (python -m devtools.devserver), with its own emulator."""
    if not devserver.virtualenv().ready():
        pytest.fail("dev_appserver's virtualenv is not built: run make devserver-venv (make test runs it first)")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "devtools.devserver", f"--port={port}"],
        cwd=devserver.ROOT,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in server.stdout:
            if line.startswith("ready: "):
                break
        else:
            raise AssertionError(f"make devserver stopped before serving (status {server.wait()})")
        yield server, port
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0 or server.returncode == -signal.SIGTERM
        server.stdout.close()
        with pytest.raises(ProcessLookupError):  # nothing of it is left: dev_appserver, gunicorn, emulator
            os.killpg(server.pid, 0)


@pytest.fixture(scope="module")
def served(devserver_process):
    return f"http://127.0.0.1:{devserver_process[1]}"


def ledger_digest_runs(served):
    return requests.get(f"{served}/api/v1/runs?job=ledger-digest", cookies=OPERATOR, timeout=30).json()["runs"]


def test_anonymous_and_non_admin_requests_are_401_from_login_admin(served):
    assert requests.get(f"{served}/admin/", timeout=30).status_code == 401
    assert requests.post(f"{served}/jobs/ledger-digest", timeout=30).status_code == 401
    non_admin = devserver.login_cookie("someone@example.com", admin=False)
    assert requests.get(f"{served}/admin/", cookies=non_admin, timeout=30).status_code == 401


def test_a_signed_in_admin_sees_the_dashboard_and_only_an_operator_its_buttons(served):
    viewer_page = requests.get(f"{served}/admin/", cookies=VIEWER, timeout=30)
    assert viewer_page.status_code == 200 and "Run now" not in viewer_page.text
    operator_page = requests.get(f"{served}/admin/", cookies=OPERATOR, timeout=30)
    assert operator_page.status_code == 200 and "Run now" in operator_page.text


def test_an_operators_dashboard_action_is_one_run(served):
    page = requests.get(f"{served}/admin/", cookies=OPERATOR, timeout=30).text
    card = page.split('data-job="ledger-digest"', 1)[1]
    link = re.search(r'class="run-now[^"]*" href="([^"]+)"', card).group(1).replace("&amp;", "&")
    confirmation = requests.get(f"{served}{link}", cookies=OPERATOR, timeout=30).text
    form = {"clientToken": TOKEN.search(confirmation).group(1), "parameters": "{}"}
    headers = {"Sec-Fetch-Site": "same-origin"}
    answers = [
        requests.post(
            f"{served}/admin/jobs/ledger-digest/run",
            data=form,
            cookies=OPERATOR,
            headers=headers,
            allow_redirects=False,
            timeout=60,
        )
        for _ in range(2)  # a double click
    ]
    assert [a.status_code for a in answers] == [303, 303], answers[0].text[-1500:]
    assert answers[0].headers["Location"].split("?")[0] == answers[1].headers["Location"].split("?")[0]
    location = answers[0].headers["Location"].split("?")[0]
    run_url = f"{served}/api/v1/runs/{location.rsplit('/', 1)[1]}"
    deadline = time.monotonic() + 60  # queued: the app's in-process queue runs it (DEDUP_TASKS_QUEUE is unset)
    while (answer := requests.get(run_url, cookies=OPERATOR, timeout=30)).status_code == 404 or answer.json()[
        "status"
    ] == "in_progress":
        assert time.monotonic() < deadline, "the queued run never finished"
        time.sleep(0.2)
    run = answer.json()
    assert (run["status"], run["requested_by"]) == ("completed", "user:test@example.com")
    assert [r["run_id"] for r in ledger_digest_runs(served)].count(run["run_id"]) == 1
    refused = requests.post(
        f"{served}/admin/jobs/ledger-digest/run",
        data={"clientToken": "another", "parameters": "{}"},
        cookies=VIEWER,
        headers=headers,
        timeout=30,
    )
    assert refused.status_code == 403


def test_a_cross_site_post_is_403(served):
    before = ledger_digest_runs(served)
    response = requests.post(
        f"{served}/admin/jobs/ledger-digest/run",
        data={"clientToken": "cross", "parameters": "{}"},
        cookies=OPERATOR,
        headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
        timeout=30,
    )
    assert response.status_code == 403 and response.json()["error"] == "Forbidden"
    assert ledger_digest_runs(served) == before


def test_every_server_of_it_listens_on_loopback_only(devserver_process):
    """dev_appserver, the gunicorn behind it (app.yaml binds every interface) and the emulator."""
    server, port = devserver_process
    listening = sockets.listening(sockets.process_tree(server.pid))
    assert ("127.0.0.1", port) in listening and len(listening) >= 3, listening  # with gunicorn and the emulator
    assert [address for address, _ in listening if not sockets.is_loopback(address)] == []
    for address in sockets.non_loopback_addresses():
        assert [p for _, p in listening if sockets.reachable(address, p)] == [], address


REBOUND = ["rebound.example", "127.0.0.1.nip.io", "192.0.2.2", "[fd00::2]"]


def forged(host, port):
    """A page by DNS rebinding, or anyone nearby: another name in Host, App Engine's markers forged."""
    return {
        "Host": f"{host}:{port}",
        "X-Appengine-Cron": "true",
        "X-Appengine-User-Ip": "0.1.0.2",
        "X-Appengine-User-Is-Admin": "1",
        "X-Appengine-User-Email": devserver.DEFAULT_OPERATOR,
    }


@pytest.mark.parametrize("host", REBOUND)
def test_dev_appserver_serves_no_other_name(served, host):
    """Its own front end refuses a Host it does not serve (400) or the app does (401); nothing runs."""
    before = ledger_digest_runs(served)
    headers = forged(host, served.rsplit(":", 1)[1])
    answers = [
        requests.post(f"{served}/jobs/ledger-digest", headers=headers, cookies=OPERATOR, timeout=30),
        requests.get(f"{served}/api/v1/runs", headers=headers, cookies=OPERATOR, timeout=30),
        requests.post(
            f"{served}/api/v1/jobs/ledger-digest/runs", json={}, headers=headers, cookies=OPERATOR, timeout=30
        ),
    ]
    assert {a.status_code for a in answers} <= {400, 401}, [(a.status_code, a.text) for a in answers]
    assert ledger_digest_runs(served) == before


@pytest.mark.parametrize("host", REBOUND)
def test_the_gunicorn_behind_it_serves_forged_markers_to_loopback_only(served, devserver_process, host):
    """dev_appserver passes forged markers on; its gunicorn, reached directly, refuses any other name (401)."""
    server, _ = devserver_process
    gunicorn = sockets.running(sockets.process_tree(server.pid), "gunicorn")
    [port] = {port for _, port in sockets.listening(gunicorn)}
    before = ledger_digest_runs(served)
    base = f"http://127.0.0.1:{port}"
    answers = [
        requests.post(f"{base}/jobs/ledger-digest", headers=forged(host, port), timeout=30),
        requests.get(f"{base}/api/v1/runs", headers=forged(host, port), timeout=30),
        requests.post(f"{base}/api/v1/jobs/ledger-digest/runs", json={}, headers=forged(host, port), timeout=30),
        requests.get(f"{base}/admin/", headers=forged(host, port), timeout=30),
    ]
    assert [(a.status_code, a.json()["message"]) for a in answers] == [(401, NOT_LOOPBACK)] * len(answers)
    assert ledger_digest_runs(served) == before
    signed_in = {k: v for k, v in forged("127.0.0.1", port).items() if k != "X-Appengine-Cron" and "Ip" not in k}
    assert requests.get(f"{base}/api/v1/runs", headers=signed_in, timeout=30).status_code == 200  # loopback: served
