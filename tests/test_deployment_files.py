"""app.yaml is the deployment contract: checked, not just shipped."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobs.config import load_jobs
from tests.support.shipped import deployed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def app_yaml() -> dict:
    with open(os.path.join(ROOT, "app.yaml")) as handle:
        return yaml.safe_load(handle)


def test_every_handler_is_admin_only_and_https_only():
    config = app_yaml()
    assert config["app_engine_apis"] is True  # `login:` needs it on second-generation runtimes
    assert config["handlers"]
    for handler in config["handlers"]:
        assert handler.get("login") == "admin", handler
        assert handler.get("secure") == "always", handler
        # A scheduler, a task queue or an API client cannot follow a login redirect.
        assert handler.get("auth_fail_action") == "unauthorized", handler


def test_runtime_is_python3_and_entrypoint_serves_main_app_with_gunicorn():
    config = app_yaml()
    assert re.fullmatch(r"python3\d+", config["runtime"])
    entrypoint = config["entrypoint"]
    assert entrypoint.startswith("gunicorn ") and entrypoint.endswith(" main:app")
    assert "--bind :$PORT" in entrypoint


def test_dedup_scaling_names_the_scaling_type_app_yaml_declares():
    """Renewals stop at the scaling type's request timeout: 600 s unless told otherwise."""
    config = app_yaml()
    declared = next((kind for kind in ("basic", "manual") if f"{kind}_scaling" in config), "automatic")
    assert config.get("env_variables", {}).get("DEDUP_SCALING", "automatic") == declared


def test_gunicorn_timeout_exceeds_every_lease(tmp_path):
    timeout = int(re.search(r"--timeout (\d+)", app_yaml()["entrypoint"]).group(1))
    jobs, _ = deployed(tmp_path)  # whatever jobs.yaml holds: the jobs that deploy
    longest_lease = max(job.policy.lease_seconds for job in load_jobs(str(jobs)).values())
    assert timeout > longest_lease


def test_the_waiter_bound_is_a_small_share_of_each_workers_threads():
    from handlers import max_waiters_from_environ

    config = app_yaml()
    threads = int(re.search(r"--threads (\d+)", config["entrypoint"]).group(1))
    waiters = max_waiters_from_environ(config["env_variables"])
    assert 0 < waiters <= threads // 4  # the rest of the threads stay free for everything else


# The memory App Engine gives each instance class (GAE_MEMORY_MB), per its instance-class table.
INSTANCE_MEMORY_MB = {"F1": 384, "F2": 768, "F4": 1536, "F4_1G": 3072}


def test_the_finished_runs_cache_fits_the_instance_class_app_yaml_names():
    from handlers import CACHE_SHARE_OF_MEMORY, finished_cache_bytes_from_environ

    config = app_yaml()
    workers = int(re.search(r"--workers (\d+)", config["entrypoint"]).group(1))
    memory = INSTANCE_MEMORY_MB[config["instance_class"]]
    cache = finished_cache_bytes_from_environ({**config["env_variables"], "GAE_MEMORY_MB": str(memory)})
    assert workers <= CACHE_SHARE_OF_MEMORY // 2  # the rule's quarter per worker leaves half the memory
    assert workers * cache <= memory * 2**20 // 2


def test_the_app_deploys_as_its_own_service_and_its_cron_entries_go_there():
    """Without `service:`, a deploy replaces the project's `default` service, another app's;
    a cron entry without `target:` goes to `default` too."""
    service = app_yaml().get("service")
    assert service and service != "default"
    with open(os.path.join(ROOT, "cron.yaml")) as handle:
        entries = yaml.safe_load(handle)["cron"]
    assert {entry["url"] for entry in entries} == {"/tasks/cleanup", "/tasks/audit"}
    assert [entry.get("target") for entry in entries] == [service] * len(entries)


# What App Engine needs: the app's packages, its entry point, the two files it reads at
# start-up, what pip installs, and the App Engine configs.
APP_PACKAGES = ("dedup", "dispatch", "handlers", "jobs", "models", "schedules", "service")
# What the suite sets in its own environment (conftest's fakes, coverage's subprocess hook, a
# test's settings): never passed to the app that must start from the uploaded files alone.
SET_BY_TESTS = ("DEDUP_", "DATASTORE_", "PYTHON", "GCE_", "CLOUDSDK_", "COV_CORE_", "COVERAGE_")
APP_FILES = (
    "main.py",
    "gunicorn.conf.py",  # post_worker_init binds the schedules before a worker serves
    "settings.py",
    "jobs.yaml",
    "scheduler.yaml",
    "requirements.txt",
    "app.yaml",
    "cron.yaml",
    "index.yaml",
    "queue.yaml",
)
# What a working tree holds besides the sources after make run, make test, make devserver
# and make bench: none of it may be uploaded.
JUNK = (
    *(f".venv/lib/python3.13/site-packages/pkg{n}/__init__.py" for n in range(50)),
    *(f".devserver/venv/lib/python3.13/site-packages/pkg{n}/__init__.py" for n in range(50)),
    ".devserver/app/app.yaml",
    "__pycache__/main.cpython-313.pyc",
    "handlers/__pycache__/auth.cpython-313.pyc",
    "jobs/kinds/__pycache__/http.cpython-313.pyc",
    ".pytest_cache/.gitignore",
    ".pytest_cache/v/cache/nodeids",
    ".ruff_cache/.gitignore",
    ".ruff_cache/0.14.0/123456",
    ".emulator/WEB-INF/appengine-generated/local_db.bin",
    "test-artifacts/dashboard.png",
    "simulation-report.html",
    "bench/results/run.tmp",
    "handlers/stray.pyc",
    "bench/last-run.md",
    # What building the client leaves (pip wheel -w dist ., a setuptools build).
    "dist/dedupctl-0.1.0-py3-none-any.whl",
    "build/lib/dedupctl/cli.py",
    "dedupctl.egg-info/PKG-INFO",
)


def _source_tree(destination: Path) -> None:
    """The checkout's files as git sees them (tracked, and new files not ignored), copied."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = Path(ROOT, name)
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination / name)


@pytest.mark.slow
def test_gcloud_uploads_the_app_and_nothing_else(tmp_path):
    """`gcloud app deploy` uploads what `gcloud meta list-files-for-upload` lists (offline).

    After make devserver a deploy used to upload 7,088 files, 6,965 of them the dev server's
    virtualenv, where App Engine caps a version at 10,000.
    """
    if shutil.which("gcloud") is None:
        pytest.fail("gcloud is not on PATH: install the Google Cloud CLI (README, Needs)")
    tree = tmp_path / "tree"
    _source_tree(tree)
    for name in JUNK:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("*\n" if name.endswith(".gitignore") else "junk\n")
    # docs/jobs.md's python job, where it tells you to put it: a package of yours beside main.py.
    (tree / "reports").mkdir()
    (tree / "reports" / "__init__.py").write_text("")
    shutil.copyfile(tree / "examples" / "report_job.py", tree / "reports" / "nightly.py")
    yours = {"reports/__init__.py", "reports/nightly.py"}
    listed = subprocess.run(
        ["gcloud", "meta", "list-files-for-upload", str(tree)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud-config")},
    ).stdout
    uploaded = set(listed.split())
    assert yours <= uploaded and "examples/report_job.py" not in uploaded  # the copy deploys, the example not
    uploaded -= yours
    sources = {str(path.relative_to(tree)) for path in tree.rglob("*") if path.is_file()} - set(JUNK) - yours
    needed = {name for name in sources if name in APP_FILES or name.split("/")[0] in APP_PACKAGES}
    assert uploaded == needed, (sorted(uploaded - needed), sorted(needed - uploaded))
    assert len(uploaded) < 200  # App Engine's cap is 10,000
    # docs/deploying.md says how many files a deploy uploads: this count (it said "about 60" at 101).
    with open(os.path.join(ROOT, "docs", "deploying.md"), encoding="utf-8") as handle:
        assert f"the App Engine files, {len(uploaded)} files (no" in " ".join(handle.read().split())

    # What is uploaded is enough: the app starts from those files alone, with the jobs that deploy.
    upload = tmp_path / "upload"
    for name in uploaded:
        (upload / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree / name, upload / name)
    jobs, schedule = deployed(tmp_path)
    code = (
        "import sys, main\n"
        "files = [m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)]\n"
        "print('\\n'.join('imported ' + f for f in files))"
    )
    started = subprocess.run(
        [sys.executable, "-P", "-c", code],
        cwd=upload,
        env={
            # Not what an earlier test left in this process's environment (a DEDUP_ setting can
            # make the app import a module from the checkout): only what App Engine would set.
            **{k: v for k, v in os.environ.items() if not k.startswith(SET_BY_TESTS)},
            "PYTHONPATH": str(upload),
            "DEDUP_JOBS_FILE": str(jobs),
            **({"DEDUP_SCHEDULER_FILE": str(schedule)} if schedule else {}),
            "DEDUP_AUTH": "appengine",
            "DEDUP_APPENGINE_OFF_GAE": "trust-forgeable-headers",
            "DATASTORE_EMULATOR_HOST": "127.0.0.1:9",
            "GOOGLE_CLOUD_PROJECT": "acme-prod",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    # Each path on a line of its own, marked: the app's background start-up (the fence probe) logs to
    # stdout too, and may do so before the paths are printed.
    printed = [line.removeprefix("imported ") for line in started.stdout.splitlines() if line.startswith("imported ")]
    ours = [path for path in printed if not path.startswith(sys.base_prefix + os.sep)]
    ours = [path for path in ours if "site-packages" not in path]
    assert ours and [path for path in ours if not path.startswith(str(upload))] == []


def test_the_queue_the_app_dispatches_to_calls_this_apps_service():
    """queue.yaml's queue is the one app.yaml names, and its tasks go to app.yaml's service."""
    import yaml

    with open(os.path.join(ROOT, "queue.yaml"), encoding="utf-8") as handle:
        [queue] = yaml.safe_load(handle)["queue"]
    with open(os.path.join(ROOT, "app.yaml"), encoding="utf-8") as handle:
        app = yaml.safe_load(handle)
    assert queue["target"] == app["service"]
    assert app["env_variables"]["DEDUP_TASKS_QUEUE"] == queue["name"]
    assert queue["retry_parameters"]["task_retry_limit"] > 0


def test_app_yaml_env_variables_are_settings_the_app_accepts():
    """What app.yaml ships is read by the one settings check (settings.py) and the caller gate's,
    as App Engine starts the app: a bad value there would stop every instance at start-up."""
    from handlers.auth import AuthSettings
    from settings import Settings

    config = app_yaml()
    memory = INSTANCE_MEMORY_MB[config["instance_class"]]
    environ = {
        **{name: str(value) for name, value in config["env_variables"].items()},
        "GAE_ENV": "standard",  # what App Engine adds
        "GAE_MEMORY_MB": str(memory),
        "GAE_SERVICE": config["service"],
        "GOOGLE_CLOUD_PROJECT": "acme-prod",
    }
    settings = Settings.from_environ(environ)
    assert settings.tasks_queue is not None  # the queue app.yaml names is taken
    AuthSettings.from_environ(environ)
