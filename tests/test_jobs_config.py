"""jobs.yaml: every mistake stops start-up with a message naming the job and the field."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from jobs.config import load_jobs, parse_jobs
from jobs.errors import JobsConfigError
from jobs.kinds.http import HttpJob
from jobs.kinds.python import PythonJob
from tests.support.shipped import EXAMPLE_JOBS, filled_in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(text: str):
    return parse_jobs(textwrap.dedent(text))


def test_shipped_jobs_files_are_valid_once_filled_in(tmp_path):
    jobs, _ = filled_in(tmp_path)
    shipped = load_jobs(str(jobs))
    assert {spec.kind for spec in shipped.values()} >= {"python", "http"}
    local = load_jobs(os.path.join(ROOT, "examples", "local-jobs.yaml"))
    assert "slow-report" in local


def test_the_shipped_jobs_yaml_stops_the_app_until_its_url_is_filled_in():
    """Its sync-crm calls crm.example.com, where no service answers: it would fail every run."""
    with pytest.raises(JobsConfigError) as caught:
        load_jobs(str(EXAMPLE_JOBS))
    assert str(caught.value).endswith(
        "job 'sync-crm': field 'url': 'crm.example.com' is a placeholder (a name reserved for examples, "
        "RFC 2606): fill in the address of the service the job calls"
    )


@pytest.mark.parametrize(
    "host",
    ["example.com", "crm.example.com", "API.Example.Org.", "hooks.example.net", "crm.example", "x.invalid", "a.test"],
)
@pytest.mark.parametrize("kind", ["http", "workflow"])
def test_a_url_at_a_reserved_example_name_is_a_placeholder(host, kind):
    field, settings = {
        "http": ("url", f"url: https://{host}/hooks/sync"),
        "workflow": ("api_base", f"workflow: projects/p/locations/l/workflows/w\n    api_base: https://{host}"),
    }[kind]
    with pytest.raises(JobsConfigError) as caught:
        parse_jobs(f"jobs:\n  j:\n    kind: {kind}\n    {settings}\n")
    assert f"field '{field}': {host.lower()!r} is a placeholder" in str(caught.value)


@pytest.mark.parametrize("host", ["notexample.com", "example.com.au", "example-corp.internal", "127.0.0.1", "testing"])
def test_names_that_only_resemble_the_reserved_ones_are_served(host):
    assert parse_jobs(f"jobs:\n  j:\n    kind: http\n    url: http://{host}/x\n")["j"].kind == "http"


def test_defaults_and_kinds():
    jobs = parse("""
        jobs:
          report:
            kind: python
            target: tests.job_targets:record
          sync:
            kind: http
            url: https://hooks.acme-corp.internal/hook
    """)
    assert jobs["report"].policy.lease_seconds == 600
    assert jobs["report"].policy.retention_seconds == 7 * 24 * 3600
    assert isinstance(jobs["report"].runner, PythonJob)
    sync = jobs["sync"].runner
    assert isinstance(sync, HttpJob)
    assert (sync.method, sync.timeout_seconds, sync.headers) == ("POST", 30, {})


@pytest.mark.parametrize(
    "settings, job, field, words",
    [
        ("kind: cobol\n    target: a:b", "j", "kind", "unknown kind 'cobol'"),
        ("target: a:b", "j", "kind", "missing"),
        ("kind: python", "j", "target", "missing"),
        ("kind: python\n    target: tests.job_targets:record\n    colour: red", "j", "colour", "unknown key"),
        ("kind: python\n    target: no.such.module:run", "j", "target", "cannot import module"),
        ("kind: python\n    target: tests.job_targets:nothing_here", "j", "target", "not found"),
        ("kind: python\n    target: tests.job_targets:EFFECTS", "j", "target", "not callable"),
        ("kind: python\n    target: just_a_name", "j", "target", "package.module:function"),
        ("kind: python\n    target: tests.job_targets:record\n    lease_seconds: 0", "j", "lease_seconds", "positive"),
        ("kind: python\n    target: tests.job_targets:record\n    lease_seconds: -5", "j", "lease_seconds", "positive"),
        (
            "kind: python\n    target: tests.job_targets:record\n    lease_seconds: ten",
            "j",
            "lease_seconds",
            "positive",
        ),
        (
            "kind: python\n    target: tests.job_targets:record\n    lease_seconds: .inf",
            "j",
            "lease_seconds",
            "positive",
        ),
        (
            "kind: python\n    target: tests.job_targets:record\n    lease_seconds: true",
            "j",
            "lease_seconds",
            "positive",
        ),
        (
            "kind: python\n    target: tests.job_targets:record\n    retention_seconds: 10",
            "j",
            "retention_seconds",
            "longer than lease_seconds",
        ),
        (
            "kind: python\n    target: tests.job_targets:record\n    retention_seconds: 1.0e+12",
            "j",
            "retention_seconds",
            "at most",
        ),
        (
            "kind: python\n    target: tests.job_targets:record\n    lease_seconds: 1.0e+12",
            "j",
            "lease_seconds",
            "at most",
        ),
        ("kind: http\n    url: https://hooks.acme-corp.internal:99999/x", "j", "url", "out of range"),
        (
            "kind: http\n    url: https://hooks.acme-corp.internal\n    headers: {X-Price: '€'}",
            "j",
            "headers",
            "Latin-1",
        ),
        (
            "kind: http\n    url: https://hooks.acme-corp.internal\n    headers: {X-Mode: ' leading'}",
            "j",
            "headers",
            "whitespace",
        ),
        ("kind: http", "j", "url", "missing"),
        ("kind: http\n    url: ftp://example.com/x", "j", "url", "absolute http(s) URL"),
        ("kind: http\n    url: /relative", "j", "url", "absolute http(s) URL"),
        ("kind: http\n    url: https://hooks.acme-corp.internal\n    method: BREW", "j", "method", "one of"),
        (
            "kind: http\n    url: https://hooks.acme-corp.internal\n    timeout_seconds: 0",
            "j",
            "timeout_seconds",
            "positive",
        ),
        (
            "kind: http\n    url: https://hooks.acme-corp.internal\n    timeout_seconds: 60\n    lease_seconds: 60",
            "j",
            "timeout_seconds",
            "shorter than lease_seconds",
        ),
        ("kind: http\n    url: https://hooks.acme-corp.internal\n    headers: [a, b]", "j", "headers", "mapping"),
        (
            "kind: http\n    url: https://hooks.acme-corp.internal\n    headers: {Idempotency-Key: x}",
            "j",
            "headers",
            "set by the app",
        ),
        (
            "kind: http\n    url: https://hooks.acme-corp.internal\n    headers: {'bad name': x}",
            "j",
            "headers",
            "not a valid header name",
        ),
        (
            "kind: http\n    url: https://hooks.acme-corp.internal\n    headers: {X-Count: 5}",
            "j",
            "headers",
            "must be a string",
        ),
    ],
)
def test_bad_job_names_job_and_field(settings, job, field, words):
    with pytest.raises(JobsConfigError) as caught:
        parse(f"jobs:\n  {job}:\n    {settings}\n")
    assert caught.value.job_id == job
    assert caught.value.field == field
    assert words in str(caught.value)
    assert f"job '{job}'" in str(caught.value) and f"field '{field}'" in str(caught.value)


def test_duplicate_job_id_is_refused():
    with pytest.raises(JobsConfigError) as caught:
        parse("""
            jobs:
              report:
                kind: python
                target: tests.job_targets:record
              report:
                kind: python
                target: tests.job_targets:echo_value
        """)
    assert caught.value.field == "report"
    assert "declared twice" in str(caught.value)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "single key 'jobs'"),
        ("jobs: {}", "at least one job"),
        ("jobs: [a]", "at least one job"),
        ("jobs:\n  report: 5", "settings must be a mapping"),
        ("jobs:\n  'bad id!':\n    kind: python", "job ids are"),
        ("other: 1", "single key 'jobs'"),
        ("jobs: [unclosed", "not valid YAML"),
    ],
)
def test_bad_file_shapes(text, words):
    with pytest.raises(JobsConfigError) as caught:
        parse_jobs(text)
    assert words in str(caught.value)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(JobsConfigError) as caught:
        load_jobs(str(tmp_path / "absent.yaml"))
    assert "absent.yaml" in str(caught.value)


@pytest.mark.slow
def test_a_bad_jobs_file_stops_the_app_at_start_up(tmp_path):
    bad = tmp_path / "jobs.yaml"
    bad.write_text("jobs:\n  report:\n    kind: python\n    target: tests.job_targets:record\n    lease_seconds: -1\n")
    env = {
        **os.environ,
        "DEDUP_JOBS_FILE": str(bad),
        "DATASTORE_EMULATOR_HOST": "127.0.0.1:9",
        "GOOGLE_CLOUD_PROJECT": "dedup-test",
    }
    completed = subprocess.run(
        [sys.executable, "-c", "import main"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode != 0
    assert "job 'report': field 'lease_seconds': must be a positive number" in completed.stderr


def test_defaults_follow_short_and_long_leases():
    jobs = parse("""
        jobs:
          quick:
            kind: http
            url: https://hooks.acme-corp.internal/hook
            lease_seconds: 20
          week-long:
            kind: python
            target: tests.job_targets:record
            lease_seconds: 691200
    """)
    assert jobs["quick"].runner.timeout_seconds == 10
    assert jobs["week-long"].policy.retention_seconds == 691200 + 86400


def test_each_kind_says_what_a_run_calls_downstream():
    """The dashboard's confirmation names it; an http job's query and credentials stay off the page."""
    from tests.test_google_kinds import RUN_JOB, TRIGGER, WORKFLOW, jobs_yaml

    extra = {
        "hook": {"kind": "http", "url": "https://ops:s3cret@hooks.acme-ops.com:8443/nightly?token=abc"},
        "plain": {"kind": "http", "url": "https://hooks.acme-ops.com", "method": "PUT"},
        "digest": {"kind": "python", "target": "tests.job_targets:record"},
    }
    document = yaml.safe_load(textwrap.dedent(jobs_yaml("http://127.0.0.1:9")))
    document["jobs"].update(extra)
    jobs = parse_jobs(yaml.safe_dump(document))
    calls = {job_id: job.runner.calls() for job_id, job in jobs.items()}
    assert calls == {
        "etl": f"a new execution of the workflow {WORKFLOW}",
        "reindex": f"an execution of the Cloud Run job {RUN_JOB}",
        "release": f"a build of the Cloud Build trigger {TRIGGER}",
        "hook": "POST https://hooks.acme-ops.com:8443/nightly (with its query)",
        "plain": "PUT https://hooks.acme-ops.com/",
        "digest": "the Python function tests.job_targets:record",
    }
    assert "s3cret" not in calls["hook"] and "abc" not in calls["hook"]
