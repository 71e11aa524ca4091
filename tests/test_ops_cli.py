"""python -m deploy scheduler|firewall|ttl: validation rules, plans, --apply through gcloud, and the
Scheduler jobs applied through Cloud Scheduler's API (a stand-in: tests/test_scheduler_apply.py has
each field cleared)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import textwrap

import pytest
import yaml
from click.testing import CliRunner

from deploy.cli import cli as ops_cli
from schedules.config import RetryConfig, retry_intervals
from tests.support.gcloud import PARSED as GCLOUD_PARSED
from tests.support.gcloud import parse as gcloud_parse
from tests.support.scheduler_api import SCOPE, app_engine_job, scheduler_api  # noqa: F401 - fixture
from tests.support.shipped import EXAMPLE_JOBS, EXAMPLE_SCHEDULE, filled_in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP_JOBS = """
jobs:
  report:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 600
  quick:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 60
    retention_seconds: 3600
  monthly-friendly:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 600
    retention_seconds: 3000000
"""


@pytest.fixture
def cli(jobs_file, tmp_path):
    jobs = jobs_file(APP_JOBS)
    runner = CliRunner()  # result.output holds stdout and stderr

    def invoke(*args, schedule: str | None = None, env=None):
        arguments = list(args)
        if schedule is not None:
            path = tmp_path / "scheduler.yaml"
            path.write_text(textwrap.dedent(schedule))
            arguments.append(str(path))
        return runner.invoke(ops_cli, ["--jobs", jobs, *arguments], env=env)

    return invoke


VALID = """
defaults:
  project: acme-prod
  location: us-central1
jobs:
  nightly:
    target: report
    schedule: "0 2 * * *"
    attempt_deadline: 10m
    retry: {retry_count: 3, min_backoff: 30s, max_backoff: 10m, max_doublings: 3}
"""


def test_a_valid_file_passes(cli):
    result = cli("scheduler", "validate", schedule=VALID)
    assert result.exit_code == 0, result.output
    assert "1 job(s) valid" in result.output


def ops(*args: str) -> subprocess.CompletedProcess:
    """``python -m deploy ARGS`` from the repository root, as a user runs it."""
    env = {**os.environ}
    env.pop("DEDUP_JOBS_FILE", None)
    env.pop("DEDUP_AUTH", None)  # the ops commands never build the web app: no caller setting needed
    return subprocess.run(
        [sys.executable, "-m", "deploy", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_the_shipped_files_are_valid_once_their_placeholders_are_filled_in(tmp_path):
    jobs, schedule = filled_in(tmp_path)
    completed = ops("--jobs", str(jobs), "scheduler", "validate", str(schedule))
    assert completed.returncode == 0, completed.stderr
    assert "2 job(s) valid" in completed.stdout


@pytest.mark.slow
def test_the_shipped_files_do_not_validate_or_plan_until_filled_in(tmp_path):
    """As shipped, they would deploy a job calling crm.example.com, failing every hour."""
    for command in (["scheduler", "validate"], ["scheduler", "plan", "--assume-new"]):
        refused = ops("--jobs", str(EXAMPLE_JOBS), *command, str(EXAMPLE_SCHEDULE))
        assert refused.returncode == 1 and not refused.stdout  # no gcloud command printed
        assert "job 'sync-crm': field 'url': 'crm.example.com' is a placeholder" in refused.stderr
        assert "fill in the address of the service the job calls" in refused.stderr
    jobs, _ = filled_in(tmp_path)  # the URL filled in, the project not yet
    refused = ops("--jobs", str(jobs), "scheduler", "plan", "--assume-new", str(EXAMPLE_SCHEDULE))
    assert refused.returncode == 1 and not refused.stdout
    problems = refused.stderr.strip().splitlines()
    assert problems == [
        f"scheduler.yaml: job {name!r} field 'project': 'your-project-id' is the placeholder scheduler.yaml "
        "ships with: fill in the id of the Google Cloud project the app is deployed to (defaults.project, "
        "or the job's project)"
        for name in ("ledger-digest-daily", "sync-crm-hourly")
    ]


def test_scheduler_jobs_go_to_app_yaml_s_service_unless_they_name_another(cli, scheduler_api):
    """Left unset, Scheduler sends a job to the `default` service: another app's, not this one."""
    with open(os.path.join(ROOT, "app.yaml"), encoding="utf-8") as handle:
        service = yaml.safe_load(handle)["service"]
    assert service != "default"
    scheduler_api.put(app_engine_job())  # nightly exists (an update), weekly is created
    planned = cli("scheduler", "plan", "--gcloud", schedule=TWO_JOBS)
    lines = [line.split() for line in planned.output.splitlines() if line.startswith("gcloud ")]
    assert [line[3] for line in lines] == ["update", "create"]
    assert all(f"--service={service}" in line and "--clear-service" not in line for line in lines)
    assert cli("scheduler", "apply", schedule=TWO_JOBS).exit_code == 0
    routed = {name: job["appEngineHttpTarget"]["appEngineRouting"] for name, job in scheduler_api.jobs.items()}
    assert routed == {f"{SCOPE}/jobs/nightly": {"service": service}, f"{SCOPE}/jobs/weekly": {"service": service}}
    named = cli("scheduler", "plan", "--assume-new", "--gcloud", schedule=job(service="reports"))
    assert "--service=reports" in named.output and f"--service={service}" not in named.output


@pytest.mark.slow
def test_the_ops_commands_never_import_the_web_layer():
    code = (
        "import sys, deploy.cli\n"
        "web = sorted(m for m in sys.modules if m.split('.')[0] in ('handlers', 'flask'))\n"
        "sys.exit(f'imported {web}' if web else 0)"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr


def job(**overrides) -> str:
    settings = {
        "target": "report",
        "schedule": '"0 2 * * *"',
        "attempt_deadline": "10m",
        "project": "acme-prod",
        "location": "us-central1",
        **overrides,
    }
    lines = "\n".join(f"    {key}: {value}" for key, value in settings.items() if value is not None)
    return f"jobs:\n  nightly:\n{lines}\n"


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        ({"schedule": "every 5 minutes"}, "schedule", "not a unix-cron schedule"),
        ({"schedule": '"0 0 2 * * *"'}, "schedule", "not a unix-cron schedule"),
        ({"schedule": '"0 25 * * *"'}, "schedule", "not a unix-cron schedule"),
        ({"schedule": '"0 0 L * *"'}, "schedule", "not a unix-cron schedule"),
        ({"schedule": '"0 0 * * 1#2"'}, "schedule", "not a unix-cron schedule"),
        ({"schedule": '"0 0 ? * MON"'}, "schedule", "not a unix-cron schedule"),
        ({"target": "missing-job"}, "target", "not a job in jobs.yaml"),
        ({"target": "quick", "attempt_deadline": "5m"}, "attempt_deadline", "longer than the lease"),
        (
            {"attempt_deadline": "20m", "target": "monthly-friendly"},
            "attempt_deadline",
            "request timeout of automatic scaling",
        ),
        ({"attempt_deadline": "10s"}, "attempt_deadline", "15s to 24h15s"),
        ({"attempt_deadline": "25h", "scaling": "basic"}, "attempt_deadline", "15s to 24h15s"),
        (
            {"target": "quick", "attempt_deadline": "1m", "schedule": '"0 0 * * *"'},
            "schedule",
            "longer than the retention",
        ),
        ({"schedule": '"0 0 1 * *"'}, "schedule", "executions are up to"),
        (
            {
                "target": "quick",
                "attempt_deadline": "1m",
                "schedule": '"0 0 * * *"',
                "retry": "{retry_count: 5, min_backoff: 10m, max_backoff: 1h}",
            },
            "retry",
            "deliveries can arrive for",
        ),
        ({"retry": "{retry_count: 6}"}, "retry.retry_count", "must be at most 5, got 6"),
        ({"retry": "{retry_count: -1}"}, "retry.retry_count", "must be at least 0, got -1"),
        ({"retry": "{max_doublings: 17}"}, "retry.max_doublings", "must be at most 16, got 17"),
        ({"retry": "{min_backoff: 1h, max_backoff: 1m}"}, "retry.max_backoff", "shorter than min_backoff"),
        ({"retry": "{min_backoff: soon}"}, "retry.min_backoff", "not a duration"),
        ({"retry": "{min_backoff: 1h30}"}, "retry.min_backoff", "not a duration"),  # a unit on every part
        ({"retry": "{backoff: 1s}"}, "retry.backoff", "unknown key"),
        ({"time_zone": "Mars/Olympus"}, "time_zone", "tz database"),
        ({"time_zone": "localtime"}, "time_zone", "tz database"),  # the machine's zone, not a name Scheduler knows
        ({"headers": '{X-A: ",;|~#@"}'}, "headers", "every list delimiter"),
        # Retries may run past the next execution: the window is not capped at the 5-minute period.
        (
            {
                "target": "quick",
                "schedule": '"*/5 * * * *"',
                "attempt_deadline": "1m",
                "retry": "{retry_count: 5, min_backoff: 10m, max_backoff: 1h}",
            },
            "retry",
            "deliveries can arrive for 11760s",
        ),
        # retry_count 0 with a max_retry_duration still retries (for that long).
        (
            {"target": "quick", "attempt_deadline": "1m", "retry": "{retry_count: 0, max_retry_duration: 2h}"},
            "retry",
            "deliveries can arrive for 7260s",
        ),
        ({"method": "DELETE"}, "method", "serves POST and GET"),
        ({"method": "GET", "body": "x"}, "body", "POST only"),
        ({"headers": "{X-CloudScheduler-JobName: forged}"}, "headers", "set by Google"),
        ({"scaling": "elastic"}, "scaling", "automatic"),
        ({"project": "Acme"}, "project", "not a project id"),
        ({"location": "mars"}, "location", "not a location"),
        ({"colour": "red"}, "colour", "unknown key"),
        ({"schedule": None}, "schedule", "missing"),
    ],
)
def test_each_rule_names_the_job_and_field(cli, overrides, field, words):
    result = cli("scheduler", "validate", schedule=job(**overrides))
    assert result.exit_code == 1
    output = result.output
    assert "job 'nightly'" in output and f"field '{field}'" in output, output
    assert words in output


def test_a_job_id_shared_across_scopes_must_pass_its_scope(cli):
    declarations = """
    jobs:
      nightly-us:
        name: nightly
        target: report
        schedule: "0 2 * * *"
        project: acme-prod
        location: us-central1
        pass_scope: {us}
      nightly-eu:
        name: nightly
        target: report
        schedule: "0 2 * * *"
        project: acme-prod
        location: europe-west1
    """
    assert cli("scheduler", "validate", schedule=declarations.format(us="true")).exit_code == 0
    result = cli("scheduler", "validate", schedule=declarations.format(us="false"))
    assert result.exit_code == 1
    assert "job 'nightly-us' field 'pass_scope'" in result.output and "share keys" in result.output


def test_retry_intervals_follow_schedulers_documented_example():
    # min 10s, max 300s, 3 doublings: 10, 20, 40, 80, 160, 240, 300, 300 (job.proto's example)
    assert retry_intervals(RetryConfig(retry_count=5, min_backoff=10, max_backoff=300, max_doublings=3)) == [
        10,
        20,
        40,
        80,
        160,
    ]
    assert retry_intervals(RetryConfig(retry_count=5, min_backoff=80, max_backoff=300, max_doublings=0)) == [
        80,
        160,
        240,
        300,
        300,
    ]


@pytest.fixture
def fake_gcloud(tmp_path):
    """A gcloud on PATH that records its arguments and knows the firewall's rules."""
    log = tmp_path / "gcloud.log"
    script = tmp_path / "bin" / "gcloud"
    script.parent.mkdir()
    script.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable} -IS
        import os, sys
        with open({str(log)!r}, "a") as handle:
            handle.write("\\x1f".join(sys.argv[1:]) + "\\n")
        if sys.argv[1:4] == ["app", "firewall-rules", "list"]:
            print("1000\tALLOW\t0.1.0.2/32\tCloud Scheduler App Engine jobs, Cloud Tasks and cron")
            print("1002\tDENY\t192.0.2.7\tblock a scraper")
            print("1003\tALLOW\t198.51.100.0/24\tadmin range")
            print("2147483647\tDENY\t*\tThe default action.")
    """)
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{script.parent}:{os.environ['PATH']}"}

    def calls():
        return [line.split("\x1f") for line in log.read_text().splitlines()] if log.exists() else []

    return env, calls


TWO_JOBS = (
    VALID
    + """
  weekly:
    target: report
    schedule: "0 3 * * 1"
    retry: {retry_count: 1}
"""
)


def actions(output: str) -> list[str]:
    """The plan's steps, in order: the first word of each line naming one."""
    steps = ("create", "update", "recreate", "pause", "unchanged")
    return [line.split()[0] for line in output.splitlines() if line.split()[:1] and line.split()[0] in steps]


def test_plan_updates_existing_jobs_and_creates_new_ones(cli, scheduler_api, fake_gcloud, monkeypatch):
    """The plan asks the API which jobs exist (one jobs.list), and names each field an update sets."""
    env, calls = fake_gcloud
    monkeypatch.setenv("PATH", env["PATH"])
    scheduler_api.put(app_engine_job())
    result = cli("scheduler", "plan", schedule=TWO_JOBS.replace("weekly:", "weekly:\n    attempt_deadline: 5m"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        f"update nightly ({SCOPE}/jobs/nightly): attemptDeadline, retryConfig.retryCount, "
        "retryConfig.minBackoffDuration, retryConfig.maxBackoffDuration, retryConfig.maxDoublings, "
        "appEngineHttpTarget.relativeUri, appEngineHttpTarget.appEngineRouting.service"
    )
    assert '    attemptDeadline: unset -> "600s"' in lines
    assert (
        '    appEngineHttpTarget.relativeUri: "/jobs/report" -> "/jobs/report?project=acme-prod&location=us-central1"'
        in lines
    )
    assert lines[-1] == f"create weekly ({SCOPE}/jobs/weekly): app-engine POST"
    assert "warning" not in result.output  # an update clears what the file leaves out: nothing to warn of
    assert [(call.method, call.path) for call in scheduler_api.calls()] == [("GET", f"/v1/{SCOPE}/jobs")]
    assert calls() == []  # no gcloud


def test_a_changed_http_method_recreates_the_job(cli, scheduler_api):
    """gcloud's update keeps the live method whatever it is told: the plan deletes and creates, by
    either road, and keeps the job's pause (none here)."""
    scheduler_api.put(app_engine_job())
    result = cli("scheduler", "plan", "--gcloud", schedule=job(method="GET"))
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("gcloud ")]
    assert lines[0] == "gcloud scheduler jobs delete nightly --project=acme-prod --location=us-central1 --quiet"
    assert lines[1].startswith("gcloud scheduler jobs create app-engine nightly ") and "--http-method=get" in lines[1]
    assert "the live job sends app-engine POST, the file says app-engine GET" in result.output
    applied = cli("scheduler", "apply", schedule=job(method="GET"))
    assert applied.exit_code == 0, applied.output
    assert f"recreate nightly ({SCOPE}/jobs/nightly): delete it, then create it as app-engine GET" in applied.output
    assert [call.method for call in scheduler_api.calls()][-2:] == ["DELETE", "POST"]
    live = scheduler_api.jobs[f"{SCOPE}/jobs/nightly"]
    assert live["appEngineHttpTarget"]["httpMethod"] == "GET" and live["state"] == "ENABLED"


def test_a_key_given_twice_is_refused(cli):
    result = cli("scheduler", "validate", schedule=job(retry="{retry_count: 1, retry_count: 5}"))
    assert result.exit_code == 1 and "declared twice" in result.output


def test_utc_is_a_time_zone(cli):
    assert cli("scheduler", "validate", schedule=job(time_zone="utc")).exit_code == 0


def test_apply_calls_the_api_once_per_changed_job_and_runs_no_gcloud(cli, scheduler_api, fake_gcloud, monkeypatch):
    env, calls = fake_gcloud
    monkeypatch.setenv("PATH", env["PATH"])
    scheduler_api.put(app_engine_job())
    result = cli("scheduler", "apply", schedule=VALID)
    assert result.exit_code == 0, result.output
    assert "updated nightly" in result.output
    assert result.output.splitlines()[-1] == "applied: 0 created, 1 updated, 0 made again, 0 unchanged"
    assert [call.method for call in scheduler_api.calls()] == ["GET", "PATCH"]
    again = cli("scheduler", "apply", schedule=VALID)
    assert again.output.splitlines()[-1] == "applied: 0 created, 0 updated, 0 made again, 1 unchanged"
    assert [call.method for call in scheduler_api.calls()] == ["GET", "PATCH", "GET"]
    assert calls() == []


def test_plan_refuses_an_invalid_file(cli):
    result = cli("scheduler", "plan", "--assume-new", schedule=job(schedule="every 5 minutes"))
    assert result.exit_code == 1 and "gcloud scheduler" not in result.output


def test_headers_with_commas_long_durations_and_updated_headers(cli, scheduler_api):
    scheduler_api.put(app_engine_job())
    result = cli(
        "scheduler",
        "plan",
        "--gcloud",
        schedule=VALID.replace(
            "    retry:", '    headers: {Accept: "text/plain, application/json", X-Mode: full}\n    retry:'
        )
        .replace("min_backoff: 30s", "min_backoff: 0.5s")
        .replace("max_doublings: 3}", "max_doublings: 3, max_retry_duration: 4d23h30m}"),
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("gcloud ")]
    assert "--max-retry-duration=430200s" in lines[0] and "--min-backoff=0.5s" in lines[0]
    assert lines[1].endswith("'--update-headers=^;^Accept=text/plain, application/json;X-Mode=full'")


def test_firewall_and_ttl_print_and_apply(cli, fake_gcloud, monkeypatch):
    env, calls = fake_gcloud
    monkeypatch.setenv("PATH", env["PATH"])
    printed = cli("firewall", "--admin-range", "203.0.113.0/24", "--project", "acme-prod")
    assert printed.exit_code == 0
    lines = [line for line in printed.output.splitlines() if line.startswith("gcloud ")]
    # Allow rules first, the default deny last: a failure part-way locks nobody out.
    assert lines[-1] == "gcloud app firewall-rules update default --action=deny --project=acme-prod"
    assert lines[0].startswith("gcloud app firewall-rules update 1000 ") and "--source-range=0.1.0.2/32" in lines[0]
    assert lines[1].startswith("gcloud app firewall-rules create 1001 ") and "--source-range=0.1.0.1/32" in lines[1]
    assert lines[2].startswith("gcloud app firewall-rules update 1002 ") and "--source-range=203.0.113.0/24" in lines[2]
    assert "warning: priority 1002 holds another rule (DENY 192.0.2.7, 'block a scraper')" in printed.output
    # An admin range an earlier run allowed and this one does not ask for goes.
    assert lines[3] == "gcloud app firewall-rules delete 1003 --quiet --project=acme-prod"
    assert len(lines) == 5
    assert [c[:3] for c in calls()] == [["app", "firewall-rules", "list"]]
    assert cli("firewall", "--admin-range", "not-a-range").exit_code != 0
    applied = cli("ttl", "--project", "acme-prod", "--apply")
    assert applied.exit_code == 0
    assert calls()[-1] == [
        "firestore",
        "fields",
        "ttls",
        "update",
        "expire_at",
        "--collection-group=DedupRun",
        "--enable-ttl",
        "--project=acme-prod",
    ]


def test_jobs_names_the_jobs_file_scheduler_yaml_is_checked_against(jobs_file, tmp_path):
    schedule = tmp_path / "scheduler.yaml"
    schedule.write_text(textwrap.dedent(VALID))
    other = jobs_file("jobs:\n  other:\n    kind: python\n    target: tests.job_targets:record\n")
    result = CliRunner().invoke(ops_cli, ["--jobs", other, "scheduler", "validate", str(schedule)])
    assert result.exit_code == 1 and "report" in result.output  # report is not in that jobs file
    broken = jobs_file("jobs: [")
    result = CliRunner().invoke(ops_cli, ["--jobs", broken, "scheduler", "validate", str(schedule)])
    assert result.exit_code == 1 and "not valid YAML" in result.output


def test_iap_prints_and_applies_enable_grants_and_the_project_number(cli, fake_gcloud, monkeypatch):
    env, calls = fake_gcloud
    monkeypatch.setenv("PATH", env["PATH"])
    members = ["serviceAccount:ci@acme-prod.iam.gserviceaccount.com", "domain:example.com"]
    printed = cli("iap", "--project", "acme-prod", *[f"--member={m}" for m in members])
    assert printed.exit_code == 0, printed.output
    lines = [line for line in printed.output.splitlines() if line.startswith("gcloud ")]
    assert lines == [
        "gcloud iap web enable --resource-type=app-engine --project=acme-prod",
        *[
            "gcloud iap web add-iam-policy-binding --resource-type=app-engine --project=acme-prod "
            f"--member={m} --role=roles/iap.httpsResourceAccessor"
            for m in members
        ],
        "gcloud projects describe acme-prod '--format=value(projectNumber)'",
    ]
    assert "DEDUP_IAP_AUDIENCE=/projects/PROJECT_NUMBER/apps/acme-prod" in printed.output
    assert calls() == []  # printed only
    applied = cli("iap", "--project", "acme-prod", f"--member={members[0]}", "--apply")
    assert applied.exit_code == 0, applied.output
    assert [c[:4] for c in calls()] == [
        ["iap", "web", "enable", "--resource-type=app-engine"],
        ["iap", "web", "add-iam-policy-binding", "--resource-type=app-engine"],
        ["projects", "describe", "acme-prod", "--format=value(projectNumber)"],
    ]


@pytest.mark.parametrize(
    "member", ["alice@example.com", "user:alice", "allUsers", "user:a b@example.com", "domain:", "role:x@y.z"]
)
def test_iap_refuses_a_member_iam_would_not_take(cli, member):
    refused = cli("iap", "--project", "acme-prod", f"--member={member}")
    assert refused.exit_code != 0 and "user:EMAIL, serviceAccount:EMAIL" in refused.output


HOURLY_AND_DAILY = """
defaults:
  project: acme-prod
  location: us-central1
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
    finish_within: 10m
  invoice-quarterly:
    target: invoice
    schedule: "*/15 * * * *"
  invoice-daily:
    target: invoice
    schedule: "0 3 * * *"
"""


def test_alerts_prints_metric_policies_per_job_and_applies_them(cli, fake_gcloud, monkeypatch, tmp_path):
    """Issue 41 §2: slots missed, stuck or failed and forward progress, on the slot metrics,
    grouped by Scheduler job and job; the audit's breach lines keep their log-match policy."""
    import json

    env, calls = fake_gcloud
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    printed = cli("alerts", "--project", "acme-prod", "--notification-channel", "123", schedule=HOURLY_AND_DAILY)
    assert printed.exit_code == 0, printed.output
    lines = [line for line in printed.output.splitlines() if line.startswith("gcloud ")]
    assert [line.split()[5] for line in lines] == [
        "--policy-from-file=dedup-slot-alert-policy.json",
        "--policy-from-file=dedup-progress-alert-policy.json",
        "--policy-from-file=dedup-breach-alert-policy.json",
    ]
    slots, progress, breaches = [
        json.loads(part.split("\nEOF", 1)[0]) for part in printed.output.split("<<'EOF'\n")[1:]
    ]
    assert {policy["notificationChannels"][0] for policy in (slots, progress, breaches)} == {
        "projects/acme-prod/notificationChannels/123"
    }
    counted = [c["conditionThreshold"] for c in slots["conditions"]]
    assert [c["filter"].split('metric.label.outcome="')[1].rstrip('"') for c in counted] == [
        "missed",
        "stuck",
        "failed",
        "conflict",
    ]
    for condition in counted:  # a slot, counted once, raises an incident naming its Scheduler job and job
        assert "workload.googleapis.com/dedup.slot.outcomes" in condition["filter"]
        (aggregation,) = condition["aggregations"]
        assert aggregation["groupByFields"] == ["metric.label.scheduler_job", "metric.label.job"]
    assert "${metric.label.scheduler_job}" in slots["documentation"]["content"]
    # Forward progress: an hour and its 10 minutes; two quarter-hours (metric absences); the daily
    # job's 48 hours, past what an absence waits, on the audit's progress age; and the audit's silence.
    absent = [c for c in progress["conditions"] if "conditionAbsent" in c]
    silence, *absences = absent
    assert silence["displayName"] == "The audit has not judged any slot for 60 minutes"
    assert "dedup.slot.progress_age" in silence["conditionAbsent"]["filter"]
    waits = {c["conditionAbsent"]["duration"]: c["conditionAbsent"]["filter"] for c in absences}
    assert set(waits) == {"1800s", "4200s"}
    assert '"invoice-hourly"' in waits["4200s"] and '"invoice-quarterly"' in waits["1800s"]
    assert 'metric.label.outcome=one_of("ran_once", "ran_after_retries", "excluded")' in waits["1800s"]
    (aged,) = [c["conditionThreshold"] for c in progress["conditions"] if "conditionThreshold" in c]
    assert aged["filter"].endswith('metric.label.scheduler_job=one_of("invoice-daily")')
    assert "workload.googleapis.com/dedup.slot.progress_age" in aged["filter"]
    # Two days, and what the audit takes to judge a slot (its retry window, the grace, an interval).
    from deploy.monitoring import progress_age_threshold
    from schedules.config import audit_lag_seconds, parse_scheduler_document

    daily = next(j for j in parse_scheduler_document(yaml.safe_load(HOURLY_AND_DAILY)) if j.name == "invoice-daily")
    assert aged["thresholdValue"] == progress_age_threshold(daily) >= 2 * 86400 + audit_lag_seconds(daily)
    assert "forward progress is not watched" not in printed.output
    for breach in ("late", "overdue", "slow", "failing"):
        assert f'jsonPayload.outcome="{breach}"' in breaches["conditions"][0]["conditionMatchedLog"]["filter"]
    assert breaches["alertStrategy"]["notificationRateLimit"]["period"]  # required of log-match policies
    assert calls() == [] and not (tmp_path / "dedup-slot-alert-policy.json").exists()  # printed only
    applied = cli("alerts", "--project", "acme-prod", "--apply", schedule=HOURLY_AND_DAILY)
    assert applied.exit_code == 0, applied.output
    assert [c[:4] for c in calls()] == [["alpha", "monitoring", "policies", "create"]] * 3
    written = json.loads((tmp_path / "dedup-progress-alert-policy.json").read_text())
    assert "conditionAbsent" in written["conditions"][0]


def test_periods_set_the_wait_of_jobs_without_finish_within(cli, fake_gcloud, monkeypatch, tmp_path):
    import json

    monkeypatch.chdir(tmp_path)
    printed = cli("alerts", "--project", "acme-prod", "--periods", "4", schedule=HOURLY_AND_DAILY)
    progress = json.loads(printed.output.split("<<'EOF'\n")[2].split("\nEOF", 1)[0])
    absences = [c["conditionAbsent"]["duration"] for c in progress["conditions"] if "conditionAbsent" in c]
    assert set(absences[1:]) == {"3600s", "4200s"}  # the first: the audit's silence


def test_dashboard_prints_a_row_per_job_and_creates_it(cli, fake_gcloud, monkeypatch, tmp_path):
    import json

    env, calls = fake_gcloud
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    printed = cli("dashboard", "--project", "acme-prod", schedule=HOURLY_AND_DAILY)
    assert printed.exit_code == 0, printed.output
    (board,) = [json.loads(part.split("\nEOF", 1)[0]) for part in printed.output.split("<<'EOF'\n")[1:]]
    titles = [tile["widget"]["title"] for tile in board["mosaicLayout"]["tiles"]]
    assert titles[0] == "Every slot, by outcome" and len(titles) == 4 * (1 + 3)
    assert titles[4:8] == [
        "invoice-hourly → invoice: outcomes",
        "invoice-hourly → invoice: schedule delay (s)",
        "invoice-hourly → invoice: run duration (s)",
        "invoice-hourly → invoice: attempts",
    ]
    assert [line for line in printed.output.splitlines() if line.startswith("gcloud ")] == [
        "gcloud monitoring dashboards create --config-from-file=dedup-dashboard.json --project=acme-prod"
    ]
    assert cli("dashboard", "--project", "acme-prod", "--apply", schedule=HOURLY_AND_DAILY).exit_code == 0
    assert calls() == [
        ["monitoring", "dashboards", "create", "--config-from-file=dedup-dashboard.json", "--project=acme-prod"]
    ]
    assert json.loads((tmp_path / "dedup-dashboard.json").read_text()) == board


@pytest.mark.parametrize(
    "paused, live, note",
    [
        ("true", "ENABLED", "the app makes it paused"),
        ("true", "PAUSED", None),
        ("false", "PAUSED", "the app makes it enabled"),
        ("false", "ENABLED", None),
        (None, "PAUSED", "left so"),  # unsaid: an operator's pause is not undone by a deploy
    ],
)
def test_plan_leaves_an_existing_jobs_pause_to_the_app(cli, scheduler_api, paused, live, note):
    """The app applies the file's paused when the version that changes it first runs (in its
    record and in Cloud Scheduler), so the file and an operator's action never fight over it."""
    scheduler_api.put(app_engine_job(), state=live)
    planned = cli("scheduler", "plan", schedule=job(paused=paused))
    assert planned.exit_code == 0, planned.output
    assert actions(planned.output) == ["update"]
    notes = [line for line in planned.output.splitlines() if line.startswith("note:")]
    assert (notes[0] if notes else None) is None if note is None else note in notes[0]


def test_a_paused_job_made_again_stays_paused(cli, scheduler_api):
    """A changed HTTP method deletes and creates the job: its pause is kept unless the file says paused: false."""
    scheduler_api.put(app_engine_job(), state="PAUSED")
    planned = cli("scheduler", "plan", "--gcloud", schedule=job(method="GET"))
    verbs = [line.split()[3] for line in planned.output.splitlines() if line.startswith("gcloud scheduler jobs")]
    assert planned.exit_code == 0 and verbs == ["delete", "create", "pause"]
    assert actions(cli("scheduler", "plan", schedule=job(method="GET")).output) == ["recreate", "pause"]
    resumed = cli("scheduler", "plan", "--gcloud", schedule=job(method="GET", paused="false"))
    assert [line.split()[3] for line in resumed.output.splitlines() if line.startswith("gcloud scheduler")] == [
        "delete",
        "create",
    ]
    applied = cli("scheduler", "apply", schedule=job(method="GET"))
    assert applied.exit_code == 0, applied.output
    assert [call.method for call in scheduler_api.calls()][-3:] == ["DELETE", "POST", "POST"]  # ..., :pause
    assert scheduler_api.jobs[f"{SCOPE}/jobs/nightly"]["state"] == "PAUSED"


def test_a_new_paused_job_is_created_then_paused(cli):
    planned = cli("scheduler", "plan", "--assume-new", "--gcloud", schedule=job(paused="true"))
    verbs = [line.split()[3] for line in planned.output.splitlines() if line.startswith("gcloud scheduler jobs")]
    assert planned.exit_code == 0 and verbs == ["create", "pause"]
    assert actions(cli("scheduler", "plan", "--assume-new", schedule=job(paused="true")).output) == ["create", "pause"]


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"paused": "yes please"}, "must be true or false"),
        ({"note": '"why"'}, "beside paused: true"),
        ({"paused": "true", "note": "5"}, "beside paused: true"),
        ({"paused": "true", "note": '"' + "x" * 501 + '"'}, "at most 500"),
    ],
)
def test_a_bad_paused_or_note_is_refused_by_name(cli, settings, words):
    result = cli("scheduler", "validate", schedule=job(**settings))
    assert result.exit_code == 1 and words in result.output


EXTERNAL_JOBS = """
jobs:
  reports:
    kind: external
    url: https://nightly-report-abc123-uc.a.run.app/tasks/nightly-report
    service_account: nightly-caller@acme-prod.iam.gserviceaccount.com
    lease_seconds: 900
"""


def test_an_external_jobs_scheduler_job_is_an_http_target_with_an_oidc_token(jobs_file, tmp_path, scheduler_api):
    """Its Scheduler job calls the handler (with the scope), signed by the caller's service
    account; a live App Engine job of the same name is made again as an HTTP one."""
    schedule = tmp_path / "scheduler.yaml"
    schedule.write_text(VALID.replace("target: report", "target: reports"))
    arguments = ["--jobs", jobs_file(EXTERNAL_JOBS), "scheduler"]
    planned = CliRunner().invoke(ops_cli, [*arguments, "plan", "--gcloud", "--assume-new", str(schedule)])
    assert planned.exit_code == 0, planned.output
    [line] = [line for line in planned.output.splitlines() if line.startswith("gcloud ")]
    command = shlex.split(line)
    assert command[:6] == ["gcloud", "scheduler", "jobs", "create", "http", "nightly"]
    url = "https://nightly-report-abc123-uc.a.run.app/tasks/nightly-report"
    assert f"--uri={url}?project=acme-prod&location=us-central1" in command
    assert "--oidc-service-account-email=nightly-caller@acme-prod.iam.gserviceaccount.com" in command
    assert f"--oidc-token-audience={url}" in command and not any(c.startswith("--service=") for c in command)
    code, said = gcloud_parse(line, tmp_path)  # gcloud's own parser takes it
    assert code != 2 and GCLOUD_PARSED in said, said
    scheduler_api.put(app_engine_job())  # the live nightly is an App Engine job
    live = CliRunner().invoke(ops_cli, [*arguments, "plan", "--gcloud", str(schedule)])
    assert "the live job sends app-engine POST, the file says http POST" in live.output
    lines = [line for line in live.output.splitlines() if line.startswith("gcloud ")]
    assert lines[0].startswith("gcloud scheduler jobs delete nightly ") and " create http nightly " in lines[1]
    applied = CliRunner().invoke(ops_cli, [*arguments, "apply", str(schedule)])
    assert applied.exit_code == 0, applied.output
    target = scheduler_api.jobs[f"{SCOPE}/jobs/nightly"]["httpTarget"]
    assert "appEngineHttpTarget" not in scheduler_api.jobs[f"{SCOPE}/jobs/nightly"]
    assert target["uri"] == f"{url}?project=acme-prod&location=us-central1"
    assert target["oidcToken"] == {
        "serviceAccountEmail": "nightly-caller@acme-prod.iam.gserviceaccount.com",
        "audience": url,
    }
