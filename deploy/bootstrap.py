"""``python -m deploy bootstrap``: what a fresh project needs before the first deploy.

The APIs, the App Engine app, a Datastore-mode database for the ledger (``(default)``, or the
one DEDUP_DATABASE names, so a project whose default database is in Firestore native mode can
host it), a ``default`` service (App Engine deploys no other service before one exists) and the
app's own service account.  What exists already is asked of gcloud and left alone, so the plan
is safe on a project that runs another app: nothing of it is replaced.  The database's
concurrency mode is reported, with a warning for OPTIMISTIC_WITH_ENTITY_GROUPS.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

from dedup import database as ledger_database
from deploy.scheduler_config import app_service, shell_line

# The APIs a first deploy and the ops commands use: App Engine and the Cloud Build its
# deploys run on; Datastore for the ledger and Firestore's API, which creates the database
# and its TTL policy (`deploy ttl`); Cloud Scheduler; Cloud Tasks for dispatched work
# (catch-up); IAP for people (`deploy iap`); Logging and Monitoring for the missed-execution
# alert (`deploy alerts`).  Job kinds that start Google executions need their own (docs/jobs.md).
APIS = (
    "appengine.googleapis.com",
    "cloudbuild.googleapis.com",
    "datastore.googleapis.com",
    "firestore.googleapis.com",
    "cloudscheduler.googleapis.com",
    "cloudtasks.googleapis.com",
    "iap.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
)
SERVICE_ACCOUNT_NAME = "dedup-app"
# The app's account needs the ledger, to enqueue its dispatched work, to pause and resume its
# Scheduler jobs, and to write its metrics (docs/deploying.md, "Least privilege").
SERVICE_ACCOUNT_ROLES = (
    "roles/datastore.user",
    "roles/cloudtasks.enqueuer",
    "roles/cloudscheduler.admin",
    "roles/monitoring.metricWriter",
)
DEFAULT_SERVICE_YAML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_service", "app.yaml")
# Two App Engine regions are named without their Cloud region's digit.
_APP_ENGINE_REGIONS = {"us-central1": "us-central", "europe-west1": "europe-west"}
# What gcloud says when the thing asked about is not there (or its API is not enabled yet,
# as on a fresh project): anything else is an error to show, not an absence.
_ABSENT = ("not found", "not_found", "does not exist", "has not been used", "service_disabled", "is disabled")


DEFAULT_DATABASE = ledger_database.DEFAULT
DATABASE_SETTING = ledger_database.SETTING
DATASTORE_MODE = "DATASTORE_MODE"
# Not recommended by Google: set on some databases upgraded from Cloud Datastore.  Conflicts are an
# entity group's, not an entity's, which the ledger was neither built nor checked for.
ENTITY_GROUPS_MODE = "OPTIMISTIC_WITH_ENTITY_GROUPS"


class BootstrapError(Exception):
    """The project cannot be set up as asked; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class ProjectState:
    """What the project has already.  A new project: ProjectState()."""

    app_region: str | None = None  # the App Engine app's locationId (us-central, europe-west2)
    database_type: str | None = None  # the ledger's database's type: DATASTORE_MODE, FIRESTORE_NATIVE
    # Its concurrency mode: PESSIMISTIC, OPTIMISTIC, OPTIMISTIC_WITH_ENTITY_GROUPS (None: not told).
    concurrency_mode: str | None = None
    services: frozenset[str] = frozenset()
    service_account: bool = False


def database_name(value: str | None) -> str:
    """The ledger's database from DEDUP_DATABASE or --database, by the app's own rule (dedup/database.py)."""
    try:
        return ledger_database.database_name(value)
    except ledger_database.DatabaseNameError as exc:
        raise BootstrapError(str(exc)) from None


def app_engine_region(region: str) -> str:
    """App Engine's name for a Cloud region: ``us-central1`` is ``us-central``."""
    return _APP_ENGINE_REGIONS.get(region, region)


def service_account_email(project: str) -> str:
    return f"{SERVICE_ACCOUNT_NAME}@{project}.iam.gserviceaccount.com"


def _ask(command: list[str]) -> str | None:
    """gcloud's output, or None when what it was asked about does not exist."""
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode == 0:
        return completed.stdout.strip()
    if any(word in completed.stderr.lower() for word in _ABSENT):
        return None
    raise BootstrapError(f"{shell_line(command)} failed: {completed.stderr.strip()}")


def probe(project: str, database: str = DEFAULT_DATABASE) -> ProjectState:
    """Ask gcloud what the project has: its app, the ledger's database (its type and concurrency
    mode: the Firestore Admin API's databases.get), its services, the account."""
    if shutil.which("gcloud") is None:
        raise BootstrapError("gcloud is not on PATH; install the Google Cloud CLI, or pass --assume-new")
    scope = f"--project={project}"
    region = _ask(["gcloud", "app", "describe", scope, "--format=value(locationId)"])
    described = _ask(
        [
            *("gcloud", "firestore", "databases", "describe", f"--database={database}", scope),
            "--format=value(type,concurrencyMode)",
        ]
    )
    fields = (described or "").split()
    database_type = fields[0] if fields else None
    concurrency_mode = fields[1] if len(fields) > 1 else None
    services = (_ask(["gcloud", "app", "services", "list", scope, "--format=value(id)"]) if region else None) or ""
    email = service_account_email(project)
    account = _ask(["gcloud", "iam", "service-accounts", "describe", email, scope, "--format=value(email)"])
    return ProjectState(
        app_region=region or None,
        database_type=database_type,
        concurrency_mode=concurrency_mode,
        services=frozenset(services.split()),
        service_account=account is not None,
    )


def plan(
    project: str, region: str, database_location: str, state: ProjectState, database: str = DEFAULT_DATABASE
) -> list[list[str]]:
    """The gcloud commands that give the project what it lacks, in the order they must run."""
    scope = f"--project={project}"
    wanted_region = app_engine_region(region)
    if state.app_region and state.app_region != wanted_region:
        raise BootstrapError(
            f"the project's App Engine app is in {state.app_region}, not {wanted_region}, and an app's region "
            "cannot change; App Engine-target Scheduler jobs live in the app's region: pass that region "
            "(and set scheduler.yaml's location to it)"
        )
    if state.database_type and state.database_type != DATASTORE_MODE:
        instead = (
            f"name another database for the ledger ({DATABASE_SETTING} or --database), which is created in "
            "Datastore mode beside it"
            if database == DEFAULT_DATABASE
            else "name another one (a new name is created in Datastore mode)"
        )
        raise BootstrapError(
            f"the project's {database} database is {state.database_type}, and the app's ledger (NDB) needs "
            f"Firestore in Datastore mode; a database's mode cannot change once it holds data: {instead}"
        )
    commands = [["gcloud", "services", "enable", *APIS, scope]]
    if not state.app_region:
        commands.append(["gcloud", "app", "create", f"--region={wanted_region}", scope])
    if not state.database_type:
        commands.append(
            [
                "gcloud",
                "firestore",
                "databases",
                "create",
                f"--database={database}",
                f"--location={database_location}",
                "--type=datastore-mode",
                scope,
            ]
        )
    # Expired records deleted by Firestore's TTL policy by default: /tasks/cleanup is the fallback,
    # for a fleet of at most what one hourly call deletes (docs/retention-and-cost.md).
    commands.append(ttl_command(project, None if database == DEFAULT_DATABASE else database))
    email = service_account_email(project)
    if not state.service_account:
        commands.append(
            [
                "gcloud",
                "iam",
                "service-accounts",
                "create",
                SERVICE_ACCOUNT_NAME,
                "--display-name=Exactly-once target for Cloud Scheduler jobs",
                scope,
            ]
        )
    commands += [
        [
            "gcloud",
            "projects",
            "add-iam-policy-binding",
            project,
            f"--member=serviceAccount:{email}",
            f"--role={role}",
            "--condition=None",
        ]
        for role in SERVICE_ACCOUNT_ROLES
    ]
    if "default" not in state.services and app_service() != "default":
        commands.append(["gcloud", "app", "deploy", os.path.relpath(DEFAULT_SERVICE_YAML), scope, "--quiet"])
    return commands


def database_notes(database: str, state: ProjectState) -> list[str]:
    """What the plan says of an existing database: its concurrency mode, and a warning where it is
    OPTIMISTIC_WITH_ENTITY_GROUPS."""
    if state.database_type is None:
        return []
    mode = state.concurrency_mode or "not reported"
    notes = [f"note: the {database} database is {state.database_type}, concurrency mode {mode}"]
    if mode == ENTITY_GROUPS_MODE:
        notes.append(
            f"warning: {ENTITY_GROUPS_MODE} is the mode of some databases upgraded from Cloud Datastore, which "
            "Google does not recommend: conflicts are detected per entity group, not per entity, which the "
            "ledger's transactions and version-fenced writes were neither built nor checked for. Change the "
            "database's concurrencyMode (Firestore Admin API, databases.patch) if nothing else relies on it, "
            f"or give the ledger a database of its own ({DATABASE_SETTING})"
        )
    return notes


def ttl_command(project: str | None, database: str | None) -> list[str]:
    """Firestore's TTL policy on the run records' ``expire_at`` (enabling it again changes nothing)."""
    from models import RunRecord

    command = [
        "gcloud",
        "firestore",
        "fields",
        "ttls",
        "update",
        "expire_at",
        f"--collection-group={RunRecord._get_kind()}",
        "--enable-ttl",
    ]
    if project:
        command.append(f"--project={project}")
    if database:
        command.append(f"--database={database}")
    return command


def next_steps(project: str, region: str, database: str = DEFAULT_DATABASE) -> list[str]:
    """What follows the bootstrap: fill in, validate, deploy, schedule, and check one delivery.

    Printed as comments, so the plan's output run as a script sets the project up and
    deploys nothing.  A named database's indexes are created apart: ``gcloud app deploy
    index.yaml`` makes them in ``(default)``.
    """
    scope = f"--project={project}"
    account = f"--service-account={service_account_email(project)}"
    if database == DEFAULT_DATABASE:
        deploy = [shell_line(["gcloud", "app", "deploy", "app.yaml", "index.yaml", scope, account])]
    else:
        deploy = [
            f"# The ledger is in {database}: set {DATABASE_SETTING}: {database} in app.yaml's env_variables.",
            shell_line(["gcloud", "datastore", "indexes", "create", "index.yaml", f"--database={database}", scope]),
            shell_line(["gcloud", "app", "deploy", "app.yaml", scope, account]),
        ]
    steps = [
        "# Then fill in jobs.yaml and scheduler.yaml (validate says what is left), and deploy:",
        "python -m deploy scheduler validate",
        *deploy,
        "# cron.yaml replaces the app's whole cron list: deploy it as it is only where the app has no",
        "# cron entries of its own; else merge them first (docs/deploying.md, Beside an existing app).",
        shell_line(["gcloud", "app", "deploy", "cron.yaml", f"--project={project}"]),
        "# queue.yaml likewise replaces the app's whole queue list (its dedup-dispatch queue: catch-up).",
        shell_line(["gcloud", "app", "deploy", "queue.yaml", f"--project={project}"]),
        "python -m deploy scheduler apply",
        "# Last, one forced Scheduler delivery, and what the app saw of it (docs/deploying.md, The smoke):",
        shell_line(["python", "-m", "deploy", "smoke", f"--project={project}", f"--location={region}"]),
    ]
    return [step if step.startswith("#") else f"#   {step}" for step in steps]
