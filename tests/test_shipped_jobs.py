"""Every job the project ships runs, through a real delivery on the emulator.

A shipped job once failed on every run (``ledger-digest`` passed an option
google-cloud-ndb refuses) because nothing ran its code.  Each job declared
in the example ``jobs.yaml`` as it ships (its copy, ``tests/fixtures/jobs.yaml``:
the top-level file is the user's to replace) and ``examples/local-jobs.yaml``
is delivered here as Cloud Scheduler delivers it; targets that live elsewhere
are pointed at local stand-ins speaking the same protocol (the example
downstream for ``http`` jobs, the API fakes for the Google kinds), everything
else kept as declared.
"""

from __future__ import annotations

import datetime
import os
import threading
import urllib.parse
import wsgiref.simple_server

import pytest
import webtest
import yaml

from dedup.keys import scheduled_run_key
from dedup.ledger import Ledger, RunDescription, RunPolicy
from handlers import create_app
from tests.support import POLL_SECONDS
from tests.support.deliveries import scheduler_headers
from tests.support.shipped import EXAMPLE_JOBS, EXAMPLE_SCHEDULE, FIXTURES, filled_in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED_FILES = ("tests/fixtures/jobs.yaml", "examples/local-jobs.yaml")
GOOGLE_KINDS = ("workflow", "cloud_run_job", "cloud_build_trigger")
# What a delivery of a python job carries, where the job reads its body.
BODIES = {"examples.demo_jobs:slow_report": b'{"seconds": 0}'}


def shipped_jobs() -> list[tuple[str, str]]:
    pairs = []
    for name in SHIPPED_FILES:
        with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
            pairs += [(name, job_id) for job_id in yaml.safe_load(handle)["jobs"]]
    return pairs


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def downstream(ndb_client, clock):
    """The example downstream service (examples/downstream.py), served on a free port."""
    from examples.downstream import create_downstream_app

    app = create_downstream_app(clock=clock, ndb_client=ndb_client)
    calls: list[dict] = []

    def recording(environ, start_response):
        calls.append(
            {
                "path": environ["PATH_INFO"],
                "method": environ["REQUEST_METHOD"],
                "key": environ.get("HTTP_IDEMPOTENCY_KEY"),
            }
        )
        return app(environ, start_response)

    server = wsgiref.simple_server.make_server("127.0.0.1", 0, recording, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True)
    thread.start()
    server.calls = calls
    server.url = f"http://127.0.0.1:{server.server_port}"
    yield server
    server.shutdown()
    server.server_close()


def local_settings(settings: dict, request) -> dict:
    """The job as declared, with a remote target swapped for its local stand-in."""
    kind = settings["kind"]
    if kind == "python":
        return settings
    if kind == "http":
        url = urllib.parse.urlsplit(settings["url"])
        local = urllib.parse.urlsplit(request.getfixturevalue("downstream").url)
        return {**settings, "url": urllib.parse.urlunsplit((local.scheme, local.netloc, url.path, url.query, ""))}
    if kind in GOOGLE_KINDS:
        return {**settings, "api_base": request.getfixturevalue("google").url}
    pytest.fail(f"kind {kind!r} is shipped but this test has no local stand-in for it: add one here")


@pytest.mark.parametrize("jobs_file_name, job_id", shipped_jobs())
def test_every_shipped_job_runs_to_completion(jobs_file_name, job_id, request, datastore, ndb_client, clock, tmp_path):
    with open(os.path.join(ROOT, jobs_file_name), encoding="utf-8") as handle:
        declared = yaml.safe_load(handle)["jobs"]
    settings = local_settings(declared[job_id], request)
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump({"jobs": {job_id: settings}}))
    client = webtest.TestApp(create_app(jobs_file=str(path), clock=clock, ndb_client=ndb_client))
    headers = scheduler_headers(scheduler_job_name=f"shipped-{job_id}")
    body = BODIES.get(settings.get("target"), b"")

    first = client.post(f"/jobs/{job_id}", body, headers=headers, expect_errors=True)
    assert first.status_int == 200, first.text
    assert first.json["status"] == "completed" and first.json["duplicate"] is False
    again = client.post(f"/jobs/{job_id}", body, headers=headers, status=200)
    assert again.json["duplicate"] is True and again.json["result"] == first.json["result"]
    if settings["kind"] == "http":
        downstream = request.getfixturevalue("downstream")
        declared_path = urllib.parse.urlsplit(declared[job_id]["url"]).path
        assert [(c["path"], c["key"]) for c in downstream.calls] == [(declared_path, first.json["run_id"])]


# Each shipped scheduler file, and the jobs file it is checked against.
SHIPPED_SCHEDULES = {
    "tests/fixtures/scheduler.yaml": "tests/fixtures/jobs.yaml",
    "examples/local-scheduler.yaml": "examples/local-jobs.yaml",
}


def test_the_app_refuses_to_start_with_the_shipped_placeholders(tmp_path, ndb_client, clock):
    """Deployed as shipped, it would call crm.example.com every hour for a project that is not yours."""
    from handlers import create_app
    from jobs.errors import JobsConfigError
    from schedules.config import ScheduleSettingError

    shipped_jobs, shipped_schedule = str(EXAMPLE_JOBS), str(EXAMPLE_SCHEDULE)
    with pytest.raises(JobsConfigError, match="'crm.example.com' is a placeholder"):
        create_app(jobs_file=shipped_jobs, scheduler_file=shipped_schedule, clock=clock, ndb_client=ndb_client)
    filled_jobs, _ = filled_in(tmp_path)
    with pytest.raises(ScheduleSettingError, match="'your-project-id' is the placeholder scheduler.yaml ships with"):
        create_app(jobs_file=str(filled_jobs), scheduler_file=shipped_schedule, clock=clock, ndb_client=ndb_client)


def test_shipped_files_are_all_covered():
    """A new jobs or scheduler file under examples/ (or an example's copy in tests/fixtures/) is shipped
    too: it must be listed above."""
    found = {
        f"{folder}/{name}"
        for folder in ("examples", "tests/fixtures")
        for name in os.listdir(os.path.join(ROOT, folder))
        if name.endswith((".yaml", ".yml"))
    }
    assert found == set(SHIPPED_FILES) | set(SHIPPED_SCHEDULES)


@pytest.mark.parametrize("schedule, jobs", sorted(SHIPPED_SCHEDULES.items()))
def test_each_shipped_scheduler_file_loads_with_its_jobs(schedule, jobs, datastore, ndb_client, clock, tmp_path):
    """The app starts with it (the same validation as the ops CLI), placeholders filled in, and lists its slots."""
    import webtest

    from handlers import create_app

    jobs_file, scheduler_file = os.path.join(ROOT, jobs), os.path.join(ROOT, schedule)
    if os.path.dirname(scheduler_file) == str(FIXTURES):
        jobs_file, scheduler_file = map(str, filled_in(tmp_path))
    app = create_app(jobs_file=jobs_file, scheduler_file=scheduler_file, clock=clock, ndb_client=ndb_client)
    declared = app.extensions["dedup"].tracked_schedules.declared
    assert declared
    client = webtest.TestApp(app)
    for target in sorted({job.target for job in declared}):
        listing = client.get(f"/api/v1/jobs/{target}/executions", params={"since": "2029-12-30T00:00:00Z"}).json
        # A fresh deploy: the slots before the app first knew the schedule are untracked, never missed.
        statuses = [e["status"] for e in listing["executions"]]
        assert statuses and set(statuses) <= {"untracked", "due"} and statuses[0] == "untracked"


DIGEST_JOBS = """
jobs:
  ledger-digest:
    kind: python
    target: jobs.builtin:ledger_digest
    lease_seconds: 300
  other:
    kind: python
    target: tests.job_targets:record
"""


def _run(ledger: Ledger, job_id: str, minute: int, policy: RunPolicy):
    key = scheduled_run_key(f"sched-{job_id}", f"2030-01-01T00:{minute:02d}:00Z")
    description = RunDescription(
        source="scheduler", job_id=job_id, scheduler_job_name=key.scheduler_job_name, schedule_time=key.schedule_time
    )
    return ledger.claim_run(key.run_id, description, policy)


def test_the_digest_counts_each_jobs_runs_by_status_takeovers_and_stuck_runs(make_client, ndb_client, clock):
    client = make_client(DIGEST_JOBS)
    ledger = Ledger(clock)
    policy = RunPolicy(lease_seconds=60, retention_seconds=7 * 24 * 3600)
    with ndb_client.context():
        done = _run(ledger, "sync", 0, policy)
        ledger.complete_run(done.attempt, {"ok": True}, policy)
        failed = _run(ledger, "sync", 1, policy)
        ledger.fail_run(failed.attempt, {"type": "Rejected", "message": "no"}, policy)
        taken = _run(ledger, "sync", 2, policy)
        _run(ledger, "report", 3, policy)  # will be stuck: its attempt never finishes
        clock.advance(61)
        retaken = _run(ledger, "sync", 2, policy)  # a takeover after the lease ran out
        ledger.complete_run(retaken.attempt, {"ok": True}, policy)
        assert retaken.attempt.number == taken.attempt.number + 1
        busy = _run(ledger, "sync", 4, policy)  # released after a retryable failure, then retried
        ledger.release_run(busy.attempt, {"type": "RetryableJobError", "message": "busy"})
        ledger.complete_run(_run(ledger, "sync", 4, policy).attempt, {"ok": True}, policy)
        waiting = _run(ledger, "report", 5, policy)  # released, its retry still to come
        ledger.release_run(waiting.attempt, {"type": "RetryableJobError", "message": "busy"})
    clock.advance(3600)
    # Manual runs count too: the digest reads every record of the window.
    client.post_json("/api/v1/jobs/other/runs", {"clientToken": "t-1"}, status=201)
    clock.advance(1)

    until = clock.now()  # the digest's own record is created at its schedule time: outside the window
    response = client.post(
        "/jobs/ledger-digest",
        headers=scheduler_headers(
            scheduler_job_name="ledger-digest-daily", schedule_time=until.strftime("%Y-%m-%dT%H:%M:%SZ")
        ),
        status=200,
    )
    digest = response.json["result"]
    assert digest["until"] == until.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    assert digest["complete"] is True and digest["runs"] == 7 and digest["runs_with_takeovers"] == 1
    assert digest["releases"] == 2
    assert digest["by_job"]["sync"] == {
        "runs": 4,
        "by_status": {"completed": 3, "failed": 1},
        "by_source": {"scheduler": 4},
        "stuck": 0,
        "takeovers": 1,
        "runs_with_takeovers": 1,
        "releases": 1,
    }
    assert digest["by_job"]["report"]["stuck"] == 1
    assert digest["by_job"]["report"]["by_status"] == {"in_progress": 1, "released": 1}
    assert digest["by_job"]["report"]["releases"] == 1
    assert digest["by_job"]["other"]["by_source"] == {"api": 1}


def test_the_digest_window_ends_at_the_schedule_time(make_client, ndb_client, clock):
    client = make_client(DIGEST_JOBS)
    client.post_json("/api/v1/jobs/other/runs", {"clientToken": "t-1"}, status=201)
    before = clock.now() - datetime.timedelta(seconds=1)
    response = client.post(
        "/jobs/ledger-digest",
        headers=scheduler_headers(
            scheduler_job_name="ledger-digest-daily", schedule_time=before.strftime("%Y-%m-%dT%H:%M:%SZ")
        ),
        status=200,
    )
    assert response.json["result"]["runs"] == 0  # the run came after the window


@pytest.mark.parametrize(
    "parameters, problem",
    [
        ({"until": "0001-01-01T00:00:00Z"}, "outside the accepted range"),
        ({"until": "9999-12-31T23:59:59Z"}, "outside the accepted range"),
        ({"until": "yesterday"}, "not an RFC 3339 timestamp"),
        ({"until": 5}, "RFC 3339 timestamp string"),
        ({"since": "2030-01-01T00:00:00Z"}, "unknown parameter"),
    ],
)
def test_a_manual_digest_refuses_bad_windows_as_a_permanent_failure(make_client, parameters, problem):
    client = make_client(DIGEST_JOBS)
    response = client.post_json(
        "/api/v1/jobs/ledger-digest/runs", {"clientToken": "d-1", "parameters": parameters}, status=422
    )
    assert problem in response.json["error"]["message"]


def test_a_manual_digest_of_another_day(make_client, clock):
    client = make_client(DIGEST_JOBS)
    client.post("/jobs/other", headers=scheduler_headers(), status=200)  # kept 7 days
    clock.advance(3 * 24 * 3600)
    until = (clock.now() - datetime.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    response = client.post_json(
        "/api/v1/jobs/ledger-digest/runs", {"clientToken": "d-1", "parameters": {"until": until}}, status=201
    )
    assert response.json["result"]["runs"] == 1
