"""python -m deploy bootstrap: a fresh project's set-up, and nothing replaced on a project that has an app.

A gcloud on PATH plays the project: what it has, as gcloud's describe and list commands
answer (the errors of a fresh project included), and a log of every command run.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap

import pytest
from click.testing import CliRunner

from deploy.cli import cli as ops_cli

FRESH: dict = {}  # no app, no database, no account; the App Engine and Firestore APIs not enabled yet
SA = "dedup-app@acme-prod.iam.gserviceaccount.com"
CREATE = [
    "gcloud services enable appengine.googleapis.com cloudbuild.googleapis.com datastore.googleapis.com "
    "firestore.googleapis.com cloudscheduler.googleapis.com cloudtasks.googleapis.com iap.googleapis.com "
    "logging.googleapis.com monitoring.googleapis.com --project=acme-prod",
    "gcloud app create --region=us-central --project=acme-prod",
    "gcloud firestore databases create '--database=(default)' --location=us-central1 --type=datastore-mode "
    "--project=acme-prod",
    # Expired records go by Firestore's TTL policy by default (issue 26 §4); /tasks/cleanup is the fallback.
    "gcloud firestore fields ttls update expire_at --collection-group=DedupRun --enable-ttl --project=acme-prod",
    "gcloud iam service-accounts create dedup-app '--display-name=Exactly-once target for Cloud Scheduler jobs' "
    "--project=acme-prod",
    *(
        f"gcloud projects add-iam-policy-binding acme-prod --member=serviceAccount:{SA} --role={role} --condition=None"
        for role in ("roles/datastore.user", "roles/cloudtasks.enqueuer", "roles/cloudscheduler.admin")
    ),
    "gcloud app deploy deploy/default_service/app.yaml --project=acme-prod --quiet",
]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """Set what the project has (``project(state)``); returns the commands gcloud was given."""
    log, state_file = tmp_path / "gcloud.log", tmp_path / "state.json"
    script = tmp_path / "bin" / "gcloud"
    script.parent.mkdir()
    script.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable} -IS
        import json, sys
        args = sys.argv[1:]
        with open({str(log)!r}, "a") as handle:
            handle.write("\\x1f".join(args) + "\\n")
        state = json.load(open({str(state_file)!r}))
        def answer(value, missing):
            if state.get("broken"):
                sys.exit("ERROR: (gcloud) You do not currently have an active account selected.")
            if value is None:
                sys.exit(missing)
            print(value)
        if args[:2] == ["app", "describe"]:
            answer(state.get("app"), "ERROR: (gcloud.app.describe) Apps instance [acme-prod] not found")
        elif args[:3] == ["firestore", "databases", "describe"]:
            answer(state.get("database"), "ERROR: (gcloud.firestore.databases.describe) PERMISSION_DENIED: "
                   "Cloud Firestore API has not been used in project acme-prod before or it is disabled.")
        elif args[:3] == ["app", "services", "list"]:
            answer("\\n".join(state.get("services", [])), "")
        elif args[:3] == ["iam", "service-accounts", "describe"]:
            answer(state.get("account"), "ERROR: (gcloud.iam.service-accounts.describe) NOT_FOUND: Unknown account")
    """)
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")

    def have(state: dict):
        state_file.write_text(json.dumps(state))
        return lambda: [line.split("\x1f") for line in log.read_text().splitlines()] if log.exists() else []

    return have


def bootstrap(*args: str):
    return CliRunner().invoke(ops_cli, ["bootstrap", "--project=acme-prod", *args])


def commands(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("gcloud ")]


def test_a_fresh_project_gets_apis_app_database_account_and_a_default_service(project):
    calls = project(FRESH)
    planned = bootstrap("--region=us-central1")
    assert planned.exit_code == 0, planned.output
    assert commands(planned.output)[: len(CREATE)] == CREATE
    # Printing asks gcloud only what exists (read-only), and changes nothing.
    assert [c[:3] for c in calls()] == [
        ["app", "describe", "--project=acme-prod"],
        ["firestore", "databases", "describe"],
        ["iam", "service-accounts", "describe"],
    ]
    # Then what to do next: validate the filled-in files, deploy as the app's account, schedule.
    after = planned.output.split(CREATE[-1], 1)[1]
    assert all(line.startswith("#") for line in after.strip().splitlines())  # run as a script: deploys nothing
    assert "#   python -m deploy scheduler validate" in after
    assert f"#   gcloud app deploy app.yaml index.yaml --project=acme-prod --service-account={SA}" in after
    assert "cron.yaml replaces the app's whole cron list" in after

    applied = bootstrap("--region=us-central1", "--apply")
    assert applied.exit_code == 0, applied.output
    ran = [" ".join(c) for c in calls()[3:] if "describe" not in c[:3]]  # after the same three questions
    assert ran == [c.removeprefix("gcloud ").replace("'", "") for c in CREATE]


def test_a_project_with_an_app_keeps_it_its_default_service_and_its_database(project):
    """Beside an existing app: nothing it has is created again or replaced."""
    calls = project({"app": "us-central", "database": "DATASTORE_MODE", "services": ["default", "api"], "account": SA})
    planned = bootstrap("--region=us-central1", "--apply")
    assert planned.exit_code == 0, planned.output
    assert commands(planned.output) == [CREATE[0], CREATE[3], *CREATE[5:8]]  # APIs, TTL, roles: all idempotent
    assert not [c for c in calls() if c[1] in ("create", "deploy") or c[2:3] == ["create"]]


def test_an_app_without_a_default_service_gets_the_stand_in_only(project):
    project({"app": "us-central", "database": "DATASTORE_MODE", "services": [], "account": SA})
    planned = bootstrap("--region=us-central1")
    assert commands(planned.output) == [CREATE[0], CREATE[3], *CREATE[5:8], CREATE[8]]


@pytest.mark.parametrize(
    "region, app_engine_region", [("europe-west1", "europe-west"), ("europe-west2", "europe-west2")]
)
def test_app_engine_names_two_regions_without_their_digit(project, region, app_engine_region):
    project(FRESH)
    planned = bootstrap(f"--region={region}", "--database-location=eur3")
    assert f"gcloud app create --region={app_engine_region} --project=acme-prod" in planned.output
    assert "--location=eur3 --type=datastore-mode" in planned.output


@pytest.mark.parametrize(
    "state, words",
    [
        ({"app": "europe-west"}, "the project's App Engine app is in europe-west, not us-central"),
        ({"database": "FIRESTORE_NATIVE"}, "(default) database is FIRESTORE_NATIVE"),
        ({"broken": True}, "You do not currently have an active account selected"),
    ],
)
def test_what_cannot_be_set_up_stops_the_plan(project, state, words):
    calls = project(state)
    refused = bootstrap("--region=us-central1", "--apply")
    assert refused.exit_code == 1 and words in refused.output
    assert not commands(refused.output)
    assert all("describe" in c[:3] or "list" in c[:3] for c in calls())  # nothing but questions was run


@pytest.mark.parametrize(
    "args, words",
    [
        (["--project=your-project-id", "--region=us-central1"], "the placeholder scheduler.yaml ships with"),
        (["--project=Acme", "--region=us-central1"], "'Acme' is not a project id"),
        (["--project=acme-prod", "--region=us-central"], "'us-central' is not a Cloud region such as us-central1"),
    ],
)
def test_placeholders_and_malformed_names_are_refused(project, args, words):
    calls = project(FRESH)
    refused = CliRunner().invoke(ops_cli, ["bootstrap", *args])
    assert refused.exit_code == 2 and words in refused.output
    assert calls() == []


def test_assume_new_asks_nothing(project):
    calls = project({"broken": True})
    planned = bootstrap("--region=us-central1", "--assume-new")
    assert planned.exit_code == 0 and commands(planned.output)[: len(CREATE)] == CREATE
    assert calls() == []
