"""python -m deploy smoke: one forced Scheduler delivery, read back from Cloud Logging, judged.

Cloud Scheduler's and Cloud Logging's APIs are the stand-ins of devtools/google_fakes.py, in
their request and response shapes; App Engine's front end is played here (``FrontEnd``): it adds
the marker App Engine was observed to set on Scheduler's requests, or refuses the request
itself, as login: admin or the firewall would; the app is the real one (DEDUP_AUTH=appengine),
and its JSON lines reach the Logging stand-in as the agent turns them into entries.
"""

from __future__ import annotations

import base64
import dataclasses

import pytest
import webtest
from click.testing import CliRunner

from deploy.cli import cli as ops_cli
from deploy.smoke import THROWAWAY_PREFIX, THROWAWAY_SCHEDULE
from devtools.cloud_logging_fake import parse_filter
from devtools.google_fakes import GoogleFakes
from tests import job_targets
from tests.support.callers import appengine_app  # noqa: F401 - fixture
from tests.support.deliveries import JOBS
from tests.support.logs import CapturedLogs, json_logs  # noqa: F401 - fixture

PARENT = "projects/acme-prod/locations/us-central1"
NIGHTLY = f"{PARENT}/jobs/nightly"
SCOPE = "?project=acme-prod&location=us-central1"
MARKER = {"X-Appengine-User-Ip": "0.1.0.2"}  # what App Engine was seen to add to Scheduler's requests


@dataclasses.dataclass
class FrontEnd:
    """App Engine between Cloud Scheduler and the app: its markers, its refusals, its request log."""

    app: webtest.TestApp
    google: GoogleFakes
    logs: CapturedLogs
    added: dict[str, str] = dataclasses.field(default_factory=lambda: dict(MARKER))
    refuse: int | None = None  # answer this itself (login: admin's 401, the firewall's 403): the app sees nothing
    dropped: tuple[str, ...] = ()  # Scheduler headers lost on the way
    job_name: str | None = None  # the X-CloudScheduler-JobName the app receives instead of the job's
    deliveries: int = 0

    def __call__(self, job: dict, headers: dict[str, str]) -> None:
        self.deliveries += 1
        target = job["appEngineHttpTarget"]
        project, service = job["name"].split("/")[1], target["appEngineRouting"]["service"]
        uri, method = target["relativeUri"], target.get("httpMethod", "POST")
        if self.refuse:
            self.google.logging.request_log(project, service, method, uri, self.refuse)
            return
        sent = {name: value for name, value in headers.items() if name not in self.dropped}
        if self.job_name:
            sent["X-CloudScheduler-JobName"] = self.job_name
        before = len(self.logs.text.splitlines())
        body = base64.b64decode(target.get("body", ""))  # bytes, in JSON as base64
        answer = self.app.request(uri, method=method, headers={**sent, **self.added}, body=body, expect_errors=True)
        self.google.logging.request_log(project, service, method, uri, answer.status_code)
        for line in self.logs.text.splitlines()[before:]:
            self.google.logging.stdout(project, service, line)


@pytest.fixture
def front_end(google, appengine_app, json_logs):
    front = FrontEnd(appengine_app, google, json_logs)
    google.on_run = front
    return front


@pytest.fixture
def smoke(google, jobs_file):
    jobs = jobs_file(JOBS)

    def run(*args: str, timeout: float = 10):
        return CliRunner().invoke(
            ops_cli,
            [
                *("--jobs", jobs, "smoke", "--project=acme-prod", "--location=us-central1"),
                *(f"--scheduler-api-base={google.url}", f"--logging-api-base={google.url}"),
                *(f"--timeout={timeout}", "--poll=0.05", *args),
            ],
        )

    return run


def scheduler_calls(google) -> list[tuple[str, str]]:
    return [(c.method, c.path) for c in google.api_calls() if "/jobs" in c.path]


def throwaway_lifecycle(google) -> str:
    """The throwaway job's name, having checked it was created, run once and deleted."""
    (method, created), run, deleted = scheduler_calls(google)
    assert (method, created) == ("POST", f"/v1/{PARENT}/jobs")
    name = google.api_calls("POST")[0].body["name"]
    assert run == ("POST", f"/v1/{name}:run") and deleted == ("DELETE", f"/v1/{name}")
    assert google.scheduler_jobs == {}
    return name


def test_a_throwaway_job_is_delivered_admitted_keyed_and_deleted(smoke, google, front_end):
    result = smoke("--target=invoice")
    assert result.exit_code == 0, result.output
    name = throwaway_lifecycle(google)
    job_id = name.rsplit("/", 1)[1]
    assert job_id.startswith(THROWAWAY_PREFIX)
    job = google.api_calls("POST")[0].body
    assert job["schedule"] == THROWAWAY_SCHEDULE and job["retryConfig"] == {"retryCount": 0}
    assert job["attemptDeadline"] == "60s"  # invoice's lease
    assert job["appEngineHttpTarget"] == {
        "httpMethod": "POST",
        "appEngineRouting": {"service": "dedup"},  # app.yaml's
        "relativeUri": f"/jobs/invoice{SCOPE}",
    }
    # What the app saw: who, the headers the run is keyed on, the answer.
    assert "  principal: appengine:ip:0.1.0.2" in result.output
    assert f"  keyed on:  X-CloudScheduler-JobName: {job_id}, X-CloudScheduler-ScheduleTime: 2030-01-01T00:00:00" in (
        result.output
    )
    assert "  answer:    200 completed, attempt 1" in result.output
    assert "ok: delivered, admitted as appengine:ip:0.1.0.2" in result.output
    assert len(job_targets.EFFECTS) == 1  # the target ran once
    # Read in Cloud Logging, on the project, with a filter the Logging language parses.
    reads = [c for c in google.api_calls("POST") if c.path == "/v2/entries:list"]
    assert reads and reads[0].body["resourceNames"] == ["projects/acme-prod"]
    assert 'resource.labels.module_id="dedup"' in reads[0].body["filter"]


def nightly(google, **target) -> None:
    """The Scheduler job ``nightly``, calling /jobs/values with ``target``'s settings."""
    google.scheduler_jobs[NIGHTLY] = {
        "name": NIGHTLY,
        "schedule": "0 2 * * *",
        "appEngineHttpTarget": {
            "appEngineRouting": {"service": "dedup"},
            "relativeUri": f"/jobs/values{SCOPE}",
            **target,
        },
    }


def test_a_named_job_is_run_as_it_is(smoke, google, front_end):
    nightly(google, httpMethod="POST", body=base64.b64encode(b'{"value": 7}').decode())
    result = smoke("--job=nightly")
    assert result.exit_code == 0, result.output
    assert scheduler_calls(google) == [("GET", f"/v1/{NIGHTLY}"), ("POST", f"/v1/{NIGHTLY}:run")]
    assert "X-CloudScheduler-JobName: nightly" in result.output and "200 completed" in result.output
    assert NIGHTLY in google.scheduler_jobs  # its own job: left as it was


def test_a_run_that_fails_fails_the_smoke_saying_it_was_delivered(smoke, google, front_end):
    nightly(google)  # no body: the job raises
    result = smoke("--job=nightly")
    assert result.exit_code == 1
    assert "delivered and keyed as it should be, but the run failed: 500 released" in result.output


@pytest.mark.parametrize(
    "front, words",
    [
        (
            {"refuse": 401},
            "refused: App Engine answered 401 before the app saw the request: login: admin (app.yaml) did not "
            "let Cloud Scheduler's request through; every scheduled delivery is refused the same way",
        ),
        ({"refuse": 403}, "App Engine answered 403 before the app saw the request: the App Engine firewall"),
        ({"added": {}}, "refused: the app answered 401 to a caller it could not identify"),
        # A signed-in admin, as login: admin would pass one: the app delivers for no person.
        (
            {"added": {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": "carol@example.com"}},
            "refused: the app answered 403 to the caller user:carol@example.com",
        ),
    ],
)
def test_a_refused_delivery_fails_loudly_and_the_throwaway_job_still_goes(smoke, google, front_end, front, words):
    for name, value in front.items():
        setattr(front_end, name, value)
    result = smoke("--target=invoice")
    assert result.exit_code == 1, result.output
    assert words in result.output
    throwaway_lifecycle(google)
    assert job_targets.EFFECTS == []


@pytest.mark.parametrize(
    "front, words",
    [
        ({"dropped": ("X-CloudScheduler-ScheduleTime",)}, "keyed wrongly: the app answered 400"),
        ({"dropped": ("X-CloudScheduler-JobName",)}, "keyed wrongly: the app answered 400"),
        ({"job_name": "someone-else"}, "keyed under another job: in 1s the app saw deliveries on /jobs/invoice"),
    ],
)
def test_a_delivery_keyed_wrongly_fails(smoke, google, front_end, front, words):
    for name, value in front.items():
        setattr(front_end, name, value)
    result = smoke("--target=invoice", timeout=1)
    assert result.exit_code == 1, result.output
    assert words in result.output and "smoke failed" in result.output
    throwaway_lifecycle(google)


def test_a_key_another_job_of_the_app_holds_fails(smoke, google, front_end, appengine_app):
    """The job's delivery for that time was run by another target: the ledger answers job_mismatch."""
    nightly(google, relativeUri=f"/jobs/invoice{SCOPE}")
    headers = {"X-CloudScheduler-JobName": "nightly", "X-CloudScheduler-ScheduleTime": "2030-01-01T00:00:00Z"}
    appengine_app.post(f"/jobs/values{SCOPE}", b'{"value": 1}', headers={**headers, **MARKER}, status=200)
    result = smoke("--job=nightly")
    assert result.exit_code == 1, result.output
    assert "keyed under another job: the key of nightly's delivery for 2030-01-01T00:00:00" in result.output
    assert "  answer:    422 job_mismatch" in result.output


def test_a_delivery_that_never_arrives_times_out_and_the_job_goes(smoke, google):
    result = smoke("--target=invoice", timeout=0.5)  # google.on_run is None: Scheduler sends nothing
    assert result.exit_code == 1, result.output
    assert "no delivery of dedup-smoke-" in result.output and "reached /jobs/invoice on dedup in 0.5s" in result.output
    assert "gcloud scheduler jobs describe dedup-smoke-" in result.output
    throwaway_lifecycle(google)


def test_a_run_scheduler_refuses_still_deletes_the_job(smoke, google, front_end):
    google.fail(":run", status=403, api_status="PERMISSION_DENIED", message="The caller lacks cloudscheduler.jobs.run")
    result = smoke("--target=invoice")
    assert result.exit_code == 1 and "could not run projects/acme-prod" in result.output
    assert "cloudscheduler.jobs.run" in result.output and front_end.deliveries == 0
    throwaway_lifecycle(google)


def test_a_job_that_cannot_be_deleted_is_named_with_the_command(smoke, google, front_end):
    google.fail("/jobs/dedup-smoke-", method="DELETE", status=403, api_status="PERMISSION_DENIED")
    result = smoke("--target=invoice")
    assert result.exit_code == 1
    assert (
        "could not delete" in result.output and "delete it: gcloud scheduler jobs delete dedup-smoke-" in result.output
    )
    assert "ok: delivered" in result.output  # the smoke itself passed


def test_what_the_smoke_cannot_run_is_refused_before_any_call(smoke, google):
    assert "no job 'nope' in the jobs file" in smoke("--target=nope").output
    google.scheduler_jobs[NIGHTLY] = {"name": NIGHTLY, "schedule": "* * * * *", "httpTarget": {"uri": "https://x"}}
    named = smoke("--job=nightly")
    assert named.exit_code == 1 and "has httpTarget, not an App Engine target" in named.output
    assert "is not a Cloud Scheduler job id" in smoke("--job=a/b").output
    assert "must be an http(s) base URL" in smoke("--logging-api-base=ftp://x").output
    assert scheduler_calls(google) == [("GET", f"/v1/{NIGHTLY}")]


def test_the_logging_stand_in_reads_the_query_language_as_logging_does():
    entry = {"a": "x", "b": 2, "timestamp": "2030-01-01T00:00:01.5Z", "p": {"resource": "/jobs/a?x=1"}}
    assert parse_filter('a="x" AND b>=2 AND timestamp>="2030-01-01T00:00:00Z" AND p.resource:"/JOBS/a"')(entry)
    # OR binds tighter than AND: a AND (b OR c).
    assert not parse_filter('a="y" AND b=2 OR a="x"')(entry)
    assert parse_filter('NOT a="y" b=2')(entry)  # juxtaposition is AND
    assert not parse_filter('missing="x"')(entry) and not parse_filter("b>3")(entry)
    for bad in ('a="x" AND', "(a=x", 'labels."k"="v"', "a"):
        with pytest.raises(ValueError):
            parse_filter(bad)
