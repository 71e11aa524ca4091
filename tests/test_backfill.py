"""dedupctl backfill: a job's missed slots run by hand, each under its Scheduler key, against
the app on gunicorn; running it again does nothing for the slots that completed."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap

import pytest
import requests

from dedup.keys import format_utc
from dedupctl.client import Exit
from tests.support.deliveries import a_day_ago, scheduler_headers
from tests.support.live import serving

pytestmark = pytest.mark.live
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = """
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 30
"""


def scheduler_yaml(effects) -> str:
    return textwrap.dedent(f"""
    jobs:
      effect-every-minute:
        target: effect
        schedule: "* * * * *"
        project: acme-prod
        location: us-central1
        attempt_deadline: 15s
        start_at: {a_day_ago()}
        body: '{json.dumps({"dir": str(effects)})}'
    """)


def dedupctl(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dedupctl", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_backfill_runs_each_missed_slot_once_and_again_runs_nothing(emulator, datastore, tmp_path):
    effects = tmp_path / "effects"
    effects.mkdir()
    (tmp_path / "scheduler.yaml").write_text(scheduler_yaml(effects))
    now = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0)
    since, until = now - datetime.timedelta(minutes=10), now - datetime.timedelta(minutes=5)
    with serving(emulator, tmp_path, JOBS, workers=1, threads=4, quiet=True) as server:
        # One slot Scheduler did deliver (late, but it ran).
        delivered = format_utc(since + datetime.timedelta(minutes=2))
        headers = scheduler_headers(scheduler_job_name="effect-every-minute", schedule_time=delivered)
        url = f"{server.url}/jobs/effect?project=acme-prod&location=us-central1"
        assert requests.post(url, data=json.dumps({"dir": str(effects)}), headers=headers, timeout=30).ok
        window = ["--url", server.url, "--no-auth", "--since", format_utc(since), "--until", format_utc(until)]

        planned = dedupctl("backfill", "effect", *window, "--dry-run")
        assert planned.returncode == Exit.OK, planned.stderr
        assert [json.loads(line)["status"] for line in planned.stdout.splitlines()] == ["missed"] * 4
        assert "completed already" in planned.stderr and len(os.listdir(effects)) == 1

        done = dedupctl("backfill", "effect", *window, "--concurrency", "2")
        assert done.returncode == Exit.OK, done.stderr
        answers = [json.loads(line) for line in done.stdout.splitlines()]
        assert [a["answer"]["status"] for a in answers] == ["completed"] * 4
        assert len(os.listdir(effects)) == 5  # one effect per slot, each once
        assert all(len((effects / name).read_text().splitlines()) == 1 for name in os.listdir(effects))

        again = dedupctl("backfill", "effect", *window)
        assert again.returncode == Exit.OK and again.stdout == ""
        assert "0 slot(s) to run" in again.stderr and again.stderr.count("completed already") == 5

        # Scheduler's own late retry of a backfilled slot is the same run.
        late = scheduler_headers(scheduler_job_name="effect-every-minute", schedule_time=answers[0]["schedule_time"])
        replay = requests.post(url, data=json.dumps({"dir": str(effects)}), headers=late, timeout=30).json()
        assert replay["duplicate"] is True and len(os.listdir(effects)) == 5


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--only", "completed"], "--only takes some of"),
        (["--concurrency", "0"], "--concurrency 1 to 16"),
    ],
)
def test_bad_backfill_arguments_are_refused(extra, words):
    refused = dedupctl(
        "backfill", "effect", "--url", "http://127.0.0.1:9", "--no-auth", "--since", "a", "--until", "b", *extra
    )
    assert refused.returncode == Exit.REFUSED and words in refused.stderr
