"""`make run` as the README shows it: the emulator, gunicorn and the example downstream, the
curl walkthrough's delivery, and the schedule it knows (examples/local-scheduler.yaml); its
ports as settings (PORT, DOWNSTREAM_PORT, EMULATOR_PORT), a port in use named before anything
starts, and the ready line once the app answers."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse

import pytest
import requests
import yaml

from devtools import serve
from devtools.emulator import free_port
from jobs.config import load_jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What make run is given: none of the caller's own settings, the ports only as the test says.
ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("DEDUP_", "DATASTORE_")) and k not in ("PORT", "DOWNSTREAM_PORT", "EMULATOR_PORT")
}


def make_run(**settings: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "devtools.serve"],
        cwd=ROOT,
        env={**ENV, **{name: str(value) for name, value in settings.items()}},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lines_of(stream) -> queue.Queue:
    """Every line ``stream`` writes, read on a thread (so a full pipe never stalls the servers)."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        with stream:  # closed at its end, by the one thread that reads it
            for line in stream:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def ready_line(server: subprocess.Popen) -> str:
    """The line ``server`` says it serves with (its output read on threads meanwhile)."""
    lines_of(server.stderr)
    output = lines_of(server.stdout)
    while (line := output.get(timeout=150)) is not None and not line.startswith("ready: "):
        pass
    assert line is not None, "make run never served"
    return line


def refused(server: subprocess.Popen) -> str:
    """What ``server`` wrote on stderr as it exited with status 1; it is stopped if it served instead."""
    try:
        _, err = server.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
        raise AssertionError("make run started instead of refusing") from None
    assert server.returncode == 1, err
    return err


@pytest.mark.live
@pytest.mark.slow
def test_make_run_serves_the_walkthrough_and_knows_its_schedule():
    port, downstream = free_port(), free_port()
    server = make_run(PORT=port, DOWNSTREAM_PORT=downstream)
    base = f"http://127.0.0.1:{port}"
    try:
        assert ready_line(server) == f"ready: {base}/admin/ (the dashboard; {base}/ leads there)\n"
        # Answering already, with the dashboard that / leads a browser to.
        home = requests.get(f"{base}/", allow_redirects=False, timeout=30)
        assert (home.status_code, home.headers["Location"]) == (302, "/admin/")
        assert requests.get(f"{base}/", timeout=30).url == f"{base}/admin/"
        headers = {"X-CloudScheduler-JobName": "slow-report", "X-CloudScheduler-ScheduleTime": "2026-11-29T07:00:00Z"}
        first = requests.post(f"{base}/jobs/slow-report", data='{"seconds": 1}', headers=headers, timeout=30)
        assert first.status_code == 200 and first.json()["status"] == "completed"
        again = requests.post(f"{base}/jobs/slow-report", data='{"seconds": 1}', headers=headers, timeout=30)
        assert again.json()["duplicate"] is True
        listing = requests.get(f"{base}/api/v1/jobs/slow-report/executions", timeout=30).json()
        assert listing["scheduler_jobs"] == ["slow-report-every-5"] and len(listing["executions"]) == 288
        # The README's sync-crm reaches the downstream on DOWNSTREAM_PORT, not the file's 8081.
        run = requests.post(
            f"{base}/api/v1/jobs/sync-crm/runs", json={"clientToken": "backfill", "parameters": {}}, timeout=30
        )
        assert run.status_code == 201 and run.json()["result"]["status"] == 201, run.text
        # The downstream keeps its guard records in a namespace of its own: the app's ledger, and
        # so its first dashboard, holds the app's runs alone.
        listed = requests.get(f"{base}/api/v1/runs", timeout=30).json()["runs"]
        assert sorted(r["source"] for r in listed) == ["api", "scheduler"]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


@pytest.mark.parametrize(
    "setting, serves",
    [("PORT", "the app"), ("DOWNSTREAM_PORT", "the example downstream service"), ("EMULATOR_PORT", "the Datastore")],
)
def test_a_port_in_use_is_named_with_its_setting_before_anything_starts(setting, serves):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        # The other ports free (8080 may be another make run's), this one held.
        err = refused(make_run(**{"PORT": free_port(), "DOWNSTREAM_PORT": free_port(), setting: busy}))
    assert f"port {busy} ({serves}" in err and f"make run {setting}=" in err, err
    assert "Traceback" not in err


def test_two_servers_given_one_port_are_refused():
    port = free_port()
    err = refused(make_run(PORT=port, DOWNSTREAM_PORT=port))
    assert f"PORT and DOWNSTREAM_PORT are both {port}" in err, err


def test_the_example_jobs_call_the_downstream_on_its_port(tmp_path):
    written = serve.jobs_calling(9123, os.path.join(ROOT, serve.EXAMPLE_JOBS), str(tmp_path))
    assert set(load_jobs(written)) == {"ledger-digest", "slow-report", "sync-crm"}  # a jobs file the app takes
    with open(os.path.join(ROOT, serve.EXAMPLE_JOBS), encoding="utf-8") as handle:
        example = yaml.safe_load(handle)
    with open(written, encoding="utf-8") as handle:
        served = yaml.safe_load(handle)
    # As written (what make devserver reads), the URL names the default port; served, the one given.
    url = urllib.parse.urlsplit(example["jobs"]["sync-crm"]["url"])
    assert url.port == serve.DEFAULT_DOWNSTREAM_PORT
    example["jobs"]["sync-crm"]["url"] = url._replace(netloc="127.0.0.1:9123").geturl()
    assert served == example  # nothing else changes


@pytest.mark.live
@pytest.mark.slow
def test_make_run_serves_your_own_jobs_and_their_schedule(tmp_path):
    """The README's `make run DEDUP_JOBS_FILE=ops/jobs.yaml` (issue 40 §5): your jobs, with the
    scheduler.yaml beside them, and none of the example's."""
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "jobs.yaml").write_text(
        "jobs:\n  nightly-close:\n    kind: python\n    target: jobs.builtin:ledger_digest\n"
    )
    (ops / "scheduler.yaml").write_text(
        "defaults: {project: acme-prod, location: us-central1}\n"
        "jobs:\n  close-books: {target: nightly-close, schedule: '0 2 * * *'}\n"
    )
    port, downstream = free_port(), free_port()
    make = subprocess.Popen(
        ["make", "run", f"PORT={port}", f"DOWNSTREAM_PORT={downstream}", f"DEDUP_JOBS_FILE={ops / 'jobs.yaml'}"],
        cwd=ROOT,
        env=ENV,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        assert ready_line(make).startswith(f"ready: {base}/admin/")
        listing = requests.get(f"{base}/api/v1/scheduler-jobs", timeout=30).json()
        assert [job["scheduler_job"] for job in listing["scheduler_jobs"]] == ["close-books"]
        assert requests.get(f"{base}/api/v1/jobs/slow-report/executions", timeout=30).status_code == 404
        headers = {"X-CloudScheduler-JobName": "close-books", "X-CloudScheduler-ScheduleTime": "2026-11-29T02:00:00Z"}
        ran = requests.post(f"{base}/jobs/nightly-close?project=acme-prod&location=us-central1", headers=headers)
        assert ran.status_code == 200 and ran.json()["status"] == "completed", ran.text
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        make.wait(60)
