"""dedupctl pause and resume against gunicorn, with the Cloud Scheduler stand-in (issue 24 §2).

The same command sent again (its answer lost, Cloud Scheduler failing) finishes the
work once: one pause interval, Cloud Scheduler's job paused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dedupctl.client import Exit
from tests.support.deliveries import a_day_ago
from tests.support.live import serving
from tests.support.proxies import FaultProxy

pytestmark = pytest.mark.live

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 60
"""
JOB_PATH = "projects/acme-prod/locations/us-central1/jobs/invoice-hourly"


@pytest.fixture(scope="module")
def server(emulator, google_fakes, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pauses")
    (folder / "scheduler.yaml").write_text(
        textwrap.dedent(f"""
        jobs:
          invoice-hourly:
            target: invoice
            schedule: "0 * * * *"
            project: acme-prod
            location: us-central1
            attempt_deadline: 60s
            start_at: {a_day_ago()}
        """)
    )
    env = {"DEDUP_SCHEDULER_API_BASE": google_fakes.url}
    with serving(emulator, folder, JOBS, workers=1, threads=4, quiet=True, extra_env=env) as running:
        yield running


@pytest.fixture
def proxy(server, google):
    running = FaultProxy(server.url)
    yield running
    running.close()


def dedupctl(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dedupctl", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def intervals(server) -> list[dict]:
    import requests

    listed = requests.get(f"{server.url}/api/v1/scheduler-jobs", timeout=10).json()["scheduler_jobs"]
    return [job["pause"] for job in listed]


def test_pause_with_its_answer_lost_and_scheduler_failing_once_is_one_pause(proxy, server, google):
    proxy.plan = ["drop"]  # the app paused, the answer never came back
    google.fail(":pause", status=503, api_status="UNAVAILABLE", message="try again")
    paused = dedupctl("pause", "invoice-hourly", "--note", "incident 4711", "--url", proxy.url, "--no-auth")
    assert paused.returncode == Exit.OK, paused.stderr
    answer = json.loads(paused.stdout)
    # The lost answer was the 502: the app had recorded the pause, so the retry changed nothing
    # in the app and finished Cloud Scheduler's part.
    assert answer["paused"] is True and answer["changed"] is False and answer["pause"]["note"] == "incident 4711"
    assert google.scheduler_states[JOB_PATH] == "PAUSED" and "ConnectionError" in paused.stderr
    [pause] = intervals(server)
    assert pause["note"] == "incident 4711" and pause["until"] is None

    resumed = dedupctl("resume", "invoice-hourly", "--catch-up", "latest", "--url", server.url, "--no-auth")
    assert resumed.returncode == Exit.OK, resumed.stderr
    assert json.loads(resumed.stdout)["paused"] is False
    assert json.loads(resumed.stdout)["caught_up"] == []  # the pause lasted no slot
    assert google.scheduler_states[JOB_PATH] == "ENABLED" and intervals(server) == [None]


def test_what_cannot_be_paused_is_refused(server, google):
    unknown = dedupctl("pause", "nightly", "--url", server.url, "--no-auth")
    assert unknown.returncode == Exit.REFUSED and "no Scheduler job 'nightly'" in unknown.stdout
    long_note = dedupctl("pause", "invoice-hourly", "--note", "x" * 501, "--url", server.url, "--no-auth")
    assert long_note.returncode == Exit.REFUSED and "longer than 500" in long_note.stdout
    assert intervals(server) == [None] and JOB_PATH not in google.scheduler_states
