"""`make devserver`: the app under Google's own local server, ``dev_appserver.py``, with app.yaml as it is
but for one thing: gunicorn listens on 127.0.0.1 only.

Unlike `make run` (gunicorn alone, DEDUP_AUTH=none), dev_appserver enforces
``login: admin`` and ``auth_fail_action: unauthorized`` and signs people in
through its ``dev_appserver_login`` cookie (``"EMAIL:True:ID"``, True for an
admin), so the shipped ``DEDUP_AUTH=appengine`` is what runs.  It runs the
entrypoint (gunicorn) from a virtualenv it builds from requirements.txt, silently, on its
first start; ``--build-venv`` (``make devserver-venv``, which ``make devserver`` and ``make
test`` run first) builds that virtualenv in ``.devserver/`` beforehand with pip's progress,
and once it holds requirements.txt dev_appserver's starts skip the package index.

dev_appserver passes client-sent ``X-Appengine-*`` markers through and
honours ``X-AppEngine-Fake-Is-Admin``, so here (``GAE_ENV=localdev``) the app
trusts forgeable headers and serves only requests addressed to a loopback
host name (against DNS rebinding), and every server of it listens on loopback
only: app.yaml's ``--bind :$PORT`` (every interface, as App Engine needs) is
served as ``--bind 127.0.0.1:$PORT``, from an application directory in
``.devserver/app/`` that links to this one's files.  Use it on a machine you
trust, to see login, roles and the dashboard as App Engine shows them.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from devtools.emulator import DatastoreEmulator, EmulatorError
from devtools.serve import NotServing, wait_until_answers
from handlers.auth import OFF_APP_ENGINE_SETTING, OFF_APP_ENGINE_VALUE

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = ROOT / ".devserver"
DEFAULT_OPERATOR = "test@example.com"  # dev_appserver's login form suggests this email
LOGIN_COOKIE = "dev_appserver_login"
# app.yaml's entrypoint listens on every interface, as App Engine needs; here, on loopback only.
EVERY_INTERFACE_BIND = "--bind :$PORT"
LOOPBACK_BIND = "--bind 127.0.0.1:$PORT"


class DevServerError(RuntimeError):
    """make devserver cannot run: the reason, for its user."""


class DevServerMissing(DevServerError):
    """dev_appserver.py or the Cloud SDK's bundled Python is not installed here."""


def find_sdk() -> tuple[Path, Path]:
    """(dev_appserver.py, the SDK's bundled python3): the system Python fails on one of its imports."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise DevServerMissing("the gcloud CLI is not installed (https://cloud.google.com/sdk/docs/install)")
    sdk = Path(os.path.realpath(gcloud)).parent.parent
    dev_appserver = sdk / "bin" / "dev_appserver.py"
    if not dev_appserver.exists():
        raise DevServerMissing(
            "dev_appserver.py is not installed: gcloud components install app-engine-python "
            "(or apt-get install google-cloud-cli-app-engine-python)"
        )
    python = Path(os.environ.get("CLOUDSDK_PYTHON") or sdk / "platform" / "bundledpythonunix" / "bin" / "python3")
    if not python.exists():
        raise DevServerMissing(f"the Cloud SDK's bundled Python is missing ({python}); set CLOUDSDK_PYTHON to it")
    return dev_appserver, python


def runtime_python() -> str | None:
    """A Python 3.13 (app.yaml's python313) for the app, else None: dev_appserver's own Python.

    DEVSERVER_PYTHON names one; otherwise python3.13 on PATH or under pyenv, each
    checked by running it (a pyenv shim for a version not selected fails).
    """
    candidates = [os.environ.get("DEVSERVER_PYTHON"), shutil.which("python3.13")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13")))
    for candidate in filter(None, candidates):
        try:
            probe = subprocess.run(
                [candidate, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True, timeout=30
            )
        except OSError:
            continue
        if probe.returncode == 0 and probe.stdout.strip():
            return probe.stdout.strip()
    return None


def login_cookie(email: str, admin: bool = True, user_id: str = "1") -> dict[str, str]:
    """The cookie dev_appserver signs a user in with."""
    return {LOGIN_COOKIE: f"{email}:{admin}:{user_id}"}


def loopback_app_yaml() -> str:
    """app.yaml, its entrypoint's gunicorn bound to 127.0.0.1 instead of every interface."""
    text = (ROOT / "app.yaml").read_text()
    if text.count(EVERY_INTERFACE_BIND) != 1:
        raise DevServerError(f"app.yaml's entrypoint no longer binds {EVERY_INTERFACE_BIND} once: update {__name__}")
    return text.replace(EVERY_INTERFACE_BIND, LOOPBACK_BIND)


def app_directory(state_dir: Path = STATE_DIR) -> Path:
    """What dev_appserver serves: links to this directory's files, beside ``loopback_app_yaml()``.

    dev_appserver takes no entrypoint for a python runtime but app.yaml's, and
    serves the directory its app.yaml is in (requirements.txt, gunicorn's
    working directory), hence links rather than another yaml file here.
    """
    app_dir = state_dir / "app"
    if app_dir.exists():
        shutil.rmtree(app_dir)  # links and a copy only: rmtree removes links, never what they name
    app_dir.mkdir(parents=True)
    for entry in sorted(ROOT.iterdir()):
        if not entry.name.startswith(".") and entry.name != "app.yaml":
            (app_dir / entry.name).symlink_to(entry)
    (app_dir / "app.yaml").write_text(loopback_app_yaml())
    return app_dir


def requirements_digest() -> str:
    return hashlib.sha256((ROOT / "requirements.txt").read_bytes()).hexdigest()


def service_name(root: Path = ROOT) -> str:
    """app.yaml's ``service`` (dev_appserver names the service's virtualenv after it), else default."""
    return yaml.safe_load((root / "app.yaml").read_text()).get("service") or "default"


@dataclasses.dataclass(frozen=True)
class Virtualenv:
    """The virtualenv dev_appserver runs app.yaml's entrypoint from, and the stamp saying it is complete."""

    path: Path
    python: str  # what dev_appserver builds it with: the runtime Python, else its own
    stamp: Path

    @property
    def fingerprint(self) -> str:
        return f"{requirements_digest()} {self.python}\n"

    def ready(self) -> bool:
        """Whether it holds this requirements.txt, built with this Python."""
        return (
            (self.path / "bin" / "python").exists()
            and self.stamp.exists()
            and self.stamp.read_text() == self.fingerprint
        )

    def mark_ready(self) -> None:
        self.stamp.parent.mkdir(parents=True, exist_ok=True)
        self.stamp.write_text(self.fingerprint)


def virtualenv(state_dir: Path = STATE_DIR, root: Path = ROOT) -> Virtualenv:
    """dev_appserver's virtualenv for this app: ``--python_virtualenv_path``/<service>."""
    service = service_name(root)
    venvs = state_dir / "venvs"
    return Virtualenv(venvs / service, runtime_python() or str(find_sdk()[1]), venvs / f"{service}.requirements.sha256")


def build_virtualenv(state_dir: Path = STATE_DIR) -> Virtualenv:
    """Build dev_appserver's virtualenv from requirements.txt, as its first start would, with pip's
    progress shown; nothing to do when it is complete."""
    venv = virtualenv(state_dir)
    shown = os.path.relpath(venv.path, ROOT)
    if venv.ready():
        print(f"dev_appserver's virtualenv {shown} holds requirements.txt", flush=True)
        return venv
    print(
        f"Building dev_appserver's virtualenv {shown} from requirements.txt with {venv.python} "
        "(the first time: a few minutes, mostly downloads; make devserver and its tests reuse it)",
        flush=True,
    )
    subprocess.run([venv.python, "-m", "venv", "--clear", str(venv.path)], check=True)
    pip = [str(venv.path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    subprocess.run([*pip, "--progress-bar", "on", "--require-hashes", "-r", str(ROOT / "requirements.txt")], check=True)
    venv.mark_ready()
    return venv


def command(
    port: int,
    emulator: DatastoreEmulator,
    jobs_file: str,
    operators: str,
    state_dir: Path = STATE_DIR,
) -> tuple[list[str], dict[str, str]]:
    """The dev_appserver.py command line and its environment."""
    dev_appserver, python = find_sdk()
    runtime = runtime_python()
    app_env = {
        **emulator.env,
        "DEDUP_JOBS_FILE": jobs_file,
        "DEDUP_OPERATORS": operators,
        # GAE_ENV=localdev is not App Engine: nothing strips client-sent markers, so the app says it
        # knows and serves loopback only.
        OFF_APP_ENGINE_SETTING: OFF_APP_ENGINE_VALUE,
        # No Cloud Tasks here (app.yaml names production's queue): the dispatched work (the
        # dashboard's runs, catch-up) is done on the app's own threads, as under make run.
        "DEDUP_TASKS_QUEUE": "",
        # Bytecode written into the app directory would look like an edit to dev_appserver.
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    args = [
        str(python),
        str(dev_appserver),
        f"--port={port}",
        "--admin_port=0",
        "--api_port=0",
        f"--application={emulator.project}",
        f"--storage_path={state_dir / 'storage'}",
        f"--python_virtualenv_path={state_dir / 'venvs'}",
        "--max_module_instances=1",
        "--automatic_restart=no",
        *([f"--runtime_python_path={runtime}"] if runtime else []),
        *(f"--env_var={name}={value}" for name, value in app_env.items()),
        str(app_directory(state_dir) / "app.yaml"),
    ]
    env = {**os.environ, "CLOUDSDK_PYTHON": str(python)}
    if virtualenv(state_dir).ready():
        env["PIP_NO_INDEX"] = "1"  # everything is installed: start without the package index
    return args, env


def wait_ready(port: int, server: subprocess.Popen, timeout: float = 300) -> None:
    """Until the app itself answers a signed-in admin (dev_appserver answers 401 alone before that)."""
    try:
        wait_until_answers(
            f"http://127.0.0.1:{port}/api/v1/runs?limit=1",
            [server],
            timeout,
            headers={"Cookie": f"{LOGIN_COOKIE}={login_cookie(DEFAULT_OPERATOR)[LOGIN_COOKIE]}"},
            ready=lambda status: status == 200,
        )
    except NotServing as exc:
        raise DevServerError(f"dev_appserver.py: {exc}") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8080)))
    parser.add_argument("--jobs", default=os.environ.get("DEDUP_JOBS_FILE", "examples/local-jobs.yaml"))
    parser.add_argument(
        "--operators",
        default=os.environ.get("DEDUP_OPERATORS", DEFAULT_OPERATOR),
        help=f"DEDUP_OPERATORS for the app (default {DEFAULT_OPERATOR}, dev_appserver's suggested login)",
    )
    parser.add_argument(
        "--build-venv",
        action="store_true",
        help="build dev_appserver's virtualenv (make devserver-venv) and exit; without dev_appserver, say so",
    )
    args = parser.parse_args()
    if args.build_venv:
        try:
            build_virtualenv()
        except DevServerMissing as exc:
            print(f"make devserver-venv: nothing to build, make devserver cannot run here: {exc}", flush=True)
        except subprocess.CalledProcessError as exc:
            print(f"make devserver-venv: {' '.join(map(str, exc.cmd[:4]))} … failed ({exc.returncode})")
            return 1
        return 0
    try:
        find_sdk()
        loopback_app_yaml()
        emulator = DatastoreEmulator(project="dedup-local").start()
    except (DevServerError, EmulatorError) as exc:
        print(exc, file=sys.stderr)
        return 1
    argv, env = command(args.port, emulator, args.jobs, args.operators)
    print(
        f"dev_appserver.py on http://127.0.0.1:{args.port}/admin/ (Datastore emulator on {emulator.host}); "
        f"sign in as an admin with {args.operators.split(',')[0]} to act as an operator",
        flush=True,
    )
    server = subprocess.Popen(argv, env=env, start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(server.pid, signal.SIGTERM))
    try:
        wait_ready(args.port, server)
        virtualenv().mark_ready()  # built by dev_appserver itself if not beforehand
        print(f"ready: http://127.0.0.1:{args.port}/admin/", flush=True)
        return server.wait()
    except DevServerError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait()
        emulator.stop()


if __name__ == "__main__":
    sys.exit(main())
