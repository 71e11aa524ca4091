"""Issue 20 on gunicorn and the emulator: a slot's reopen is one decision however often it is sent,
unknown slots are left to a forced decision, and concurrent audit passes report a slot once.

The reviewer's cases, each as the real client sends it: the API's same POST
twice, dedupctl backfill whose first answer is lost, dedupctl's timeout retry
of a slot run that outlives its request, and ten /tasks/audit passes at once.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import textwrap

import pytest
import requests
from google.cloud import ndb

from dedup.clock import SystemClock
from dedup.keys import format_utc
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedupctl.client import Exit
from models.audit import AuditMark
from tests.support.deliveries import a_day_ago, scheduler_headers
from tests.support.live import serving
from tests.support.proxies import FaultProxy

pytestmark = pytest.mark.live
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RETENTION = 1200  # above the minimum for a minutely job with 15 s attempts and no retries (1,035 s)
JOBS = f"""
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 15
    retention_seconds: {RETENTION}
"""


def scheduler_yaml(body: dict) -> str:
    return textwrap.dedent(f"""
    jobs:
      effect-every-minute:
        target: effect
        schedule: "* * * * *"
        project: acme-prod
        location: us-central1
        attempt_deadline: 15s
        retry: {{retry_count: 0}}
        start_at: {a_day_ago()}
        body: '{json.dumps(body)}'
    """)


@pytest.fixture
def effects_dir(tmp_path):
    folder = tmp_path / "effects"
    folder.mkdir()
    return folder


def effects(folder) -> int:
    return sum(len((folder / name).read_text().splitlines()) for name in os.listdir(folder))


def dedupctl(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dedupctl", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def minute(minutes_ago: int) -> datetime.datetime:
    now = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0)
    return now - datetime.timedelta(minutes=minutes_ago)


def deliver(server, when: datetime.datetime, body: dict) -> requests.Response:
    headers = scheduler_headers(scheduler_job_name="effect-every-minute", schedule_time=format_utc(when))
    url = f"{server.url}/jobs/effect?project=acme-prod&location=us-central1"
    return requests.post(url, data=json.dumps(body), headers=headers, timeout=30)


def slot_url(base: str, when: datetime.datetime, **query) -> str:
    fields = {"scheduler_job": "effect-every-minute", "project": "acme-prod", "location": "us-central1", **query}
    return f"{base}/api/v1/jobs/effect/executions/{format_utc(when)}/run?" + "&".join(
        f"{k}={v}" for k, v in fields.items()
    )


def test_the_same_reopen_post_twice_runs_a_failing_job_once(emulator, datastore, tmp_path, effects_dir):
    body = {"dir": str(effects_dir), "fail": True}
    (tmp_path / "scheduler.yaml").write_text(scheduler_yaml(body))
    when = minute(5)
    with serving(emulator, tmp_path, JOBS, workers=2, threads=4, quiet=True) as server:
        assert deliver(server, when, body).status_code == 422  # Scheduler's delivery: attempt 1
        answers = [requests.post(slot_url(server.url, when, attempt=1), timeout=30) for _ in range(2)]
        assert [a.status_code for a in answers] == [422, 422]
        assert [(a.json()["attempt"], a.json()["duplicate"]) for a in answers] == [(2, False), (2, True)]
        assert requests.post(slot_url(server.url, when), timeout=30).status_code == 428
        assert effects(effects_dir) == 2  # the delivery's and the one reopen's


def test_backfill_whose_first_answer_is_lost_reopens_once(emulator, datastore, tmp_path, effects_dir):
    body = {"dir": str(effects_dir), "fail": True}
    (tmp_path / "scheduler.yaml").write_text(scheduler_yaml(body))
    when = minute(5)
    with serving(emulator, tmp_path, JOBS, workers=1, threads=4, quiet=True) as server:
        assert deliver(server, when, body).status_code == 422
        proxy = FaultProxy(server.url)
        try:
            proxy.plan = ["drop"]
            window = ["--since", format_utc(when), "--until", format_utc(when + datetime.timedelta(seconds=1))]
            done = dedupctl("backfill", "effect", "--url", proxy.url, "--no-auth", "--backoff", "0.05", *window)
        finally:
            proxy.close()
        assert done.returncode == Exit.FAILED, done.stderr
        (answer,) = [json.loads(line) for line in done.stdout.splitlines()]
        assert answer["answer"]["attempt"] == 2 and answer["answer"]["duplicate"] is True
        assert proxy.seen == ["drop", "pass"] and effects(effects_dir) == 2


def test_backfills_timeout_retry_of_a_long_failing_slot_runs_it_once(emulator, datastore, tmp_path, effects_dir):
    body = {"dir": str(effects_dir), "fail": True, "sleep": 3}
    (tmp_path / "scheduler.yaml").write_text(scheduler_yaml(body))
    when = minute(5)
    with serving(emulator, tmp_path, JOBS, workers=1, threads=4, quiet=True) as server:
        failed = deliver(server, when, body)
        assert failed.status_code == 422 and effects(effects_dir) == 1
        window = ["--since", format_utc(when), "--until", format_utc(when + datetime.timedelta(seconds=1))]
        done = dedupctl(
            "backfill", "effect", "--url", server.url, "--no-auth", "--request-timeout", "1", "--backoff", "0.05",
            *window,
        )  # fmt: skip
        assert done.returncode == Exit.FAILED, done.stderr
        (answer,) = [json.loads(line) for line in done.stdout.splitlines()]
        assert answer["answer"]["attempt"] == 2 and answer["answer"]["duplicate"] is True
        # duplicate: the answer is a resend's (the first request timed out while attempt 2 ran)
        assert effects(effects_dir) == 2


def test_backfill_leaves_unknown_slots_to_a_forced_decision(emulator, datastore, tmp_path, effects_dir):
    body = {"dir": str(effects_dir)}
    (tmp_path / "scheduler.yaml").write_text(scheduler_yaml(body))
    since, until = minute(40), minute(37)  # older than the retention (20 minutes): three unknown slots
    window = ["--since", format_utc(since), "--until", format_utc(until)]
    with serving(emulator, tmp_path, JOBS, workers=1, threads=4, quiet=True) as server:
        common = ["backfill", "effect", "--url", server.url, "--no-auth", *window]
        planned = dedupctl(*common)
        assert planned.returncode == Exit.OK and planned.stdout == "", planned.stderr
        assert planned.stderr.count("older than the job's retention") == 3 and effects(effects_dir) == 0
        refused = dedupctl(*common, "--only", "unknown")
        assert refused.returncode == Exit.REFUSED and "--force" in refused.stderr
        forced = dedupctl(*common, "--only", "unknown", "--force")
        assert forced.returncode == Exit.OK, forced.stderr
        assert [json.loads(line)["answer"]["status"] for line in forced.stdout.splitlines()] == ["completed"] * 3
        assert effects(effects_dir) == 3
        again = dedupctl(*common, "--only", "unknown", "--force")
        assert again.stdout == "" and again.stderr.count("completed already") == 3 and effects(effects_dir) == 3


def test_ten_concurrent_audit_passes_report_a_missed_slot_once(emulator, datastore, tmp_path, effects_dir):
    body = {"dir": str(effects_dir)}
    (tmp_path / "scheduler.yaml").write_text(scheduler_yaml(body))
    with serving(emulator, tmp_path, JOBS, workers=2, threads=8, quiet=True) as server:
        with ndb.Client(project=emulator.project).context():
            # The audit last looked 8 minutes ago; a slot 5 minutes back still holds a live lease.
            AuditMark(
                id="acme-prod/us-central1/effect-every-minute", checked_until=minute(0) - datetime.timedelta(minutes=8)
            ).put()
            holding = requests.get(
                f"{server.url}/api/v1/jobs/effect/executions",
                params={"since": format_utc(minute(5)), "until": format_utc(minute(5) + datetime.timedelta(seconds=1))},
                timeout=30,
            ).json()["executions"][0]["run_id"]
            Ledger(SystemClock()).claim_run(holding, RunDescription("scheduler", "effect"), RunPolicy(900, RETENTION))
        cron = {"X-Appengine-Cron": "true"}
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            answers = list(
                pool.map(lambda _: requests.get(f"{server.url}/tasks/audit", headers=cron, timeout=60), range(10))
            )
        assert all(a.status_code == 200 for a in answers)
        reported = [m["schedule_time"] for a in answers for m in a.json()["missed"]]
        assert reported and len(reported) == len(set(reported))  # each missed slot once, by one pass
        assert max(reported) < format_utc(minute(5))  # none at or after the slot still running
