"""settings.py: every setting read once, at start-up, into one frozen object, by one reading.

Each field of ``Settings`` has its bad values here (or is listed as taking any value), found by
enumerating the dataclass: a new setting without its refusals fails ``test_every_setting_is_tested``.
A bad value is refused by the one check the app runs at start-up (``Settings.from_environ``, then
caller verification's ``AuthSettings.from_settings``), and by ``python -m deploy check`` with the
same message: one validation, two callers.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re

import pytest
from click.testing import CliRunner

from deploy.cli import cli as ops_cli
from handlers import create_app
from handlers.auth import AuthSettings
from settings import SettingError, Settings

OFF_GAE = {"DEDUP_APPENGINE_OFF_GAE": "trust-forgeable-headers"}
OIDC = {"DEDUP_AUTH": "oidc", "DEDUP_OIDC_AUDIENCE": "https://dedup.example", "DEDUP_OIDC_ALLOWED_EMAILS": "s@x.iam"}
BACKEND = "/projects/1/global/backendServices/2"  # IAP before a load balancer, where markers can be forged
QUEUE = "projects/acme-prod/locations/us-central1/queues/dedup-dispatch"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# field -> environments whose value for it is refused; each message names the field's variable.
BAD = {
    "max_waiters": [{"DEDUP_MAX_WAITERS": v} for v in ("-1", "65", "two", "1.5", "99999999")],
    "finished_cache_entries": [{"DEDUP_FINISHED_CACHE_ENTRIES": v} for v in ("-1", "100001", "many")],
    "finished_cache_bytes": [
        {"DEDUP_FINISHED_CACHE_MIB": "1025"},
        {"DEDUP_FINISHED_CACHE_MIB": "x"},
        {"DEDUP_FINISHED_CACHE_MIB": "200", "GAE_MEMORY_MB": "384"},  # more than a quarter of an F1
    ],
    "database": [{"DEDUP_DATABASE": v} for v in ("Ledger", "a", "-ledger", "ledger-", "led_ger")],
    "tasks_queue": [
        {"DEDUP_TASKS_QUEUE": "projects/acme-prod/queues/q"},
        {"DEDUP_TASKS_QUEUE": "a queue"},
        {"DEDUP_TASKS_QUEUE": "dedup-dispatch", "GAE_ENV": "standard", "GOOGLE_CLOUD_PROJECT": "acme-prod"},
    ],
    "tasks_api_base": [
        {"DEDUP_TASKS_QUEUE": QUEUE, "DEDUP_TASKS_API_BASE": base} for base in ("ftp://x", "http://x/path")
    ],
    "tasks_transport": [
        {"DEDUP_TASKS_QUEUE": QUEUE, "DEDUP_TASKS_TRANSPORT": value} for value in ("http", "grpc+rest", "grpcs")
    ],
    "request_timeout": [{"DEDUP_SCALING": v} for v in ("", "auto", "Basic")],
    "trace_export": [{"DEDUP_TRACE_EXPORT": v} for v in ("zipkin", "yes", "cloud_trace")],
    "metrics_export": [{"DEDUP_METRICS_EXPORT": v} for v in ("prometheus", "yes", "cloud_monitoring")],
    "scheduler_api_base": [
        {"DEDUP_SCHEDULER_API_BASE": base} for base in ("ftp://x", "http://x?q=1", "https://example.com")
    ],
    # Caller verification's: refused where what they mean is checked (the modes DEDUP_AUTH selects).
    "auth": [
        {"DEDUP_AUTH": "sometimes"},
        {"DEDUP_AUTH": ""},  # off App Engine it must be chosen
        {**OIDC, "DEDUP_AUTH": "oidc,oidc"},
        {"DEDUP_AUTH": "none,appengine", **OFF_GAE},
        {"DEDUP_AUTH": "none", "GAE_ENV": "standard"},
    ],
    "operators": [
        {"DEDUP_AUTH": "none", "DEDUP_OPERATORS": member}
        for member in ("group:ops@example.com", "alice", "serviceAccount:alice@example.com", "domain:x")
    ],
    "viewers": [{"DEDUP_AUTH": "none", "DEDUP_VIEWERS": member} for member in ("group:ops@example.com", "user:")],
    "oidc_audience": [{**OIDC, "DEDUP_OIDC_AUDIENCE": value} for value in ("", " ")],
    "oidc_allowed_emails": [{**OIDC, "DEDUP_OIDC_ALLOWED_EMAILS": value} for value in ("", " , ")],
    "iap_audience": [
        {"DEDUP_AUTH": "iap", "DEDUP_IAP_AUDIENCE": value} for value in ("", "123", "/projects/acme/apps/acme")
    ]
    + [{"DEDUP_AUTH": "appengine,iap", "GAE_ENV": "standard", "DEDUP_IAP_AUDIENCE": BACKEND}],
    "appengine_trusted": [
        {"DEDUP_AUTH": "appengine", **OFF_GAE, "DEDUP_APPENGINE_TRUSTED": value} for value in ("cron,everyone", "", ",")
    ],
    # Off App Engine, appengine is refused unless this variable says the one value.
    "appengine_off_app_engine": [{"DEDUP_AUTH": "appengine", "DEDUP_APPENGINE_OFF_GAE": v} for v in ("", "yes", "1")],
    "night": [
        {"DEDUP_NIGHT": v}
        for v in ("22-07", "22:00-22:00", "25:00-07:00", "22:00-24:30", "22:00-07:00 Mars/Olympus", "22:00 - 07:00")
    ],
}
# Fields any value of which is taken: a path (a missing file is the jobs' or schedules' error), a flag,
# a name, a URL fetched at the first request (the signing keys: a 500 until they can be fetched).
ANY_VALUE = {
    "jobs_file",
    "scheduler_file",
    "on_app_engine",
    "service",
    "project",
    "log_format",
    "oidc_certs_url",
    "iap_certs_url",
}


def variable(field: str) -> str:
    return Settings.variable(field)


def check(environ) -> None:
    """What the app checks at start-up (create_app), and ``python -m deploy check`` too."""
    AuthSettings.from_settings(Settings.from_environ(environ))


def test_every_setting_is_tested():
    fields = {field.name for field in dataclasses.fields(Settings)}
    assert fields == set(BAD) | ANY_VALUE, "a new setting needs its bad values in BAD (or a place in ANY_VALUE)"
    assert not set(BAD) & ANY_VALUE
    assert all(field.metadata.get("variable") for field in dataclasses.fields(Settings))


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().max_waiters = 3  # type: ignore[misc]


def test_unset_is_the_defaults():
    assert Settings.from_environ({}) == Settings()


@pytest.mark.parametrize("field, environ", [(field, environ) for field, bad in BAD.items() for environ in bad])
def test_a_bad_value_is_refused_naming_its_variable(field, environ):
    with pytest.raises(SettingError, match=re.escape(variable(field))):
        check(environ)


@pytest.mark.parametrize("field, environ", [(field, environ) for field, bad in BAD.items() for environ in bad])
def test_the_ops_cli_refuses_what_the_app_refuses_with_its_message(monkeypatch, field, environ):
    """``python -m deploy check`` runs the app's own check: the same refusal, the same words."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as refused:
        check(os.environ)
    result = CliRunner().invoke(ops_cli, ["check"])
    assert result.exit_code == 1 and f"Error: {refused.value}" in result.output


def test_the_ops_cli_passes_what_the_app_takes(monkeypatch, jobs_file):
    monkeypatch.setenv("DEDUP_AUTH", "appengine")
    monkeypatch.setenv("DEDUP_APPENGINE_OFF_GAE", "trust-forgeable-headers")
    jobs = jobs_file("jobs:\n  invoice:\n    kind: python\n    target: tests.job_targets:record\n")
    result = CliRunner().invoke(ops_cli, ["--jobs", jobs, "check"])
    assert result.exit_code == 0, result.output
    assert result.output == f"settings valid: DEDUP_AUTH=appengine, 1 job(s) in {jobs}\n"


@pytest.mark.parametrize("field, environ", [(field, bad[0]) for field, bad in BAD.items()])
def test_the_app_refuses_to_start_on_a_bad_value(monkeypatch, field, environ):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingError, match=re.escape(variable(field))):
        create_app()


def test_the_values_are_read():
    environ = {
        "DEDUP_MAX_WAITERS": " 5 ",
        "DEDUP_FINISHED_CACHE_ENTRIES": "0",
        "DEDUP_FINISHED_CACHE_MIB": "96",
        "GAE_MEMORY_MB": "384",
        "DEDUP_DATABASE": "dedup-ledger",
        "DEDUP_JOBS_FILE": "/srv/jobs.yaml",
        "DEDUP_SCHEDULER_FILE": "/srv/scheduler.yaml",
        "GAE_ENV": "standard",
        "GOOGLE_CLOUD_PROJECT": "acme-prod",
        "DEDUP_TASKS_QUEUE": "dedup-dispatch",
        "DEDUP_TASKS_LOCATION": "us-central1",
        "DEDUP_TASKS_API_BASE": "http://127.0.0.1:8123",
        "DEDUP_TASKS_TRANSPORT": "rest",
        "GAE_SERVICE": "dedup",
        "DEDUP_SCALING": "basic",
        "DEDUP_SCHEDULER_API_BASE": "http://127.0.0.1:8124",
    }
    assert Settings.from_environ(environ) == Settings(
        max_waiters=5,
        finished_cache_entries=0,
        finished_cache_bytes=96 * 2**20,
        database="dedup-ledger",
        jobs_file="/srv/jobs.yaml",
        scheduler_file="/srv/scheduler.yaml",
        on_app_engine=True,
        tasks_queue=QUEUE,
        tasks_api_base="http://127.0.0.1:8123",
        tasks_transport="rest",
        service="dedup",
        scheduler_api_base="http://127.0.0.1:8124",
        request_timeout=24 * 3600,
        trace_export="cloud-trace",
        metrics_export="cloud-monitoring",
        project="acme-prod",
        log_format="json",
    )


# No module of the app or its CLIs reads the environment but settings.py: an entry point hands
# ``os.environ`` to ``Settings.from_environ`` and nothing else.  The modules below read it on
# purpose, each for a value that is no setting of the app (so settings.py does not hold it): each
# must still read one (so it leaves this list when it stops), and a new reader fails the scan.
SCANNED = ("handlers", "dispatch", "schedules", "jobs", "dedup", "models", "service", "deploy", "dedupctl", "main.py")
READ_ON_PURPOSE = {
    # GAE_INSTANCE: App Engine's name for this instance, the process's identity in a record's attempt
    # history (else host name and process id); no one configures it.
    "dedup/claims.py",
    # The rule of DEDUP_DATABASE over a mapping, which Settings.from_environ applies (the deploy
    # CLI's --database takes the same rule through it); and the library's default in a handler's
    # own process, which has no Settings of the app's (dedup.deliveries).
    "dedup/database.py",
    # The library's DEDUP_* settings of a handler's own process (DeliverySettings.from_environment),
    # and GAE_ENV, which decides whether App Engine's markers can be trusted there.
    "dedup/environment.py",
    # DEDUP_TOKEN: a client's credential on the caller's machine, never the app's setting.
    "dedupctl/cli.py",
    # DEDUP_LOGGING_API_BASE (click's envvar): the smoke command's own option; the app calls no Cloud Logging.
    "deploy/cli.py",
}


def reads_the_environment(source: str, path: str = "<source>") -> bool:
    """Whether ``source`` reads the environment other than by handing ``os.environ`` to
    ``Settings.from_environ``: ``os.environ`` or ``os.getenv`` anywhere else, a click option's
    ``envvar``, or ``.get(...)`` or a subscript with a DEDUP_ name (a literal or a constant holding
    one), the way a module reads an environment mapping it was given."""
    tree = ast.parse(source, path)
    constants = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and node.value.value.startswith("DEDUP_")
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    handed_over = {
        id(argument)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "from_environ"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "Settings"
        for argument in node.args
    }

    def names_a_setting(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.startswith("DEDUP_")
        return isinstance(node, ast.Name) and node.id in constants

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and id(node) not in handed_over:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                return True
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if {alias.name for alias in node.names} & {"environ", "getenv"}:
                return True
        if isinstance(node, ast.keyword) and node.arg == "envvar":
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if node.args and names_a_setting(node.args[0]):
                return True
        if isinstance(node, ast.Subscript) and names_a_setting(node.slice):
            return True
    return False


def scanned_modules():
    for entry in SCANNED:
        if entry.endswith(".py"):
            yield os.path.join(ROOT, entry)
        for folder, _, files in os.walk(os.path.join(ROOT, entry)):
            yield from (os.path.join(folder, name) for name in files if name.endswith(".py"))


def test_only_settings_reads_the_environment():
    readers = set()
    for path in scanned_modules():
        with open(path, encoding="utf-8") as handle:
            if reads_the_environment(handle.read(), path):
                readers.add(os.path.relpath(path, ROOT).replace(os.sep, "/"))
    assert readers == READ_ON_PURPOSE, "read a new setting in settings.py (Settings), and take it from there"
    with open(os.path.join(ROOT, "settings.py"), encoding="utf-8") as handle:
        assert reads_the_environment(handle.read())  # the scan sees settings.py's reading


@pytest.mark.parametrize(
    "source, reads",
    [
        ("import os\nos.environ.get('HOME')", True),
        ("import os\nos.getenv('PORT')", True),
        ("from os import environ", True),
        ("import os\nf(os.environ)", True),
        ("def f(environ):\n    return environ['DEDUP_X']", True),
        ("SETTING = 'DEDUP_X'\ndef f(environ):\n    return environ.get(SETTING)", True),
        ("import click\nclick.option('--x', envvar='X')", True),
        ("import os\nsettings = Settings.from_environ(os.environ)", False),
        ("import os\nos.path.join('a', 'b')", False),
    ],
)
def test_the_scan_sees_each_way_of_reading(source, reads):
    assert reads_the_environment(source) is reads
