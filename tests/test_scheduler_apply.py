"""``python -m deploy scheduler apply`` through Cloud Scheduler's API, against a stand-in that speaks
its REST shapes and applies an update mask as the API does (devtools/cloud_scheduler_fake.py).

Each field scheduler.yaml (or jobs.yaml, for an external job's token) can set is taken off again:
a live job that has it, a declaration without it, one apply, and the PATCH's updateMask names the
field (and nothing else) and the live job no longer has it.  Then: a job created when absent, no
call when nothing changed, one call per changed job, what is said when the API refuses, and the
client's credentials (none against an ``http://`` base)."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner
from google.auth.credentials import AnonymousCredentials

from deploy.cli import cli as ops_cli
from deploy.scheduler_jobs import scheduler_client
from tests.support.scheduler_api import SCOPE, app_engine_job, scheduler_api  # noqa: F401 - fixture

NIGHTLY = f"{SCOPE}/jobs/nightly"
APP_JOBS = """
jobs:
  report:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 600
  reports:
    kind: external
    url: https://reports-abc123-uc.a.run.app/tasks/nightly
    service_account: nightly-caller@acme-prod.iam.gserviceaccount.com
    lease_seconds: 900
"""
EXTERNAL_URL = "https://reports-abc123-uc.a.run.app/tasks/nightly"
CALLER = "nightly-caller@acme-prod.iam.gserviceaccount.com"


@pytest.fixture
def deploy(jobs_file, tmp_path):
    """``python -m deploy scheduler COMMAND`` over a scheduler.yaml of ``nightly`` calling ``target``
    with ``settings`` (and other jobs, ``more``); jobs.yaml is APP_JOBS unless ``jobs`` says otherwise."""

    def run(
        command: str, *flags: str, settings: str = "", more: str = "", jobs: str = APP_JOBS, target: str = "report"
    ):
        schedule = tmp_path / "scheduler.yaml"
        schedule.write_text(declaration(settings, target) + textwrap.indent(textwrap.dedent(more), "  "))
        arguments = ["--jobs", jobs_file(jobs), "scheduler", command, *flags, str(schedule)]
        return CliRunner().invoke(ops_cli, arguments)

    return run


def declaration(settings: str = "", target: str = "report") -> str:
    lines = "".join(f"    {line}\n" for line in textwrap.dedent(settings).strip().splitlines())
    return (
        textwrap.dedent(f"""\
        defaults:
          project: acme-prod
          location: us-central1
        jobs:
          nightly:
            target: {target}
            schedule: "0 2 * * *"
        """)
        + lines
    )


def patches(fake) -> list:
    return fake.calls("PATCH")


# (what the file said, what it says now, the field named in the mask, the live value before, after)
CLEARED = [
    ("body: '{\"full\": true}'", "", "appEngineHttpTarget.body", "eyJmdWxsIjogdHJ1ZX0=", None),
    ("description: nightly report", "", "description", "nightly report", None),
    ("attempt_deadline: 5m", "", "attemptDeadline", "300s", "600s"),  # the scaling type's request timeout
    ("time_zone: Europe/Paris", "", "timeZone", "Europe/Paris", "Etc/UTC"),
    ("version: v2", "", "appEngineHttpTarget.appEngineRouting.version", "v2", None),
    ("service: reports", "", "appEngineHttpTarget.appEngineRouting.service", "reports", "dedup"),  # app.yaml's
    ("retry: {retry_count: 3}", "", "retryConfig.retryCount", 3, None),
    ("retry: {max_retry_duration: 1h}", "", "retryConfig.maxRetryDuration", "3600s", "0s"),
    ("retry: {min_backoff: 30s}", "", "retryConfig.minBackoffDuration", "30s", "5s"),
    ("retry: {max_backoff: 10m}", "", "retryConfig.maxBackoffDuration", "600s", "3600s"),
    ("retry: {max_doublings: 3}", "", "retryConfig.maxDoublings", 3, 5),
    (  # one retry setting of two
        "retry: {retry_count: 3, min_backoff: 30s}",
        "retry: {retry_count: 3}",
        "retryConfig.minBackoffDuration",
        "30s",
        "5s",
    ),
]


def at(job: dict, path: str):
    for key in path.split("."):
        job = job.get(key) if isinstance(job, dict) else None
    return job


@pytest.mark.parametrize("before, after, field, had, has", CLEARED, ids=[case[2] for case in CLEARED])
def test_a_field_the_file_no_longer_declares_is_cleared(deploy, scheduler_api, before, after, field, had, has):
    made = deploy("apply", settings=before)
    assert made.exit_code == 0, made.output
    assert at(scheduler_api.jobs[NIGHTLY], field) == had
    applied = deploy("apply", settings=after)
    assert applied.exit_code == 0, applied.output
    [patch] = patches(scheduler_api)
    assert patch.update_mask == [field]
    assert at(scheduler_api.jobs[NIGHTLY], field) == has
    assert "warning" not in applied.output
    assert deploy("apply", settings=after).output.splitlines()[-1].endswith("1 unchanged")


@pytest.mark.parametrize("removed, kept", [("X-Mode", "X-Tenant"), ("X-Tenant", "X-Mode")])
def test_each_header_the_file_no_longer_declares_is_cleared(deploy, scheduler_api, removed, kept):
    both = {"X-Mode": "full", "X-Tenant": "acme"}
    assert deploy("apply", settings="headers: {X-Mode: full, X-Tenant: acme}").exit_code == 0
    applied = deploy("apply", settings=f"headers: {{{kept}: {both[kept]}}}")
    assert applied.exit_code == 0, applied.output
    [patch] = patches(scheduler_api)
    assert patch.update_mask == ["appEngineHttpTarget.headers"]
    headers = scheduler_api.jobs[NIGHTLY]["appEngineHttpTarget"]["headers"]
    assert removed not in headers and headers[kept] == both[kept]
    assert deploy("apply").exit_code == 0  # and the last
    assert scheduler_api.jobs[NIGHTLY]["appEngineHttpTarget"]["headers"] == {
        "User-Agent": "AppEngine-Google; (+http://code.google.com/appengine)"  # Scheduler's own, not the job's
    }
    assert patches(scheduler_api)[-1].update_mask == ["appEngineHttpTarget.headers"]


def test_a_header_set_by_hand_is_cleared_and_schedulers_own_are_not_a_change(deploy, scheduler_api):
    """A live job's headers less those Scheduler adds (its User-Agent; a body's Content-Type) are the
    job's own: one set by hand goes, Scheduler's are left to it."""
    assert deploy("apply", settings="body: hello").exit_code == 0
    live = scheduler_api.jobs[NIGHTLY]
    live["appEngineHttpTarget"]["headers"]["Content-Type"] = "application/octet-stream"  # a body's, by Scheduler
    planned = deploy("plan", settings="body: hello")
    assert planned.output.startswith("unchanged nightly"), planned.output
    live["appEngineHttpTarget"]["headers"]["X-Debug"] = "1"
    assert deploy("apply", settings="body: hello").exit_code == 0
    assert [patch.update_mask for patch in patches(scheduler_api)] == [["appEngineHttpTarget.headers"]]
    assert "X-Debug" not in scheduler_api.jobs[NIGHTLY]["appEngineHttpTarget"]["headers"]


def test_an_http_targets_oauth_token_is_cleared_and_its_oidc_token_set(deploy, scheduler_api):
    """An external job's Scheduler job signs with an OIDC token of the caller's service account:
    an OAuth token put on the live job by hand goes, in the same one call."""
    scheduler_api.put(
        {
            "name": NIGHTLY,
            "schedule": "0 2 * * *",
            "timeZone": "Etc/UTC",
            "attemptDeadline": "600s",
            "retryConfig": {"minBackoffDuration": "5s", "maxBackoffDuration": "3600s", "maxDoublings": 5},
            "httpTarget": {
                "uri": f"{EXTERNAL_URL}?project=acme-prod&location=us-central1",
                "httpMethod": "POST",
                "oauthToken": {
                    "serviceAccountEmail": CALLER,
                    "scope": "https://www.googleapis.com/auth/cloud-platform",
                },
            },
        }
    )
    applied = deploy("apply", target="reports")
    assert applied.exit_code == 0, applied.output
    [patch] = patches(scheduler_api)
    assert patch.update_mask == [
        "httpTarget.oidcToken.serviceAccountEmail",
        "httpTarget.oidcToken.audience",
        "httpTarget.oauthToken",  # as a whole: one of a oneof with the OIDC token
    ]
    target = scheduler_api.jobs[NIGHTLY]["httpTarget"]
    assert "oauthToken" not in target
    assert target["oidcToken"] == {"serviceAccountEmail": CALLER, "audience": EXTERNAL_URL}


def test_an_instance_set_by_hand_is_cleared(deploy, scheduler_api):
    """The file never names an instance: one set on the live job by hand goes, as any field it does not set."""
    assert deploy("apply").exit_code == 0
    scheduler_api.jobs[NIGHTLY]["appEngineHttpTarget"].setdefault("appEngineRouting", {})["instance"] = "i-1"
    assert deploy("apply").exit_code == 0
    assert [p.update_mask for p in patches(scheduler_api)] == [["appEngineHttpTarget.appEngineRouting.instance"]]
    assert "instance" not in scheduler_api.jobs[NIGHTLY]["appEngineHttpTarget"].get("appEngineRouting", {})


def test_an_http_job_left_update_failed_names_no_oauth_token_it_never_had(deploy, scheduler_api):
    """Updated again in full, an http target's mask names its OIDC token and not the OAuth token:
    the two are one oneof, and naming both where only one is set could be refused."""
    assert deploy("apply", target="reports").exit_code == 0
    scheduler_api.jobs[NIGHTLY]["state"] = "UPDATE_FAILED"
    assert deploy("apply", target="reports").exit_code == 0
    [patch] = patches(scheduler_api)
    assert "httpTarget.oidcToken.audience" in patch.update_mask
    assert not [path for path in patch.update_mask if path.startswith("httpTarget.oauthToken")]


def test_the_stand_in_refuses_a_target_with_both_tokens_as_the_api_would(scheduler_api):
    from devtools.cloud_scheduler_fake import _target_problem

    both = {"httpTarget": {"uri": "https://h.acme.dev", "oidcToken": {}, "oauthToken": {}}}
    assert _target_problem(both) == "An HttpTarget takes an oidcToken or an oauthToken, not both."


def test_an_oidc_audience_jobs_yaml_no_longer_declares_is_the_url_again(deploy, scheduler_api):
    custom = APP_JOBS.replace("    lease_seconds: 900", "    lease_seconds: 900\n    audience: https://reports.example")
    assert deploy("apply", target="reports", jobs=custom).exit_code == 0
    assert scheduler_api.jobs[NIGHTLY]["httpTarget"]["oidcToken"]["audience"] == "https://reports.example"
    applied = deploy("apply", target="reports")
    assert applied.exit_code == 0, applied.output
    assert [patch.update_mask for patch in patches(scheduler_api)] == [["httpTarget.oidcToken.audience"]]
    assert scheduler_api.jobs[NIGHTLY]["httpTarget"]["oidcToken"]["audience"] == EXTERNAL_URL


def test_a_job_is_created_when_absent_with_what_the_file_declares_and_no_credentials(deploy, scheduler_api):
    applied = deploy(
        "apply",
        settings="""
        body: hello
        headers: {X-Mode: full}
        description: nightly report
        time_zone: Europe/Paris
        attempt_deadline: 5m
        retry: {retry_count: 3, min_backoff: 30s}
        """,
    )
    assert applied.exit_code == 0, applied.output
    assert applied.output.splitlines()[0] == f"create nightly ({NIGHTLY}): app-engine POST"
    [created] = scheduler_api.calls("POST")
    assert created.path == f"/v1/{SCOPE}/jobs"
    assert all("Authorization" not in call.headers for call in scheduler_api.calls())  # a local base: anonymous
    job = scheduler_api.jobs[NIGHTLY]
    assert job["appEngineHttpTarget"] == {
        "httpMethod": "POST",
        "appEngineRouting": {"service": "dedup"},
        "relativeUri": "/jobs/report?project=acme-prod&location=us-central1",
        "headers": {"X-Mode": "full", "User-Agent": "AppEngine-Google; (+http://code.google.com/appengine)"},
        "body": "aGVsbG8=",
    }
    assert (job["description"], job["timeZone"], job["attemptDeadline"]) == ("nightly report", "Europe/Paris", "300s")
    assert job["retryConfig"] == {
        "retryCount": 3,
        "maxRetryDuration": "0s",
        "minBackoffDuration": "30s",
        "maxBackoffDuration": "3600s",
        "maxDoublings": 5,
    }
    assert job["state"] == "ENABLED"


def test_nothing_changed_makes_no_call_and_each_changed_job_one(deploy, scheduler_api):
    more = """
      weekly:
        target: report
        schedule: "0 3 * * 1"
      monthly:
        target: report
        schedule: "0 4 * * 2"
    """
    assert deploy("apply", more=more).exit_code == 0
    scheduler_api.requests.clear()
    unchanged = deploy("apply", more=more)
    assert unchanged.exit_code == 0, unchanged.output
    assert [(call.method, call.path) for call in scheduler_api.calls()] == [("GET", f"/v1/{SCOPE}/jobs")]
    assert unchanged.output.splitlines()[-1] == "applied: 0 created, 0 updated, 0 made again, 3 unchanged"
    scheduler_api.requests.clear()
    changed = deploy("apply", settings="description: nightly", more=more.replace('"0 4 * * 2"', '"0 5 * * 2"'))
    assert changed.exit_code == 0, changed.output
    assert [(call.method, call.path, call.update_mask) for call in scheduler_api.calls()] == [
        ("GET", f"/v1/{SCOPE}/jobs", []),
        ("PATCH", f"/v1/{SCOPE}/jobs/nightly", ["description"]),
        ("PATCH", f"/v1/{SCOPE}/jobs/monthly", ["schedule"]),
    ]
    assert '    schedule: "0 4 * * 2" -> "0 5 * * 2"' in changed.output


def test_the_live_jobs_are_read_page_by_page(deploy, scheduler_api):
    more = "".join(f'job-{n}:\n  target: report\n  schedule: "0 {n} * * *"\n' for n in range(3))
    assert deploy("apply", more=more).exit_code == 0
    scheduler_api.page_size = 2
    scheduler_api.requests.clear()
    again = deploy("plan", more=more)
    assert again.exit_code == 0 and [line.split()[0] for line in again.output.splitlines()] == ["unchanged"] * 4
    assert [call.query.get("pageToken") for call in scheduler_api.calls()] == [None, "2"]


def test_a_refusal_stops_apply_saying_what_was_done_and_what_was_not(deploy, scheduler_api):
    more = """
      weekly:
        target: report
        schedule: "0 3 * * 1"
      monthly:
        target: report
        schedule: "0 4 * * 2"
    """
    scheduler_api.put(app_engine_job("weekly", schedule="0 3 * * 2"))
    scheduler_api.refuse("PATCH", "/jobs/weekly", message="The caller does not have permission")
    refused = deploy("apply", more=more)
    assert refused.exit_code == 1
    error = refused.output[refused.output.index("Error: ") :].splitlines()
    assert error[0].startswith(f"Error: Cloud Scheduler did not update weekly ({SCOPE}/jobs/weekly): 403 ")
    assert error[0].endswith("The caller does not have permission")
    assert error[1:] == ["done: created nightly", "not done: update weekly, create monthly"]
    assert "applied:" not in refused.output and "updated weekly" not in refused.output
    assert scheduler_api.jobs[f"{SCOPE}/jobs/weekly"]["schedule"] == "0 3 * * 2"  # as it was
    assert f"{SCOPE}/jobs/monthly" not in scheduler_api.jobs
    again = deploy("apply", more=more)  # the refusal lifted: the rest is done
    assert again.exit_code == 0 and again.output.splitlines()[-1].startswith("applied: 1 created, 1 updated")


def test_a_job_deleted_and_not_created_again_is_said_so(deploy, scheduler_api):
    scheduler_api.put(app_engine_job(method="GET"))
    scheduler_api.refuse("POST", "/jobs", status=400, api_status="INVALID_ARGUMENT", message="bad job")
    refused = deploy("apply")
    assert refused.exit_code == 1
    assert "nightly was deleted and not created again: apply again creates it" in refused.output
    assert "done: deleted nightly\nnot done: create nightly" in refused.output
    assert deploy("apply").exit_code == 0 and scheduler_api.jobs[NIGHTLY]["appEngineHttpTarget"]["httpMethod"] == "POST"


def test_assume_new_creates_without_asking_and_a_job_that_exists_fails(deploy, scheduler_api):
    planned = deploy("plan", "--assume-new")
    assert planned.exit_code == 0 and planned.output == f"create nightly ({NIGHTLY}): app-engine POST\n"
    assert scheduler_api.calls() == []  # plan --assume-new calls nothing
    assert deploy("apply", "--assume-new").exit_code == 0
    assert [call.method for call in scheduler_api.calls()] == ["POST"]
    again = deploy("apply", "--assume-new", settings="description: changed")
    assert again.exit_code == 1
    assert "409" in again.output and "nightly exists already: without --assume-new, apply updates it" in again.output
    assert "description" not in scheduler_api.jobs[NIGHTLY]


def test_a_job_left_update_failed_is_updated_again_in_full(deploy, scheduler_api):
    assert deploy("apply").exit_code == 0
    scheduler_api.jobs[NIGHTLY]["state"] = "UPDATE_FAILED"
    applied = deploy("apply")
    assert applied.exit_code == 0, applied.output
    assert "warning: nightly is UPDATE_FAILED in Cloud Scheduler" in applied.output
    [patch] = patches(scheduler_api)
    assert "schedule" in patch.update_mask and "appEngineHttpTarget.relativeUri" in patch.update_mask


def test_plan_with_gcloud_warns_only_of_what_the_live_job_holds_and_gcloud_cannot_clear(deploy, scheduler_api):
    assert deploy("apply").exit_code == 0
    planned = deploy("plan", "--gcloud", settings="description: nightly")
    assert planned.exit_code == 0 and "warning" not in planned.output
    assert deploy("apply", settings="description: nightly\nbody: hello").exit_code == 0
    cleared = deploy("plan", "--gcloud")
    assert [line for line in cleared.output.splitlines() if line.startswith("warning")] == [
        f"warning: nightly: no {word} declared; gcloud cannot clear the live job's, so it keeps it "
        "(scheduler apply clears it)"
        for word in ("description", "body")
    ]
    assert deploy("plan", "--gcloud", settings="description: nightly\nbody: hello").output == ""  # unchanged


def test_an_unreachable_api_is_a_clear_error(deploy, scheduler_api):
    scheduler_api.close()
    failed = deploy("plan")
    assert failed.exit_code == 1
    assert f"Error: Cloud Scheduler did not list the jobs of {SCOPE}: " in failed.output


def test_a_local_base_is_called_without_credentials_and_googles_with_adc(monkeypatch, tmp_path):
    """No credentials are looked for against an http:// stand-in; against Google's, Application
    Default Credentials are, and their absence is said plainly."""
    import google.auth._default
    import google.oauth2.credentials

    local = scheduler_client("http://127.0.0.1:9")
    assert isinstance(local._transport._credentials, AnonymousCredentials)
    user = tmp_path / "adc.json"
    user.write_text('{"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(user))
    google_s = scheduler_client("https://cloudscheduler.googleapis.com")
    assert isinstance(google_s._transport._credentials, google.oauth2.credentials.Credentials)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud ADC file
    # Nor a metadata server.  Not by GCE_METADATA_HOST: google-auth reads it once, when its metadata
    # module is first imported, and the stand-ins of the other tests set it for the whole session.
    monkeypatch.setattr(google.auth._default, "_get_gce_credentials", lambda *args, **kwargs: (None, None))
    monkeypatch.delenv("DEDUP_SCHEDULER_API_BASE", raising=False)
    schedule = tmp_path / "scheduler.yaml"
    schedule.write_text(declaration())
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(APP_JOBS)
    refused = CliRunner().invoke(ops_cli, ["--jobs", str(jobs), "scheduler", "plan", str(schedule)])
    assert refused.exit_code == 1
    assert "no Application Default Credentials for the Cloud Scheduler API" in refused.output


def test_the_api_base_is_an_option_too(deploy, scheduler_api, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", "http://127.0.0.1:9")  # nothing answers there
    applied = deploy("apply", f"--scheduler-api-base={scheduler_api.url}")
    assert applied.exit_code == 0, applied.output
    assert NIGHTLY in scheduler_api.jobs
    refused = deploy("plan", "--scheduler-api-base=ftp://scheduler.example")
    assert refused.exit_code == 2 and "--scheduler-api-base" in refused.output
