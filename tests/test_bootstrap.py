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
        for role in (
            "roles/datastore.user",
            "roles/cloudtasks.enqueuer",
            "roles/cloudscheduler.admin",
            "roles/monitoring.metricWriter",
        )
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
            # Each database's "TYPE<tab>CONCURRENCY_MODE", as --format=value(type,concurrencyMode) prints it.
            name = next(a.split("=", 1)[1] for a in args if a.startswith("--database="))
            if "databases" in state:
                answer(state["databases"].get(name), "ERROR: (gcloud.firestore.databases.describe) NOT_FOUND: "
                       f"Project 'acme-prod' or database '{{name}}' does not exist.")
            else:
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


def bootstrap(*args: str, env: dict | None = None):
    return CliRunner().invoke(ops_cli, ["bootstrap", "--project=acme-prod", *args], env=env)


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
    assert commands(planned.output) == [CREATE[0], CREATE[3], *CREATE[5:9]]  # APIs, TTL, roles: all idempotent
    assert not [c for c in calls() if c[1] in ("create", "deploy") or c[2:3] == ["create"]]


def test_an_app_without_a_default_service_gets_the_stand_in_only(project):
    project({"app": "us-central", "database": "DATASTORE_MODE", "services": [], "account": SA})
    planned = bootstrap("--region=us-central1")
    assert commands(planned.output) == [CREATE[0], CREATE[3], *CREATE[5:9], CREATE[9]]


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


WITH_APP = {"app": "us-central", "services": ["default"], "account": SA}


@pytest.mark.parametrize("mode", ["PESSIMISTIC", "OPTIMISTIC"])
def test_the_databases_concurrency_mode_is_reported(project, mode):
    calls = project({**WITH_APP, "database": f"DATASTORE_MODE\t{mode}"})
    planned = bootstrap("--region=us-central1")
    assert planned.exit_code == 0, planned.output
    assert f"note: the (default) database is DATASTORE_MODE, concurrency mode {mode}" in planned.output
    assert "warning" not in planned.output
    # Firestore Admin's databases.get, through gcloud: the type and the concurrency mode.
    described = [c for c in calls() if c[:3] == ["firestore", "databases", "describe"]]
    assert described == [
        [
            "firestore",
            "databases",
            "describe",
            "--database=(default)",
            "--project=acme-prod",
            "--format=value(type,concurrencyMode)",
        ]
    ]


def test_optimistic_with_entity_groups_is_warned_of_and_the_plan_goes_on(project):
    project({**WITH_APP, "database": "DATASTORE_MODE\tOPTIMISTIC_WITH_ENTITY_GROUPS"})
    planned = bootstrap("--region=us-central1")
    assert planned.exit_code == 0, planned.output
    assert "concurrency mode OPTIMISTIC_WITH_ENTITY_GROUPS" in planned.output
    assert "warning: OPTIMISTIC_WITH_ENTITY_GROUPS is the mode of some databases upgraded from Cloud Datastore" in (
        planned.output
    )
    assert "databases.patch" in planned.output and "DEDUP_DATABASE" in planned.output
    assert commands(planned.output) == [CREATE[0], CREATE[3], *CREATE[5:9]]


NAMED_TTL = (
    "gcloud firestore fields ttls update expire_at --collection-group=DedupRun --enable-ttl --project=acme-prod "
    "--database=dedup-ledger"
)


@pytest.mark.parametrize("how", ["env", "flag"])
def test_a_named_database_hosts_the_ledger_beside_a_native_default(project, how):
    """DEDUP_DATABASE (or --database): the default database may be Firestore native; the ledger's is made."""
    calls = project({**WITH_APP, "databases": {"(default)": "FIRESTORE_NATIVE\tPESSIMISTIC"}})
    args, env = (["--region=us-central1"], {"DEDUP_DATABASE": "dedup-ledger"})
    if how == "flag":
        args, env = ["--region=us-central1", "--database=dedup-ledger"], None
    planned = bootstrap(*args, env=env)
    assert planned.exit_code == 0, planned.output
    assert commands(planned.output) == [
        CREATE[0],
        "gcloud firestore databases create --database=dedup-ledger --location=us-central1 --type=datastore-mode "
        "--project=acme-prod",
        NAMED_TTL,
        *CREATE[5:9],
    ]
    asked = [c[3] for c in calls() if c[:3] == ["firestore", "databases", "describe"]]
    assert asked == ["--database=dedup-ledger"]  # the default database is not the ledger's business
    # Its indexes go to it (app deploy's index.yaml makes them in (default)), and the app is told its name.
    assert (
        "#   gcloud datastore indexes create index.yaml --database=dedup-ledger --project=acme-prod" in planned.output
    )
    assert f"#   gcloud app deploy app.yaml --project=acme-prod --service-account={SA}" in planned.output
    assert "set DEDUP_DATABASE: dedup-ledger in app.yaml's env_variables" in planned.output


def test_an_existing_named_database_is_kept_and_reported(project):
    project({**WITH_APP, "databases": {"dedup-ledger": "DATASTORE_MODE\tPESSIMISTIC"}})
    planned = bootstrap("--region=us-central1", "--database=dedup-ledger")
    assert planned.exit_code == 0, planned.output
    assert "note: the dedup-ledger database is DATASTORE_MODE, concurrency mode PESSIMISTIC" in planned.output
    assert commands(planned.output) == [CREATE[0], NAMED_TTL, *CREATE[5:9]]


@pytest.mark.parametrize(
    "database, words",
    [
        (
            "(default)",
            "(default) database is FIRESTORE_NATIVE, and the app's ledger (NDB) needs Firestore in "
            "Datastore mode; a database's mode cannot change once it holds data: name another database for the "
            "ledger (DEDUP_DATABASE or --database)",
        ),
        ("dedup-ledger", "the project's dedup-ledger database is FIRESTORE_NATIVE"),
    ],
)
def test_a_native_mode_database_is_refused_with_what_to_do(project, database, words):
    calls = project({**WITH_APP, "databases": {database: "FIRESTORE_NATIVE\tPESSIMISTIC"}})
    refused = bootstrap("--region=us-central1", f"--database={database}", "--apply")
    assert refused.exit_code == 1 and words in refused.output
    assert not commands(refused.output)
    assert all("describe" in c[:3] or "list" in c[:3] for c in calls())


@pytest.mark.parametrize("database", ["Ledger", "abc", "dedup_ledger", "ledger-"])
def test_a_database_name_firestore_would_refuse_is_refused_first(project, database):
    calls = project(FRESH)
    refused = bootstrap("--region=us-central1", f"--database={database}")
    assert refused.exit_code == 2 and "is not a database id" in refused.output
    assert calls() == []


def test_assume_new_creates_the_named_database(project):
    project({"broken": True})
    planned = bootstrap("--region=us-central1", "--assume-new", env={"DEDUP_DATABASE": "dedup-ledger"})
    assert planned.exit_code == 0, planned.output
    assert "--database=dedup-ledger --location=us-central1 --type=datastore-mode" in planned.output
    assert "note:" not in planned.output  # nothing was asked, so nothing is reported
