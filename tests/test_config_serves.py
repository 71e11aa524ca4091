"""Configuration that validates must serve: every field of scheduler.yaml and jobs.yaml, hostile values.

For each value, either the one validation (``python -m deploy scheduler validate``
and the app's start-up run the same functions) refuses it with a message naming
the job and the field, or the app built from it serves: a delivery exactly as
Cloud Scheduler would send it for a real slot of the job, the job's executions
listing and the dashboard.  Never a traceback.  The two tables are marked slow
(make test runs them); the tests after them, in the fast tier, hold each class.
"""

from __future__ import annotations

import datetime
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import webtest
import yaml
from click.testing import CliRunner

from dedup.keys import format_utc
from deploy.cli import cli as ops_cli
from handlers import create_app
from jobs.errors import JobsConfigError
from schedules.bound import BoundJob
from schedules.config import (
    SchedulerJob,
    ScheduleSettingError,
    load_scheduler_file,
    schedule_period_seconds,
)
from schedules.slots import latest_slots

YEAR = 365 * 24 * 3600
# Wrong types, empty, huge, negative, not numbers, unicode, control characters, long.
HOSTILE: list[Any] = [
    None,
    "",
    True,
    -1,
    2.5,
    1e308,
    10**30,
    float("nan"),
    float("inf"),
    [],
    {"a": 1},
    "é\u202e☃",
    "\x00\r\n",
    "x" * 5000,
]
BASE_JOB: dict[str, Any] = {
    "target": "report",
    "schedule": "0 0 1 * *",  # monthly: few slots to compute, in validation and the listing
    "project": "acme-prod",
    "location": "us-central1",
    "attempt_deadline": "60s",
}
APP_JOBS: dict[str, Any] = {
    "report": {
        "kind": "python",
        "target": "tests.job_targets:record",
        "lease_seconds": 600,
        "retention_seconds": 9 * YEAR,  # long enough for any schedule: what is refused, is for its own sake
    }
}
SCHEDULER_EXTRA: dict[str, list[Any]] = {
    "name": ["nightly/other", "a" * 501, "ünï", "projects/p/locations/l/jobs/x"],
    "target": ["../report", "report?x=1", "Report", "missing"],
    "schedule": [
        "0 0 31 2 *",
        "0 0 30 2 *",
        "0 0 30-31 2 *",
        "0 0 31 2,4,6,9,11 *",
        "0 0 31 4 *",
        "0 0 29 2 *",
        "0 0 31 2 mon",
        "0 0 31 */2 *",
        "*/0 * * * *",
        "5-1 0 1 * *",
        "0 0 * * 7",
        "٣ * * * *",
        "0 0 L * *",
        "@hourly",
        "0 * * * * *",
    ],
    "time_zone": ["Mars/Olympus", "utc", "Europe/Paris", "localtime", "../../etc/passwd"],
    "method": ["get", "DELETE", "poſt"],
    "body": ['{"mode": "full"}'],
    "headers": [
        {"X-Scheduler-Project": "no"},
        {"X-Scheduler-Location": "US Central"},
        {"x-scheduler-project": "Acme"},
        {"X-Scheduler-Project": "other-project"},
        {"X-Scheduler-Project": "acme-prod", "X-Scheduler-Location": "us-central1"},
        {"X-Scheduler-Project": "é"},
        {"X-Scheduler-Location": "x" * 2000},
        {"X-Scheduler-Location": "europe-west1"},
        {"X-A": "1", "x-a": "2"},
        {"X-Scheduler-Project": "acme-prod", "x-scheduler-project": "Acme"},
        {"X-CloudScheduler-JobName": "forged"},
        {"X-A": 5},
        {5: "a"},
        {"X-A": None},
    ],
    "attempt_deadline": [15, 14.999, "24h16s", "9" * 400, "9" * 400 + "s", "1e3", "1h30"],
    "retry": ["x", [], {"retry_count": 1, "extra": 1}, {5: 1}],
    "retry.retry_count": [5, 6],
    "retry.max_retry_duration": ["9" * 400, "3650d", "3651d", 10 * YEAR, "0s"],
    "retry.min_backoff": ["9" * 400, "1h"],
    "retry.max_backoff": ["9" * 400, "1s"],
    "retry.max_doublings": [16, 17],
    "project": ["Acme", "example.com:acme-prod", "a" * 100, "acme-prod\n"],
    "location": ["mars", "US-CENTRAL1", "a" * 70 + "-b1", "europe-west1", "us-central1\n"],
    "service": ["default"],
    "version": ["v1"],
    "scaling": ["basic", "manual", "elastic"],
    "pass_scope": [False, "yes", 1],
    "description": ["<script>alert(1)</script>"],
    "defaults": [],
}
RETRY_FIELDS = ("retry_count", "max_retry_duration", "min_backoff", "max_backoff", "max_doublings")


def scheduler_cases() -> list[Any]:
    cases = [
        pytest.param(field, value, False, id=f"{field}-{index}")
        for field, extra in SCHEDULER_EXTRA.items()
        for index, value in enumerate(HOSTILE + extra)
    ]
    # pass_scope: false sends the scope only in the headers.
    cases += [
        pytest.param("headers", headers, True, id=f"headers-unscoped-{index}")
        for index, headers in enumerate(SCHEDULER_EXTRA["headers"])
    ]
    # A default is every job's value.
    cases += [
        pytest.param(f"defaults.{field}", value, False, id=f"defaults.{field}-{index}")
        for field in ("schedule", "headers", "attempt_deadline", "retry", "pass_scope", "scaling")
        for index, value in enumerate(SCHEDULER_EXTRA[field][:4])
    ]
    return cases


def scheduler_document(field: str, value: Any, unscoped: bool = False) -> dict[str, Any]:
    job = dict(BASE_JOB)
    document: dict[str, Any] = {"jobs": {"nightly": job}}
    if unscoped:
        job["pass_scope"] = False
    if field == "defaults":
        document["defaults"] = value
    elif field.startswith("defaults."):
        document["defaults"] = {field.split(".", 1)[1]: value}
    elif field.startswith("retry."):
        job["retry"] = {field.split(".", 1)[1]: value}
    else:
        job[field] = value
    return document


@pytest.fixture
def files(tmp_path):
    def write(jobs: dict[str, Any], schedules: dict[str, Any] | None) -> str:
        (tmp_path / "jobs.yaml").write_text(yaml.safe_dump({"jobs": jobs}, allow_unicode=True), encoding="utf-8")
        if schedules is not None:
            (tmp_path / "scheduler.yaml").write_text(yaml.safe_dump(schedules, allow_unicode=True), encoding="utf-8")
        return str(tmp_path / "jobs.yaml")

    return write


def validate_cli(jobs_path: str) -> tuple[int, str]:
    scheduler = jobs_path.replace("jobs.yaml", "scheduler.yaml")
    result = CliRunner().invoke(ops_cli, ["--jobs", jobs_path, "scheduler", "validate", scheduler])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def named(message: str, job: str | None, field: str) -> bool:
    where = f"job {job!r} field {field!r}" if job else f"field {field!r}"
    return where in message


def real_slot(jobs_path: str, now: datetime.datetime) -> tuple[SchedulerJob, datetime.datetime]:
    [job] = load_scheduler_file(jobs_path.replace("jobs.yaml", "scheduler.yaml"))
    [slot] = latest_slots([BoundJob(job)], now, 1)
    return job, slot.schedule_time


def delivery(client: webtest.TestApp, job: SchedulerJob, schedule_time: datetime.datetime) -> webtest.TestResponse:
    """A delivery as Cloud Scheduler sends it for the job: its method, URL, headers and body."""
    headers = {
        **job.headers,
        "X-CloudScheduler": "true",
        "X-CloudScheduler-JobName": job.name,
        "X-CloudScheduler-ScheduleTime": format_utc(schedule_time),
    }
    body = (job.body or "").encode("utf-8")
    if job.method == "GET":
        return client.get(job.relative_url, headers=headers, status="*")
    return client.post(job.relative_url, body, headers=headers, status="*")


def assert_serves(client: webtest.TestApp, target: str) -> None:
    listing = client.get(f"/api/v1/jobs/{target}/executions", status="*")
    assert listing.status_int == 200, listing.text
    dashboard = client.get("/admin/", status="*")
    assert dashboard.status_int == 200, dashboard.text


@pytest.mark.slow  # the whole table: some 900 apps built and served (about a minute on 4 workers)
@pytest.mark.parametrize("field, value, unscoped", scheduler_cases())
def test_every_scheduler_field_is_refused_by_name_or_served(
    field, value, unscoped, files, datastore, ndb_client, clock
):
    jobs_path = files(APP_JOBS, scheduler_document(field, value, unscoped))
    exit_code, output = validate_cli(jobs_path)
    named_field = field.split(".")[-1] if field.startswith("defaults.") else field
    try:
        app = create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)
    except ScheduleSettingError as exc:
        # Refused: naming the job and the field, by the CLI with the very same problems.
        message = str(exc)
        acceptable = {named_field, named_field.split(".")[0]}
        if named_field in ("defaults", "retry") and isinstance(value, dict):  # a key of the mapping is named
            acceptable |= {f"{'retry.' if named_field == 'retry' else ''}{key}" for key in value}
        assert any(named(message, "nightly", f) or named(message, None, f) for f in acceptable), message
        assert exit_code == 1
        cli_problems = [line for line in output.splitlines() if line.startswith("scheduler.yaml:")]
        assert cli_problems and all(problem in message for problem in cli_problems), (output, message)
        return
    assert exit_code == 0, output
    client = webtest.TestApp(app)
    job, schedule_time = real_slot(jobs_path, clock.now())
    answer = delivery(client, job, schedule_time)
    assert answer.status_int == 200, answer.text
    assert_serves(client, job.target)


@pytest.mark.parametrize(
    "schedule",
    ["0 0 31 2 *", "0 0 30 2 *", "0 0 30-31 2 *", "0 0 31 2,4,6,9,11 *", "0 0 31 4 *"],
)
def test_a_schedule_that_never_fires_is_refused_by_name(schedule, files, clock, ndb_client):
    jobs_path = files(APP_JOBS, scheduler_document("schedule", schedule))
    with pytest.raises(ScheduleSettingError, match=r"job 'nightly' field 'schedule': .* never fires"):
        create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)
    exit_code, output = validate_cli(jobs_path)
    assert exit_code == 1 and "job 'nightly' field 'schedule'" in output and "never fires" in output


@pytest.mark.slow
def test_a_body_the_app_would_refuse_as_too_large_is_refused_by_name(files, clock, ndb_client):
    from jobs.base import MAX_BODY_BYTES

    jobs_path = files(APP_JOBS, scheduler_document("body", "x" * (MAX_BODY_BYTES + 1)))
    with pytest.raises(ScheduleSettingError, match=r"job 'nightly' field 'body': is over"):
        create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)
    exit_code, output = validate_cli(jobs_path)
    assert exit_code == 1 and "job 'nightly' field 'body'" in output


@pytest.mark.parametrize(
    "headers, words",
    [
        ({"X-Scheduler-Project": "no"}, "header X-Scheduler-Project 'no' is not a valid project"),
        ({"x-scheduler-location": "US Central"}, "header X-Scheduler-Location 'US Central' is not a valid location"),
        ({"X-Scheduler-Project": "é"}, "control or non-ASCII"),
    ],
)
@pytest.mark.parametrize("pass_scope", [True, False])
def test_scope_headers_a_delivery_would_refuse_are_refused_by_name(
    headers, words, pass_scope, files, clock, ndb_client
):
    document = scheduler_document("headers", headers, unscoped=not pass_scope)
    jobs_path = files(APP_JOBS, document)
    with pytest.raises(ScheduleSettingError, match=r"job 'nightly' field 'headers': the app would refuse") as caught:
        create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)
    assert words in str(caught.value)
    exit_code, output = validate_cli(jobs_path)
    assert exit_code == 1 and words in output


def test_a_scope_header_that_contradicts_the_url_is_refused(files, clock, ndb_client):
    jobs_path = files(APP_JOBS, scheduler_document("headers", {"X-Scheduler-Project": "other-project"}))
    with pytest.raises(ScheduleSettingError, match="given twice with different values"):
        create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)


def test_a_leap_day_schedule_needs_a_retention_of_over_four_years(files, datastore, clock, ndb_client):
    assert schedule_period_seconds("0 0 29 2 *", "Etc/UTC") == 4 * 365.25 * 24 * 3600  # 2028 to 2032
    short = {"report": {**APP_JOBS["report"], "retention_seconds": 4 * YEAR}}
    jobs_path = files(short, scheduler_document("schedule", "0 0 29 2 *"))
    with pytest.raises(ScheduleSettingError, match="job 'nightly' field 'schedule': executions are up to"):
        create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)
    jobs_path = files(APP_JOBS, scheduler_document("schedule", "0 0 29 2 *"))
    client = webtest.TestApp(create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client))
    job, schedule_time = real_slot(jobs_path, clock.now())
    assert schedule_time == datetime.datetime(2028, 2, 29, tzinfo=datetime.UTC)
    assert delivery(client, job, schedule_time).status_int == 200
    assert_serves(client, "report")


def test_a_file_that_is_not_utf8_is_refused_cleanly(files, tmp_path, clock, ndb_client):
    jobs_path = files(APP_JOBS, scheduler_document("schedule", "0 * * * *"))
    (tmp_path / "scheduler.yaml").write_bytes(b"jobs:\n  nightly: {target: \xff}\n")
    with pytest.raises(ScheduleSettingError, match="not UTF-8"):
        create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)
    assert validate_cli(jobs_path)[0] == 1
    (tmp_path / "jobs.yaml").write_bytes(b"jobs:\n  report: {kind: \xff}\n")
    with pytest.raises(JobsConfigError, match="not UTF-8"):
        create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)


# -- jobs.yaml ---------------------------------------------------------------------------------

# Every key of jobs.yaml: the common ones, and each kind's (jobs/kinds/), with values of their own.
JOB_EXTRA: dict[str, list[Any]] = {
    "kind": ["python ", "Python"],
    "lease_seconds": [59, 600, 10 * YEAR, 10 * YEAR + 1, 9 * YEAR],
    "retention_seconds": [1, 600, 601, 10 * YEAR, 10 * YEAR + 1],
    "fingerprint_exclude": [["a", ""], ["é"], [1]],
    "heartbeat": [False, "false"],
    "max_run_seconds": [1, 10 * YEAR],
    "max_delay_seconds": [1, 10 * YEAR],
    "overlap": ["forbid", "allow", "FORBID"],
    "target": ["tests.job_targets:nope", "os:sep", "..x:y", "tests.job_targets", "tests.job_targets:record.x"],
}
KIND_JOBS: dict[str, dict[str, Any]] = {
    "http": {"kind": "http", "url": "{base}/hook", "lease_seconds": 60},
    "workflow": {
        "kind": "workflow",
        "workflow": "projects/acme-prod/locations/us-central1/workflows/etl",
        "api_base": "{base}",
        "lease_seconds": 60,
    },
    "cloud_run_job": {
        "kind": "cloud_run_job",
        "job": "projects/acme-prod/locations/us-central1/jobs/reindex",
        "api_base": "{base}",
        "lease_seconds": 60,
    },
    "cloud_build_trigger": {
        "kind": "cloud_build_trigger",
        "trigger": "projects/acme-prod/locations/global/triggers/release",
        "api_base": "{base}",
        "lease_seconds": 60,
    },
}
KIND_EXTRA: dict[tuple[str, str], list[Any]] = {
    ("http", "url"): ["ftp://x", "http://", "http://[::1", "http://exa\u2100mple.com/", "http://x:99999/", "{base}/é"],
    ("http", "method"): ["get", "DELETE", "PATCH"],
    ("http", "timeout_seconds"): [59, 60, 1],
    ("http", "headers"): [{"X-A": "é"}, {"X-A": "\u20ac"}, {"X A": "b"}, {"Host": "x"}, {"X-A": 5}, {"X-A": " b"}],
    ("workflow", "workflow"): ["projects/p/locations/l/workflows/", "etl"],
    ("workflow", "argument"): [{"a": float("nan")}, {"a": [1, {"b": None}]}],
    ("workflow", "api_base"): ["ftp://x", "http://[::1", "{base}?x=1"],
    ("workflow", "timeout_seconds"): [30, 29],
    ("cloud_run_job", "job"): ["projects/p/locations/l/jobs/"],
    ("cloud_run_job", "args"): [["--full"], [1], "--full"],
    ("cloud_run_job", "env"): [{"MODE": "nightly"}, {"MODE": 1}, {"": "x"}, {"A=B": "x"}],
    ("cloud_run_job", "container"): ["main"],
    ("cloud_run_job", "api_base"): ["http://[::1"],
    ("cloud_run_job", "timeout_seconds"): [30],
    ("cloud_build_trigger", "trigger"): ["projects/p/locations/l/triggers/"],
    ("cloud_build_trigger", "substitutions"): [{"_ENV": "prod"}, {"ENV": "prod"}, {"_ENV": 1}],
    ("cloud_build_trigger", "branch"): ["main"],
    ("cloud_build_trigger", "tag"): ["v1"],
    ("cloud_build_trigger", "commit"): ["0" * 40],
    ("cloud_build_trigger", "api_base"): ["http://[::1"],
    ("cloud_build_trigger", "timeout_seconds"): [30],
}
JOB_SCHEDULE = {"jobs": {"nightly": {**BASE_JOB, "attempt_deadline": "15s"}}}


def jobs_cases() -> list[Any]:
    cases = [
        pytest.param("python", field, value, id=f"{field}-{index}")
        for field, extra in JOB_EXTRA.items()
        for index, value in enumerate(HOSTILE + extra)
    ]
    return cases + [
        pytest.param(kind, field, value, id=f"{kind}.{field}-{index}")
        for (kind, field), extra in KIND_EXTRA.items()
        for index, value in enumerate(HOSTILE + extra)
    ]


def with_base(value: Any, base: str) -> Any:
    return value.replace("{base}", base) if isinstance(value, str) else value


@pytest.fixture(scope="module")
def downstream() -> Iterator[str]:
    """An http job's endpoint that answers 200 to anything."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PATCH = do_PUT = do_DELETE = do_POST

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow  # the whole table: some 900 apps built and served (about a minute on 4 workers)
@pytest.mark.parametrize("kind, field, value", jobs_cases())
def test_every_jobs_field_is_refused_by_name_or_served(
    kind, field, value, files, google, downstream, ndb_client, clock
):
    base = downstream if kind == "http" else google.url
    settings = dict(APP_JOBS["report"]) if kind == "python" else dict(KIND_JOBS[kind])
    settings = {key: with_base(item, base) for key, item in settings.items()}
    settings[field] = with_base(value, base)
    jobs_path = files({"report": settings}, JOB_SCHEDULE)
    try:
        app = create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)
    except JobsConfigError as exc:
        # The field, or the rule that refuses it names it ("must be longer than lease_seconds").
        assert exc.job_id == "report" and (exc.field == field or field in exc.reason), str(exc)
        return
    except ScheduleSettingError as exc:  # the value is valid alone, not with the schedule that targets it
        assert "job 'nightly' field '" in str(exc), str(exc)
        assert validate_cli(jobs_path)[0] == 1
        return
    client = webtest.TestApp(app)
    job, schedule_time = real_slot(jobs_path, clock.now())
    answer = delivery(client, job, schedule_time)
    # Its work may fail downstream (a URL nothing answers): that is the job's answer, with its run id.
    assert answer.status_int == 200 or (answer.status_int in (422, 500) and "X-Dedup-Run-Id" in answer.headers), (
        answer.status,
        answer.text,
    )
    assert_serves(client, "report")


@pytest.mark.parametrize(
    "job_id", [v for v in HOSTILE if not isinstance(v, (list, dict))] + ["a/b", "é", "-a", "a" * 101]
)
def test_every_job_id_is_refused_by_name_or_served(job_id, files, datastore, ndb_client, clock):
    jobs_path = files({job_id: APP_JOBS["report"]}, None)
    try:
        app = create_app(jobs_file=jobs_path, clock=clock, ndb_client=ndb_client)
    except JobsConfigError as exc:
        assert exc.job_id is not None and "job ids are" in str(exc), str(exc)
        return
    client = webtest.TestApp(app)
    assert client.get("/admin/", status="*").status_int == 200
