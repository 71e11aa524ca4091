"""dedupctl: one client token, the same request repeated, the job run once; every exit code.

The retry loop alone, with scripted answers (no sleeping), and the command
against the app on gunicorn through a proxy that loses answers and plays a
front end's 503s.
"""

from __future__ import annotations

import http.server
import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator

import click
import pytest
import requests

from dedupctl.client import Exit, RetryPolicy, run_with_retries
from deploy.cli import cli as deploy_cli
from tests.support import POLL_SECONDS
from tests.support.live import serving
from tests.support.proxies import FaultProxy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Answer:
    def __init__(self, status: int, body=None, headers=None) -> None:
        self.status_code, self._body, self.headers = status, body if body is not None else {}, headers or {}
        self.text = body if isinstance(body, str) else json.dumps(self._body)

    def json(self):
        if isinstance(self._body, str):
            raise ValueError("not JSON")
        return self._body


def scripted(*answers):
    """A send() that gives the answers in turn (an exception class is raised)."""
    queue = list(answers)
    sent = []

    def send(timeout):
        sent.append(timeout)
        answer = queue.pop(0)
        if isinstance(answer, type) and issubclass(answer, Exception):
            raise answer("lost")
        return answer

    send.sent = sent
    return send


def loop(send, **policy):
    slept = []
    outcome = run_with_retries(send, RetryPolicy(**policy), sleep=slept.append, rng=random.Random(1))
    return outcome, slept


@pytest.mark.parametrize(
    "answer, exit_code",
    [
        (Answer(201, {"run_id": "r", "status": "completed"}), Exit.OK),
        (Answer(200, {"run_id": "r", "status": "completed"}), Exit.OK),
        (Answer(200, "<html>sign in</html>"), Exit.REFUSED),  # a front end's page is not a run
        (Answer(302, "", {"Location": "https://accounts.example/login"}), Exit.REFUSED),
        (Answer(422, {"error": "JobMismatch", "message": "..."}), Exit.REFUSED),  # nothing ran
        (Answer(422, {"status": "failed", "error": {"type": "PermanentJobError"}}), Exit.FAILED),
        (Answer(422, {"error": "ConflictException", "differing": ["since"]}), Exit.CONFLICT),
        (Answer(400, {"error": "InvalidParameterException"}), Exit.REFUSED),
        (Answer(401, {"error": "Unauthenticated"}), Exit.REFUSED),
        (Answer(403, {"error": "Forbidden"}), Exit.REFUSED),
        (Answer(404, {"error": "NotFound"}), Exit.REFUSED),
        (Answer(415, {"error": "UnsupportedMediaType"}), Exit.REFUSED),
    ],
)
def test_an_answer_that_settles_the_run_stops_the_loop(answer, exit_code):
    outcome, slept = loop(scripted(answer))
    assert outcome.exit == exit_code and outcome.attempts == 1 and slept == []


def test_409_waits_for_retry_after_and_the_retryable_answers_back_off_with_full_jitter():
    send = scripted(
        Answer(409, {"error": "RunInProgress"}, {"Retry-After": "7"}),
        Answer(500, {"error": "RetryableFailure"}),
        Answer(503, "Service Unavailable"),
        requests.ConnectionError,
        requests.Timeout,
        Answer(502, "Bad Gateway"),
        Answer(504, "Gateway Timeout"),
        requests.exceptions.ChunkedEncodingError,  # the body cut short: the run may have happened
        Answer(200, {"run_id": "r", "status": "completed"}),
    )
    outcome, slept = loop(send, backoff_base_seconds=1, backoff_cap_seconds=5)
    assert outcome.exit == Exit.OK and outcome.attempts == 9
    assert slept[0] == 7  # Retry-After, as the server said
    for attempt, delay in enumerate(slept[1:], start=2):
        assert 0 <= delay <= min(5, 2 ** (attempt - 1))  # full jitter under a capped exponential


def test_it_gives_up_when_attempts_or_the_deadline_run_out():
    outcome, slept = loop(scripted(*[Answer(503)] * 3), max_attempts=3)
    assert outcome.exit == Exit.GAVE_UP and outcome.attempts == 3 and len(slept) == 2
    outcome, slept = loop(scripted(Answer(409, {}, {"Retry-After": "30"}), Answer(200)), deadline_seconds=10)
    assert outcome.exit == Exit.GAVE_UP and outcome.attempts == 1 and slept == []  # waiting would pass the deadline


def test_a_front_ends_429_waits_its_retry_after_and_409_polls_use_no_attempts():
    send = scripted(
        Answer(429, "slow down", {"Retry-After": "3"}),
        *[Answer(409, {"error": "RunInProgress"}, {"Retry-After": "30"})] * 12,  # a long run, waited for
        Answer(200, {"run_id": "r", "status": "completed"}),
    )
    outcome, slept = loop(send, max_attempts=2, backoff_base_seconds=0.1)
    assert outcome.exit == Exit.OK and slept[0] == 3 and slept[1:] == [30] * 12


@pytest.mark.parametrize("policy", [{"max_attempts": 0}, {"max_attempts": -1}, {"deadline_seconds": 0}])
def test_a_policy_that_allows_no_attempt_is_refused(policy):
    with pytest.raises(ValueError):
        loop(scripted(Answer(200)), **policy)


# -- the command, against the app on gunicorn ---------------------------------------------------

LIVE_JOBS = """
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 30
  long:
    kind: python
    target: tests.job_targets:file_gate
    lease_seconds: 60
  refuse:
    kind: python
    target: tests.job_targets:refuse
"""


@pytest.fixture(scope="module")
def server(emulator, tmp_path_factory):
    with serving(emulator, tmp_path_factory.mktemp("dedupctl"), LIVE_JOBS, workers=1, threads=4, quiet=True) as running:
        yield running


@pytest.fixture
def proxy(server, datastore):
    running = FaultProxy(server.url)
    yield running
    running.close()


def dedupctl(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dedupctl", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def effects(directory) -> list[dict]:
    return [json.loads(line) for name in os.listdir(directory) for line in (directory / name).read_text().splitlines()]


def run_effect(proxy, directory, *extra):
    return dedupctl(
        "run",
        "effect",
        "--url",
        proxy.url,
        "--no-auth",
        "--backoff",
        "0.05",
        "--parameters-json",
        json.dumps({"dir": str(directory)}),
        *extra,
    )


@pytest.mark.live
def test_a_lost_answer_is_asked_again_with_the_same_token_and_the_job_runs_once(proxy, tmp_path):
    proxy.plan = ["drop"]
    done = run_effect(proxy, tmp_path)
    assert done.returncode == Exit.OK, done.stderr
    token = done.stderr.split("clientToken ")[1].split()[0]
    assert f"resume with --token {token}" in done.stderr.splitlines()[0]  # printed before the first request
    answer = json.loads(done.stdout)
    assert answer["clientToken"] == token and answer["status"] == "completed"
    assert proxy.seen == ["drop", "pass"] and len(effects(tmp_path)) == 1  # the replay is the original result
    assert answer["result"] == {"pid": effects(tmp_path)[0]["pid"], "attempt": 1}


@pytest.mark.live
def test_a_front_ends_503s_are_retried(proxy, tmp_path):
    proxy.plan = ["503", "503"]
    done = run_effect(proxy, tmp_path)
    assert done.returncode == Exit.OK, done.stderr
    assert proxy.seen == ["503", "503", "pass"] and len(effects(tmp_path)) == 1


@pytest.mark.live
def test_a_run_in_flight_is_waited_for_and_its_result_printed(proxy, server, tmp_path):
    gate = tmp_path / "gate"
    payload = {"clientToken": "in-flight-1", "parameters": {"gate_file": str(gate)}}
    first = threading.Thread(
        target=lambda: requests.post(f"{server.url}/api/v1/jobs/long/runs", json=payload, timeout=60)
    )
    first.start()
    for _ in range(200):  # the other caller's run holds the token before dedupctl asks
        if requests.get(f"{server.url}/api/v1/runs?job=long", timeout=10).json()["runs"]:
            break
        threading.Event().wait(0.05)
    threading.Timer(2.0, gate.touch).start()  # and it finishes while dedupctl waits
    done = dedupctl(
        "run",
        "long",
        "--url",
        proxy.url,
        "--no-auth",
        "--token",
        "in-flight-1",
        "--parameters-json",
        json.dumps({"gate_file": str(gate)}),
    )
    first.join(30)
    assert done.returncode == Exit.OK, done.stderr
    assert "409 in progress" in done.stderr
    assert json.loads(done.stdout)["result"] == {"gate": "open", "attempt": 1}


@pytest.mark.live
def test_every_exit_code_of_the_command(proxy, tmp_path):
    failed = dedupctl("run", "refuse", "--url", proxy.url, "--no-auth")
    assert failed.returncode == Exit.FAILED and json.loads(failed.stdout)["status"] == "failed"
    first = run_effect(proxy, tmp_path, "--token", "t-1")
    conflict = dedupctl("run", "effect", "--url", proxy.url, "--no-auth", "--token", "t-1", "--param", "x=1")
    assert first.returncode == Exit.OK and conflict.returncode == Exit.CONFLICT
    assert json.loads(conflict.stdout)["error"] == "ConflictException"
    assert dedupctl("run", "nope", "--url", proxy.url, "--no-auth").returncode == Exit.REFUSED
    assert dedupctl("run", "effect", "--url", proxy.url, "--no-auth", "--token", "bad token").returncode == Exit.REFUSED
    for bad in (["--max-attempts", "0"], ["--wait", "-5"], ["--wait", "61"], ["--deadline", "-1"]):
        assert dedupctl("run", "effect", "--url", proxy.url, "--no-auth", *bad).returncode == Exit.REFUSED, bad
    assert dedupctl("run", "effect", "--url", "not-a-url", "--no-auth").returncode == Exit.REFUSED
    no_credentials = dedupctl("run", "effect", "--url", proxy.url, env={"DEDUPCTL_ID_TOKEN": ""})
    assert no_credentials.returncode == Exit.REFUSED and "--audience" in no_credentials.stderr
    proxy.plan = ["503"] * 3
    gave_up = run_effect(proxy, tmp_path, "--token", "t-2", "--max-attempts", "2")
    assert gave_up.returncode == Exit.GAVE_UP and "resume with --token t-2" in gave_up.stderr.splitlines()[-1]
    resumed = run_effect(proxy, tmp_path, "--token", "t-2")
    assert resumed.returncode == Exit.OK and len(effects(tmp_path)) == 2  # t-1 and t-2, each once


@pytest.mark.live
def test_runs_list_and_show(proxy, server, tmp_path):
    done = run_effect(proxy, tmp_path)
    run_id = json.loads(done.stdout)["run_id"]
    listed = dedupctl("runs", "list", "--url", server.url, "--no-auth", "--job", "effect", "--limit", "5")
    assert listed.returncode == Exit.OK and [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == [run_id]
    shown = dedupctl("runs", "show", run_id, "--url", server.url, "--no-auth")
    assert shown.returncode == Exit.OK and json.loads(shown.stdout)["result"]["attempt"] == 1
    missing = dedupctl("runs", "show", "f" * 64, "--url", server.url, "--no-auth")
    assert missing.returncode == Exit.REFUSED


def test_an_id_token_from_the_environment_is_sent(tmp_path):
    """DEDUPCTL_ID_TOKEN (e.g. gcloud auth print-identity-token) becomes the bearer token."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()
    try:
        done = dedupctl(
            "runs",
            "list",
            "--url",
            f"http://127.0.0.1:{server.server_port}",
            env={"DEDUPCTL_ID_TOKEN": "eyJ.token.sig"},
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == Exit.OK and seen == ["Bearer eyJ.token.sig"]


def into_a_closed_pipe(*args, both: bool = False) -> subprocess.CompletedProcess:
    """dedupctl writing to a pipe whose reader is gone before the first byte (as `| head -c 10`
    is once it has its ten bytes); with ``both``, stderr too (`2>&1 | head`)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "dedupctl", *args],
            cwd=ROOT,
            stdout=write,
            stderr=write if both else subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)


@pytest.mark.live
def test_a_reader_that_stops_early_ends_the_output_quietly_and_the_exit_code_still_tells(proxy, server, tmp_path):
    done = run_effect(proxy, tmp_path)
    run_id = json.loads(done.stdout)["run_id"]
    for command in (["runs", "show", run_id], ["runs", "list"]):
        shown = into_a_closed_pipe(*command, "--url", server.url, "--no-auth")
        assert (shown.returncode, shown.stderr) == (Exit.OK, ""), command
    missing = into_a_closed_pipe("runs", "show", "f" * 64, "--url", server.url, "--no-auth")
    assert (missing.returncode, missing.stderr) == (Exit.REFUSED, "")
    # A run whose every line goes nowhere still runs once, and its exit code says so.
    ran = into_a_closed_pipe(
        "run",
        "effect",
        "--url",
        server.url,
        "--no-auth",
        "--parameters-json",
        json.dumps({"dir": str(tmp_path)}),
        both=True,
    )
    assert ran.returncode == Exit.OK and len(effects(tmp_path)) == 2


def command_lines() -> Iterator[tuple[str, click.Command]]:
    """Every command of dedupctl and of python -m deploy: one framework (Click), walked alike."""
    from dedupctl.cli import cli as dedupctl_cli  # here: today's failure is this test's, not the module's

    def walk(command: click.Command, path: list[str]) -> Iterator[tuple[str, click.Command]]:
        yield " ".join(path), command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    for name, group in (("dedupctl", dedupctl_cli), ("python -m deploy", deploy_cli)):
        assert isinstance(group, click.Group), name
        yield from walk(group, [name])


def test_every_commands_help_is_clean_text() -> None:
    helped = 0
    for path, command in command_lines():
        text = command.get_help(click.Context(command, info_name=path))
        assert not [line for line in text.splitlines() if "``" in line or ":func:" in line or "\b" in line], path
        helped += 1
    assert helped >= 10
    shown = subprocess.run(
        [sys.executable, "-m", "dedupctl", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and shown.stdout.startswith("Usage: python -m dedupctl ")
    assert {"run", "runs", "backfill"} <= set(shown.stdout.split()) and "``" not in shown.stdout


def test_backfill_runs_what_the_app_lets_an_operator_run():
    """The client spells out the app's statuses (it carries none of the app): they stay equal."""
    from dedupctl.backfill import FORCED, REOPENABLE
    from schedules.slots import NEEDS_FORCE, RUNNABLE

    assert set(REOPENABLE + FORCED) == set(RUNNABLE) and set(FORCED) == set(NEEDS_FORCE)


def test_backfill_says_why_it_leaves_each_other_status_alone():
    from dedupctl.backfill import LEFT_ALONE, REOPENABLE
    from schedules.slots import ExecutionStatus

    assert set(ExecutionStatus) - set(REOPENABLE) <= set(LEFT_ALONE)


def test_a_slot_queued_for_an_external_jobs_handler_is_settled_not_refused():
    """The executions API answers 202 for an external job's slot it queued (docs/jobs.md, external):
    a backfill of such a job counts it done, and a 202 that is no answer of the app's is refused."""
    from dedupctl.client import Exit, _settled

    def is_answer(body):
        return isinstance(body, dict) and "run_id" in body

    queued = {"run_id": "a" * 64, "queued": True, "already": False, "task_id": "slot-run-x", "attempt": 0}
    assert _settled(202, queued, is_answer) == Exit.OK
    assert _settled(202, "<html>sign in</html>", is_answer) == Exit.REFUSED
