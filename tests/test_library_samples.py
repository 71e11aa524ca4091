"""Issue 38 §4-§5: the samples as people run them, on nothing but the installed wheel.

Each sample is copied beside no clone (the Flask one as docs/library.md prints it) and served
from a fresh virtualenv holding the wheel with its ``[flask]`` and ``[functions]`` extras:
``examples/library_flask_app.py`` by gunicorn (as Cloud Run serves a Flask service),
``examples/library_function.py`` by functions-framework's own server (as Cloud Run functions
serve one). Two instances of each share the emulator, as two instances of a service share its
database, and the black-box delivery cases of the app's own tests (tests/test_live_gunicorn.py)
are sent to them: concurrent duplicates, a lost answer, a release and its retry, an instance
frozen past its lease and taken over, and that instance's late finish. The downstream is a
recording server: every case checks what it was sent, one effect per execution, under one
idempotency key.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from devtools import library_wheel
from devtools.emulator import DatastoreEmulator, free_port
from devtools.packaging import ROOT, install_outside
from tests.support.downstream import Downstream, Reply

pytestmark = [pytest.mark.live, pytest.mark.slow]

LEASE_SECONDS = 3  # short, so a frozen instance's lease runs out within a test
REPORT = b'{"id": "report-1"}'


class Instance:
    """One instance of a sample: its server's whole process group, which can be frozen (SIGSTOP:
    its heartbeat stops with it, as a dead or suspended instance's does) and thawed."""

    def __init__(self, command: list[str], folder: Path, env: dict[str, str], port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = folder / f"server-{port}.log"
        with open(self.log, "wb") as written:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                command, cwd=folder, env=env, stdout=written, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_until_it_serves(command)
        except BaseException:
            self.stop()  # never left running past its test: its process group is its own
            raise

    def _wait_until_it_serves(self, command: list[str]) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.process.poll() is None:
            # gunicorn listens before its workers have imported the app: a probe may wait on them.
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                requests.get(self.url, timeout=10)  # any answer: it serves
                return
            time.sleep(0.2)
        raise AssertionError(f"{command[2]} never served: {self.log.read_text()[-3000:]}")

    def signal(self, number: int) -> None:
        os.killpg(self.process.pid, number)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=30)


SAMPLES = {
    # The Flask service on gunicorn, two workers of threads: as `gunicorn --bind :$PORT ...` on Cloud Run.
    "flask-gunicorn": (
        "library_flask_app.py",
        "/tasks/nightly-report",
        lambda port: [
            "-m",
            "gunicorn",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--threads",
            "8",
            "--worker-class",
            "gthread",
            "library_flask_app:app",
        ],
    ),  # fmt: skip
    # The function on functions-framework's server (gunicorn inside: WORKERS and THREADS set it).
    "function": (
        "library_function.py",
        "/",
        lambda port: [
            "-m",
            "functions_framework",
            "--target",
            "nightly_report",
            "--source",
            "library_function.py",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv holding the wheel with both extras (functions-framework brings gunicorn)."""
    wheel = library_wheel.build(tmp_path_factory.mktemp("wheel"))
    return install_outside(wheel, tmp_path_factory.mktemp("samples-venv"), extras=("flask", "functions"))


@pytest.fixture(scope="module")
def downstream() -> Iterator[Downstream]:
    with Downstream() as running:
        yield running


@pytest.fixture
def reports(downstream) -> Downstream:
    """The reports service the samples call, its record of calls emptied for this test."""
    downstream.requests.clear()
    downstream.script.clear()
    downstream.default = Reply(body=REPORT)
    return downstream


class Pair:
    """Two instances of one sample on one emulator, and where on them Scheduler delivers."""

    def __init__(self, kind: str, instances: list[Instance], path: str) -> None:
        self.kind, self.instances, self.path = kind, instances, path

    def deliver(self, which: int, when: str, timeout: float = 30) -> requests.Response:
        headers = {"X-CloudScheduler-JobName": f"nightly-{self.kind}", "X-CloudScheduler-ScheduleTime": when}
        return requests.post(self.instances[which].url + self.path, headers=headers, timeout=timeout)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("flask-gunicorn", "legacy"), id="flask-gunicorn"),
        pytest.param(("function", "legacy"), id="function"),
        pytest.param(("flask-gunicorn", "firestore"), id="flask-gunicorn-firestore", marks=pytest.mark.firestore),
        pytest.param(("function", "firestore"), id="function-firestore", marks=pytest.mark.firestore),
    ],
)
def pair(request, installed, downstream, tmp_path_factory) -> Iterator[Pair]:
    kind, flavor = request.param
    running: DatastoreEmulator = request.getfixturevalue("emulator" if flavor == "legacy" else "firestore_emulator")
    source, path, arguments = SAMPLES[kind]
    folder = tmp_path_factory.mktemp(f"{kind}-{flavor}")  # the user's own folder: the sample, no clone
    (folder / source).write_text(printed() if kind == "flask-gunicorn" else (ROOT / "examples" / source).read_text())
    environ = {name: value for name, value in os.environ.items() if name != "PYTHONPATH" and "DATASTORE" not in name}
    environ |= {**running.env, "REPORTS_URL": downstream.url + "/v1/reports", "WORKERS": "2", "THREADS": "8"}
    environ |= {"DEDUP_LEASE_SECONDS": str(LEASE_SECONDS)}
    instances: list[Instance] = []
    try:
        for _ in range(2):
            port = free_port()
            instances.append(Instance([str(installed / "python"), *arguments(port)], folder, environ, port))
        yield Pair(kind, instances, path)
    finally:
        for instance in instances:
            instance.stop()


def printed() -> str:
    """The one-file app docs/library.md opens with, as printed (the page's first Python block)."""
    page = (ROOT / "docs" / "library.md").read_text()
    return page.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_page_opens_with_the_flask_sample_whole():
    sample = (ROOT / "examples" / "library_flask_app.py").read_text()
    assert sample.endswith(printed()) and sample.removesuffix(printed()).strip().startswith('"""')


def slot(day: int) -> str:
    """A past slot of its own per test (the instances' memories of finished runs outlive a test)."""
    return f"2025-07-{day:02d}T02:00:00Z"


def effects(reports: Downstream) -> dict[str, int]:
    """The calls the reports service applied, by idempotency key: one per key is one effect."""
    applied: dict[str, int] = {}
    for received in reports.requests:
        key = received.headers.get("Idempotency-Key", "")
        applied[key] = applied.get(key, 0) + 1
    return applied


def test_concurrent_duplicates_on_two_instances_call_the_downstream_once(pair, reports):
    reports.default = Reply(body=REPORT, delay=1.0)  # the report takes a second: the others arrive meanwhile
    barrier = threading.Barrier(16)

    def one(index: int) -> requests.Response:
        barrier.wait()
        return pair.deliver(index % 2, slot(1))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(16)))
    ran = [a for a in answers if a.status_code == 200 and not a.json()["duplicate"]]
    assert len(ran) == 1 and ran[0].json()["result"] == {"report": "report-1", "attempt": 1}
    busy = [a for a in answers if a.status_code == 409]
    assert len(busy) + len(ran) + sum(a.json().get("duplicate") is True for a in answers) == 16
    assert all(
        int(a.headers["Retry-After"]) >= 1 and a.json()["error"] in ("RunInProgress", "RunContended") for a in busy
    )
    again = pair.deliver(1, slot(1))
    assert again.status_code == 200 and again.json()["duplicate"] and again.headers["Idempotent-Replayed"] == "true"
    assert effects(reports) == {ran[0].json()["run_id"]: 1}
    assert reports.requests[0].json() == {"night": "2025-07-01T02:00:00+00:00"}


def test_a_lost_answer_is_answered_from_the_record_without_a_second_effect(pair, reports):
    reports.default = Reply(body=REPORT, delay=2.0)
    with pytest.raises(requests.Timeout):  # Scheduler stops waiting; the instance goes on
        pair.deliver(0, slot(2), timeout=0.5)
    busy = pair.deliver(1, slot(2))
    assert busy.status_code == 409 and busy.json()["error"] == "RunInProgress"
    deadline = time.monotonic() + 30
    while (answer := pair.deliver(1, slot(2))).status_code == 409 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert answer.status_code == 200 and answer.json()["duplicate"] is True
    assert answer.json()["result"] == {"report": "report-1", "attempt": 1}
    assert effects(reports) == {answer.json()["run_id"]: 1}


def test_a_failure_is_released_and_the_retry_runs_it_as_attempt_2(pair, reports):
    reports.script = [Reply(status=503, body=b'{"error": "busy"}')]
    failed = pair.deliver(0, slot(3))
    assert failed.status_code == 500 and failed.json()["retryable"] is True
    retried = pair.deliver(1, slot(3))
    assert retried.status_code == 200 and retried.json()["result"] == {"report": "report-1", "attempt": 2}
    again = pair.deliver(0, slot(3))
    assert again.status_code == 200 and again.json()["duplicate"] and again.json()["result"]["attempt"] == 2
    # Both attempts called with the run's one key; the first was refused, so one effect.
    assert reports.keys() == [retried.json()["run_id"]] * 2
    assert [r.json() for r in reports.requests] == [{"night": "2025-07-03T02:00:00+00:00"}] * 2


def test_a_frozen_instance_is_taken_over_and_its_late_finish_refused(pair, reports):
    late = Reply(body=b'{"id": "report-late"}', delay=1.0)
    reports.script = [late]  # attempt 1's call, answered while its instance is frozen
    frozen, other = pair.instances
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(pair.deliver, 0, slot(4), 120)
        deadline = time.monotonic() + 30
        while not reports.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reports.requests, "attempt 1 never called the reports service"
        frozen.signal(signal.SIGSTOP)
        try:
            held = pair.deliver(1, slot(4))
            assert held.status_code == 409 and held.json()["error"] == "RunInProgress"  # its lease still runs
            deadline = time.monotonic() + 30
            while (takeover := pair.deliver(1, slot(4))).status_code == 409 and time.monotonic() < deadline:
                time.sleep(0.3)
        finally:
            frozen.signal(signal.SIGCONT)
        stale = first.result(timeout=60)
    assert takeover.status_code == 200 and takeover.json()["result"] == {"report": "report-1", "attempt": 2}
    # Thawed, attempt 1 finishes its call and is refused: the record stays attempt 2's.
    assert stale.status_code == 409 and stale.json()["error"] == "StaleAttempt"
    replay = pair.deliver(0, slot(4))
    assert replay.status_code == 200 and replay.json()["duplicate"] and replay.json()["result"]["attempt"] == 2
    # Two calls, one key: a downstream that honours Idempotency-Key applies the night's report once.
    assert effects(reports) == {takeover.json()["run_id"]: 2}
    assert other.process.poll() is None and frozen.process.poll() is None


GUARDED = """
import json
from flask import Flask
from google.cloud import ndb
from dedup.adapters.flask_guard import idempotent, install_guard
from dedup.clock import SystemClock
from dedup.ledger import Ledger

app = Flask("orders")
install_guard(app, Ledger(SystemClock()))
ORDERS = []


@app.post("/orders")
@idempotent("orders")
def create_order():
    ORDERS.append(1)
    return {"order": len(ORDERS)}, 201


client = ndb.Client()


def post(body):
    with client.context():
        answer = app.test_client().post("/orders", json=body, headers={"Idempotency-Key": "order-7"})
    return answer.status_code, answer.get_json(), answer.headers.get("Idempotent-Replayed")


first, again, other = post({"sku": "a"}), post({"sku": "a"}), post({"sku": "b"})
print(json.dumps({"orders": len(ORDERS), "first": first, "again": again, "other": other[:2]}))
"""


def test_the_guard_makes_an_endpoint_of_ones_own_idempotent_from_the_installed_wheel(installed, datastore, tmp_path):
    """The idempotency guard is the library's too: a Flask app with only the wheel guards its POST."""
    environ = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run(
        [str(installed / "python"), "-c", GUARDED],
        cwd=tmp_path,
        env={**environ, **datastore.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["orders"] == 1 and found["first"][:2] == [201, {"order": 1}]
    assert found["again"] == [201, {"order": 1}, "true"]  # the kept response, replayed
    assert found["other"][0] == 422 and found["other"][1]["error"] == "ConflictException"
