"""``python -m deploy bootstrap|firewall|ttl|iap|alerts|dashboard``: print the gcloud commands; run them with --apply.
``python -m deploy scheduler plan|apply``: make the Scheduler jobs match scheduler.yaml through Cloud Scheduler's API.
``python -m deploy smoke``: force one Scheduler delivery and check what the app saw of it.
``python -m deploy check``: the app's settings, checked as an instance checks them at start-up.

A standalone Click group: it reads jobs.yaml itself and never builds the web
app, so it needs no caller verification setting but to check it.  The settings it
takes from the environment (DEDUP_JOBS_FILE, DEDUP_SCALING, DEDUP_DATABASE, ...) it
reads as the app does, once, into the app's ``Settings``.  Plans that ask gcloud what
exists (bootstrap, firewall) need gcloud's credentials for the project, unless
--assume-new; the others need none until --apply.  ``scheduler plan`` and ``apply``
and the smoke call Cloud Scheduler's API (and the smoke Cloud Logging's) with
Application Default Credentials, at DEDUP_SCHEDULER_API_BASE (an ``http://`` one
without credentials: a local stand-in); ``scheduler plan --assume-new`` calls nothing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any, TypeVar

import click
import google.auth.exceptions
from google.cloud import scheduler_v1

from dedup.keys import PROJECT_ID, SCHEDULER_JOB_ID
from deploy import bootstrap as project_setup
from deploy import monitoring, scheduler_jobs
from deploy import smoke as delivery_smoke
from deploy.scheduler_config import app_service, shell_line
from jobs.base import http_url
from jobs.config import JobSpec, load_jobs
from jobs.errors import JobsConfigError
from jobs.kinds.google_api import DEFAULT_TIMEOUT_SECONDS, GoogleApi
from schedules.config import (
    BREACH_OUTCOMES,
    DEFAULT_FILE,
    SCHEDULER_LOCATION,
    ScheduleFileError,
    SchedulerJob,
    dedup_problems,
    load_scheduler_file,
    placeholder_project_problem,
)
from settings import SettingError, Settings

SCHEDULER_IPS = (
    ("0.1.0.2/32", "Cloud Scheduler App Engine jobs, Cloud Tasks and cron"),
    ("0.1.0.1/32", "App Engine cron jobs created with older tools"),
)
ADMIN_RANGE = "admin range"
F = TypeVar("F", bound=Callable[..., Any])
FIRST_PRIORITY = 1000


@click.group(help="Deployment tooling: Cloud Scheduler jobs as code, firewall rules, the TTL policy.")
@click.option(
    "--jobs",
    "jobs_file",
    show_default="DEDUP_JOBS_FILE, else jobs.yaml",
    help="The jobs file scheduler.yaml is checked against.",
)
@click.pass_context
def cli(context: click.Context, jobs_file: str | None) -> None:
    context.obj = {"jobs_file": jobs_file}


def _settings() -> Settings:
    """The environment's settings, read once per command by the app's own reading (settings.py);
    only when a command needs one, so a command that needs none never fails on another's."""
    options = click.get_current_context().find_object(dict)
    assert options is not None, "cli() sets it for every command"
    if "settings" not in options:
        try:
            options["settings"] = Settings.from_environ(os.environ)
        except SettingError as exc:
            raise click.ClickException(str(exc)) from None
    settings: Settings = options["settings"]
    return settings


def _jobs_file() -> str:
    options = click.get_current_context().find_object(dict)
    assert options is not None, "cli() sets it for every command"
    return options["jobs_file"] or _settings().jobs_file


def _declared_jobs() -> dict[str, JobSpec]:
    """jobs.yaml, parsed and validated as the app does at start-up."""
    try:
        return load_jobs(_jobs_file(), _settings().request_timeout)
    except JobsConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _print_and_maybe_run(commands: list[list[str]], apply: bool) -> None:
    for command in commands:
        click.echo(shell_line(command))
    if not apply:
        return
    for command in commands:
        click.echo(f"running: {shell_line(command)}", err=True)
        completed = subprocess.run(command, check=False)
        if completed.returncode != 0:
            raise click.ClickException(f"{shell_line(command)} failed with exit code {completed.returncode}")


@cli.group(help="Cloud Scheduler jobs declared in scheduler.yaml.")
def scheduler() -> None:
    pass


def _validated(file: str) -> list[SchedulerJob]:
    try:
        jobs = load_scheduler_file(file)
    except ScheduleFileError as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        raise click.exceptions.Exit(1) from None
    problems = dedup_problems(jobs, _declared_jobs())
    for problem in problems:
        click.echo(str(problem), err=True)
    if problems:
        raise click.exceptions.Exit(1)
    return jobs


@scheduler.command(help="Check scheduler.yaml against jobs.yaml; exit 1 with every problem found.")
@click.argument("file", default=DEFAULT_FILE)
def validate(file: str) -> None:
    jobs = _validated(file)
    click.echo(f"{file}: {len(jobs)} job(s) valid")


@cli.command(
    help="Check the app's settings in this environment as an instance does at start-up; exit 1 naming a bad one."
)
def check() -> None:
    """The app's own checks, not a copy: ``Settings.from_environ``, caller verification's
    (``AuthSettings.from_settings``) and the jobs file's, as ``create_app`` runs them before it
    serves.  scheduler.yaml has its own command (``scheduler validate``)."""
    from handlers.auth import AuthSettings  # the rules of DEDUP_AUTH's modes are caller verification's

    try:
        auth = AuthSettings.from_settings(_settings())
    except SettingError as exc:
        raise click.ClickException(str(exc)) from None
    jobs = _declared_jobs()
    click.echo(f"settings valid: DEDUP_AUTH={auth.mode}, {len(jobs)} job(s) in {_jobs_file()}")


def _setting_option(flag: str, field: str, help: str, unset: str | None = None) -> Callable[[F], F]:
    """An option whose default is the app's setting of the same thing: ``Settings``' ``field``
    (``unset``: what None there means)."""
    return click.option(
        flag,
        default=lambda: getattr(_settings(), field) or unset,
        show_default=f"{Settings.variable(field)}, else {getattr(Settings(), field) or unset}",
        help=help,
    )


def _steps(
    file: str, base: str, assume_new: bool
) -> tuple[list[scheduler_jobs.Step], scheduler_v1.CloudSchedulerClient | None]:
    """The plan's steps, its warnings and notes said on stderr, and the client that read the live
    jobs (None with --assume-new: none read, every job created)."""
    jobs = _validated(file)
    declared = _declared_jobs()
    externals = {job.target: declared[job.target].runner.external for job in jobs}  # validated: declared
    client = None if assume_new else _scheduler_client(base)
    try:
        live = None if client is None else scheduler_jobs.live_jobs(client, jobs)
    except scheduler_jobs.SchedulerApiError as exc:
        raise click.ClickException(str(exc)) from None
    steps = scheduler_jobs.plan_steps(jobs, externals, live)
    for step in steps:
        for line in scheduler_jobs.notes(step):
            click.echo(line, err=True)
    return steps, client


def _scheduler_client(base: str) -> scheduler_v1.CloudSchedulerClient:
    try:
        return scheduler_jobs.scheduler_client(_base_url("--scheduler-api-base", base))
    except google.auth.exceptions.DefaultCredentialsError:
        raise click.ClickException(
            "no Application Default Credentials for the Cloud Scheduler API: run "
            "`gcloud auth application-default login`, or pass --assume-new"
        ) from None


def _print_plan(steps: list[scheduler_jobs.Step]) -> None:
    for step in steps:
        for line in scheduler_jobs.plan_lines(step):
            click.echo(line)


_API_BASE_HELP = "Cloud Scheduler API base URL (an http:// one is called without credentials)."


@scheduler.command(help="Print what apply does to each declared job; --gcloud: the gcloud commands that do the same.")
@click.argument("file", default=DEFAULT_FILE)
@click.option("--assume-new", is_flag=True, help="Do not ask Cloud Scheduler which jobs exist; plan creates.")
@click.option("--gcloud", "as_gcloud", is_flag=True, help="Print the equivalent gcloud commands instead.")
@_setting_option("--scheduler-api-base", "scheduler_api_base", _API_BASE_HELP)
def plan(file: str, assume_new: bool, as_gcloud: bool, scheduler_api_base: str) -> None:
    steps, _ = _steps(file, scheduler_api_base, assume_new)
    if not as_gcloud:
        _print_plan(steps)
        return
    for step in steps:
        commands, warnings = scheduler_jobs.step_commands(step)
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        for command in commands:
            click.echo(shell_line(command))


@scheduler.command(help="Create, update or make again the declared jobs through the Cloud Scheduler API.")
@click.argument("file", default=DEFAULT_FILE)
@click.option(
    "--assume-new",
    is_flag=True,
    help="Do not ask Cloud Scheduler which jobs exist; create them (one that exists fails).",
)
@_setting_option("--scheduler-api-base", "scheduler_api_base", _API_BASE_HELP)
def apply(file: str, assume_new: bool, scheduler_api_base: str) -> None:
    """Prints the plan, then makes its calls, each said on stderr once answered; the first the API
    refuses stops it, naming what was done and what was not (exit 1)."""
    steps, client = _steps(file, scheduler_api_base, assume_new)
    _print_plan(steps)
    client = client or _scheduler_client(scheduler_api_base)
    try:
        scheduler_jobs.apply_steps(client, steps, say=lambda line: click.echo(line, err=True))
    except scheduler_jobs.SchedulerApiError as exc:
        raise click.ClickException(str(exc)) from None
    actions = [step.action for step in steps]
    click.echo(
        f"applied: {actions.count('create')} created, {actions.count('update')} updated, "
        f"{actions.count('recreate')} made again, {actions.count('unchanged')} unchanged"
    )


@cli.command(help="A project's one-time set-up: APIs, the App Engine app, the database, the app's service account.")
@click.option("--project", required=True, help="Google Cloud project (scheduler.yaml's project).")
@click.option(
    "--region", required=True, help="Cloud region of the app and its Scheduler jobs, e.g. us-central1 (their location)."
)
@_setting_option(
    "--database",
    "database",
    "The Datastore-mode database of the ledger (the app's DEDUP_DATABASE).",
    unset=project_setup.DEFAULT_DATABASE,
)
@click.option("--database-location", help="Location of the Datastore-mode database (default: the region).")
@click.option("--apply", "apply_", is_flag=True, help="Run the commands instead of printing them only.")
@click.option("--assume-new", is_flag=True, help="Do not ask gcloud what the project has; plan everything.")
def bootstrap(
    project: str, region: str, database: str, database_location: str | None, apply_: bool, assume_new: bool
) -> None:
    """Plans only what the project lacks (asked of gcloud), so it is safe beside an existing app
    and can be run again; the deploy itself follows, printed as the next steps."""
    _check_project_and_region(project, region, "--region")
    try:
        database = project_setup.database_name(database)
    except project_setup.BootstrapError as exc:
        raise click.BadParameter(str(exc), param_hint="--database") from None
    try:
        state = project_setup.ProjectState() if assume_new else project_setup.probe(project, database)
        commands = project_setup.plan(project, region, database_location or region, state, database)
    except project_setup.BootstrapError as exc:
        raise click.ClickException(str(exc)) from None
    for note in project_setup.database_notes(database, state):
        click.echo(note, err=True)
    _print_and_maybe_run(commands, apply_)
    for line in project_setup.next_steps(project, region, database):
        click.echo(line)


def _check_project_and_region(project: str, region: str, region_flag: str) -> None:
    problem = placeholder_project_problem(project) or (
        None if PROJECT_ID.fullmatch(project) else f"{project!r} is not a project id"
    )
    if problem:
        raise click.BadParameter(problem, param_hint="--project")
    if not SCHEDULER_LOCATION.fullmatch(region):
        raise click.BadParameter(f"{region!r} is not a Cloud region such as us-central1", param_hint=region_flag)


def _base_url(flag: str, base: str) -> str:
    """An API's base URL given on the command line, checked as the settings check theirs."""
    try:
        return http_url("command line", flag, base, query=False)
    except JobsConfigError as exc:
        raise click.BadParameter(exc.reason, param_hint=flag) from None


def _api(flag: str, base: str) -> GoogleApi:
    return GoogleApi(_base_url(flag, base), DEFAULT_TIMEOUT_SECONDS)


@cli.command(help="Force one Cloud Scheduler delivery to the deployed app; print and check what the app saw.")
@click.option("--project", required=True, help="Google Cloud project of the app and its Scheduler jobs.")
@click.option("--location", required=True, help="Cloud Scheduler location: the app's region, e.g. us-central1.")
@click.option("--job", "job_id", help="Run this App Engine-target Scheduler job (default: a throwaway one).")
@click.option(
    "--target",
    default=delivery_smoke.DEFAULT_TARGET,
    show_default=True,
    help="The jobs.yaml job the throwaway Scheduler job calls.",
)
@click.option("--service", help="App Engine service the throwaway job calls (default: app.yaml's).")
@click.option("--timeout", type=click.FloatRange(min=0), default=300, show_default=True, help="Seconds to wait.")
@click.option(
    "--poll", type=click.FloatRange(min=0.01), default=5, show_default=True, help="Seconds between log reads."
)
@_setting_option("--scheduler-api-base", "scheduler_api_base", "Cloud Scheduler API base URL.")
@click.option(
    "--logging-api-base",
    envvar=delivery_smoke.LOGGING_BASE_SETTING,  # the smoke's own: the app calls no Cloud Logging
    default=delivery_smoke.LOGGING_API_BASE,
    show_default=True,
    show_envvar=True,
    help="Cloud Logging API base URL.",
)
def smoke(
    project: str,
    location: str,
    job_id: str | None,
    target: str,
    service: str | None,
    timeout: float,
    poll: float,
    scheduler_api_base: str,
    logging_api_base: str,
) -> None:
    """Runs a Scheduler job now (jobs.run): the one --job names, or a throwaway job calling --target,
    created and deleted (even on failure).  Then reads the app's line of that delivery in Cloud
    Logging and prints what the app saw: the principal, the headers the run is keyed on, the answer.
    Exits 1 when the delivery was refused (401, 403), keyed wrongly, failed, or never came."""
    _check_project_and_region(project, location, "--location")
    if job_id is not None and not SCHEDULER_JOB_ID.fullmatch(job_id):
        raise click.BadParameter(f"{job_id!r} is not a Cloud Scheduler job id", param_hint="--job")
    runner = delivery_smoke.Smoke(
        _api("--scheduler-api-base", scheduler_api_base),
        _api("--logging-api-base", logging_api_base),
        project,
        location,
        say=click.echo,
        warn=lambda line: click.echo(line, err=True),
    )
    try:
        if job_id is not None:
            runner.named(job_id, timeout, poll)
            return
        declared = _declared_jobs()
        if target not in declared:
            raise click.BadParameter(
                f"no job {target!r} in the jobs file (it has {', '.join(sorted(declared))})", param_hint="--target"
            )
        runner.throwaway(target, declared[target].policy.lease_seconds, service or app_service(), timeout, poll)
    except delivery_smoke.SmokeFailure as exc:
        raise click.ClickException(f"smoke failed: {exc}") from None


@cli.command(help="App Engine firewall: deny by default, allow Scheduler/cron/Tasks and admin ranges.")
@click.option("--project", help="Google Cloud project (default: gcloud's).")
@click.option("--admin-range", "admin_ranges", multiple=True, help="A CIDR range to allow (repeatable).")
@click.option("--apply", "apply_", is_flag=True, help="Run the commands instead of printing them only.")
@click.option("--assume-new", is_flag=True, help="Do not ask gcloud which rules exist; create them.")
def firewall(project: str | None, admin_ranges: tuple[str, ...], apply_: bool, assume_new: bool) -> None:
    """Allow rules first and the default deny last, so a failure part-way never locks anyone out;
    rules that exist are updated, so the command can be run again.  Admin-range rules an
    earlier run made that are no longer asked for are deleted; another rule in the way is
    replaced, with a warning."""
    scope = [f"--project={project}"] if project else []
    rules = list(SCHEDULER_IPS)
    for cidr in admin_ranges:
        try:
            rules.append((str(ipaddress.ip_network(cidr, strict=False)), ADMIN_RANGE))
        except ValueError:
            raise click.BadParameter(f"{cidr!r} is not a CIDR range", param_hint="--admin-range") from None
    existing = {} if assume_new else _existing_firewall_rules(scope)
    ours = {description for _, description in (*SCHEDULER_IPS, (None, ADMIN_RANGE))}
    commands = []
    for priority, (source, description) in enumerate(rules, start=FIRST_PRIORITY):
        found = existing.get(priority)
        if found and found[2] not in ours:
            click.echo(
                f"warning: priority {priority} holds another rule ({found[0]} {found[1]}, "
                f"{found[2]!r}); it is replaced",
                err=True,
            )
        commands.append(
            [
                "gcloud",
                "app",
                "firewall-rules",
                "update" if found else "create",
                str(priority),
                "--action=allow",
                f"--source-range={source}",
                f"--description={description}",
                *scope,
            ]
        )
    for priority, (_, _, description) in sorted(existing.items()):
        if priority >= FIRST_PRIORITY + len(rules) and description == ADMIN_RANGE:
            commands.append(["gcloud", "app", "firewall-rules", "delete", str(priority), "--quiet", *scope])
    commands.append(["gcloud", "app", "firewall-rules", "update", "default", "--action=deny", *scope])
    _print_and_maybe_run(commands, apply_)


def _existing_firewall_rules(scope: list[str]) -> dict[int, tuple[str, str, str]]:
    """priority -> (action, source range, description) of the rules that exist (not the default)."""
    if shutil.which("gcloud") is None:
        raise click.ClickException("gcloud is not on PATH; install the Google Cloud CLI, or pass --assume-new")
    command = [
        "gcloud",
        "app",
        "firewall-rules",
        "list",
        "--format=value(priority,action,sourceRange,description)",
        *scope,
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise click.ClickException(f"{shell_line(command)} failed: {completed.stderr.strip()}")
    rules = {}
    for line in completed.stdout.splitlines():
        priority, action, source, description = (line.split("\t") + ["", "", "", ""])[:4]
        if priority.strip().isdigit():
            rules[int(priority)] = (action.strip(), source.strip(), description.strip())
    return rules


@cli.command(help="Enable the Firestore TTL policy on expire_at for the dedup records.")
@click.option("--project", help="Google Cloud project (default: gcloud's).")
@click.option("--database", help="Firestore database (default: '(default)').")
@click.option("--apply", "apply_", is_flag=True, help="Run the command instead of printing it only.")
def ttl(project: str | None, database: str | None, apply_: bool) -> None:
    _print_and_maybe_run([project_setup.ttl_command(project, database)], apply_)


IAP_ACCESSOR_ROLE = "roles/iap.httpsResourceAccessor"
# IAM's member syntax, as gcloud takes it.  IAP may let a group through; the app's DEDUP_OPERATORS and
# DEDUP_VIEWERS cannot name groups (it cannot see membership), so they list the members.
IAM_MEMBER = re.compile(r"(?:user|serviceAccount|group):[^\s@,]+@[^\s@,]+\.[^\s@,]+|domain:[^\s@,]+\.[^\s@,]+")


@cli.command(help="Identity-Aware Proxy for the app: enable it and let the given principals through.")
@click.option("--project", required=True, help="Google Cloud project (the app's id).")
@click.option(
    "--member",
    "members",
    multiple=True,
    help="An IAM member IAP lets through: user:EMAIL, serviceAccount:EMAIL, group:EMAIL, domain:DOMAIN (repeatable).",
)
@click.option("--apply", "apply_", is_flag=True, help="Run the commands instead of printing them only.")
def iap(project: str, members: tuple[str, ...], apply_: bool) -> None:
    """IAP lets a principal through; the app's DEDUP_VIEWERS and DEDUP_OPERATORS say what it may do there.

    The audience the app checks (DEDUP_IAP_AUDIENCE) needs the project number,
    which the last command prints.
    """
    bad = [member for member in members if not IAM_MEMBER.fullmatch(member)]
    if bad:
        raise click.BadParameter(
            f"{', '.join(bad)}: write user:EMAIL, serviceAccount:EMAIL, group:EMAIL or domain:DOMAIN",
            param_hint="--member",
        )
    scope = ["--resource-type=app-engine", f"--project={project}"]
    commands = [["gcloud", "iap", "web", "enable", *scope]]
    commands += [
        ["gcloud", "iap", "web", "add-iam-policy-binding", *scope, f"--member={member}", f"--role={IAP_ACCESSOR_ROLE}"]
        for member in members
    ]
    commands.append(["gcloud", "projects", "describe", project, "--format=value(projectNumber)"])
    _print_and_maybe_run(commands, apply_)
    click.echo(f"# then set DEDUP_AUTH=appengine,iap and DEDUP_IAP_AUDIENCE=/projects/PROJECT_NUMBER/apps/{project}")


# The audit's lines for a deadline or failure streak broken (late, overdue, slow, failing): a
# log-match policy fires on each line, which names the Scheduler job and the slot.  Slots missed,
# stuck or failed, and forward progress, are the metrics' policies (deploy/monitoring.py).
BREACHES = " OR ".join(f'jsonPayload.outcome="{outcome}"' for outcome in BREACH_OUTCOMES)
BREACH_FILTER = f'resource.type="gae_app" AND jsonPayload.logger="dedup.audit" AND ({BREACHES})'
# A log-match policy notifies at most once a period (Cloud Monitoring requires a limit); its
# incident closes itself after a week.
BREACH_NOTIFICATION_PERIOD = "300s"
SLOT_POLICY_FILE = "dedup-slot-alert-policy.json"
BREACH_POLICY_FILE = "dedup-breach-alert-policy.json"


def breach_policy(project: str, channels: tuple[str, ...]) -> dict:
    """A log-match policy on the audit's breach lines, labelled with the slot they name."""
    return {
        "displayName": "Dedup: a slot broke its deadline, or a job failed in a row",
        "combiner": "OR",
        "conditions": [
            {
                "displayName": "The audit's late, overdue, slow and failing lines",
                "conditionMatchedLog": {
                    "filter": BREACH_FILTER,
                    "labelExtractors": {
                        "scheduler_job": "EXTRACT(jsonPayload.scheduler_job)",
                        "schedule_time": "EXTRACT(jsonPayload.schedule_time)",
                        "outcome": "EXTRACT(jsonPayload.outcome)",
                    },
                },
            }
        ],
        "documentation": {
            "subject": "Dedup: ${log.extracted_label.outcome} (${log.extracted_label.scheduler_job})",
            "content": "Scheduler job ${log.extracted_label.scheduler_job}: the audit judged the slot "
            "${log.extracted_label.schedule_time} ${log.extracted_label.outcome}.",
            "mimeType": "text/markdown",
        },
        "alertStrategy": {"notificationRateLimit": {"period": BREACH_NOTIFICATION_PERIOD}, "autoClose": "604800s"},
        "userLabels": {"app": "dedup"},
        "notificationChannels": monitoring.channel_names(project, channels),
    }


def _scheduler_jobs(file: str) -> list[SchedulerJob]:
    """scheduler.yaml's jobs as its own checks read them (jobs.yaml is not needed: only names,
    targets, schedules and deadlines are)."""
    try:
        return load_scheduler_file(file)
    except ScheduleFileError as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        raise click.exceptions.Exit(1) from None


def _print_files(files: dict[str, dict], apply_: bool) -> None:
    """Each file as a heredoc to write by hand; written with --apply."""
    for name, document in files.items():
        text = json.dumps(document, indent=2, ensure_ascii=False)
        click.echo(f"cat > {name} <<'EOF'\n{text}\nEOF")
        if apply_:
            with open(name, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")


@cli.command(help="Cloud Monitoring dashboards of scheduler.yaml's jobs: a fleet summary, then a row per job.")
@click.argument("file", default=DEFAULT_FILE)
@click.option("--project", required=True, help="Google Cloud project.")
@click.option("--apply", "apply_", is_flag=True, help="Write the dashboard files and run the commands.")
def dashboard(file: str, project: str, apply_: bool) -> None:
    """Prints each dashboard's JSON (as a file to write) and its gcloud command; --apply writes and runs them."""
    boards = monitoring.dashboards(_scheduler_jobs(file))
    files = dict(zip(monitoring.file_names("dedup-dashboard", len(boards)), boards, strict=True))
    _print_files(files, apply_)
    commands = [
        ["gcloud", "monitoring", "dashboards", "create", f"--config-from-file={name}", f"--project={project}"]
        for name in files
    ]
    _print_and_maybe_run(commands, apply_)


@cli.command(help="Alert policies on slots missed, stuck or failed, forward progress, and the audit's breaches.")
@click.argument("file", default=DEFAULT_FILE)
@click.option("--project", required=True, help="Google Cloud project.")
@click.option("--notification-channel", "channels", multiple=True, help="A Monitoring channel id (repeatable).")
@click.option(
    "--periods",
    type=click.IntRange(1, 100),
    default=monitoring.FORWARD_PROGRESS_PERIODS,
    show_default=True,
    help="Forward progress of a job without finish_within: this many periods with no slot run.",
)
@click.option("--apply", "apply_", is_flag=True, help="Write the policy files and run the commands.")
def alerts(file: str, project: str, channels: tuple[str, ...], periods: int, apply_: bool) -> None:
    """Prints each policy's JSON (as a file to write) and the gcloud commands; --apply writes and runs them."""
    jobs = _scheduler_jobs(file)
    progress = monitoring.progress_policies(project, channels, jobs, periods)
    files = {SLOT_POLICY_FILE: monitoring.slot_policy(project, channels)}
    files |= dict(zip(monitoring.file_names("dedup-progress-alert-policy", len(progress)), progress, strict=True))
    files[BREACH_POLICY_FILE] = breach_policy(project, channels)
    _print_files(files, apply_)
    commands = [
        ["gcloud", "alpha", "monitoring", "policies", "create", f"--policy-from-file={name}", f"--project={project}"]
        for name in files
    ]
    _print_and_maybe_run(commands, apply_)
