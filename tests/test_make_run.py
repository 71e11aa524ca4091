"""`make run` as the README shows it: the emulator, gunicorn and the example downstream, the
curl walkthrough's delivery, and the schedule it knows (examples/local-scheduler.yaml)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from devtools.emulator import free_port

pytestmark = [pytest.mark.live, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_make_run_serves_the_walkthrough_and_knows_its_schedule():
    port, downstream = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "DATASTORE_"))}
    server = subprocess.Popen(
        [sys.executable, "-m", "devtools.serve", f"--port={port}", f"--downstream-port={downstream}"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{base}/api/v1/runs", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "make run never served"
            time.sleep(0.3)
        headers = {"X-CloudScheduler-JobName": "slow-report", "X-CloudScheduler-ScheduleTime": "2026-11-29T07:00:00Z"}
        first = requests.post(f"{base}/jobs/slow-report", data='{"seconds": 1}', headers=headers, timeout=30)
        assert first.status_code == 200 and first.json()["status"] == "completed"
        again = requests.post(f"{base}/jobs/slow-report", data='{"seconds": 1}', headers=headers, timeout=30)
        assert again.json()["duplicate"] is True
        listing = requests.get(f"{base}/api/v1/jobs/slow-report/executions", timeout=30).json()
        assert listing["scheduler_jobs"] == ["slow-report-every-5"] and len(listing["executions"]) == 288
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
