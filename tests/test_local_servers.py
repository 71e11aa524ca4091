"""The local servers listen on loopback only: `make run`'s two gunicorns and its emulator, and the
gunicorn make devserver has dev_appserver start (app.yaml's entrypoint, ``--bind :$PORT``, binds every
interface, as App Engine needs).  Their caller verification trusts headers anyone could send
(tests/test_dns_rebinding.py); tests/test_devserver.py starts make devserver itself."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devtools import devserver
from devtools.emulator import DatastoreEmulator, free_port
from handlers.auth import OFF_APP_ENGINE_SETTING, OFF_APP_ENGINE_VALUE
from tests.support import sockets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_make_devserver_serves_app_yaml_with_gunicorn_bound_to_loopback(tmp_path):
    app_dir = devserver.app_directory(tmp_path)
    shipped = yaml.safe_load(Path(ROOT, "app.yaml").read_text())
    served = yaml.safe_load((app_dir / "app.yaml").read_text())
    entrypoint = shlex.split(served.pop("entrypoint"))
    assert entrypoint[entrypoint.index("--bind") + 1] == "127.0.0.1:$PORT"
    assert shlex.split(shipped.pop("entrypoint")) == [a.replace("127.0.0.1:", ":") for a in entrypoint]
    assert served == shipped  # nothing else differs
    for entry in sorted(os.listdir(ROOT)):
        if not entry.startswith(".") and entry != "app.yaml":
            assert os.path.realpath(app_dir / entry) == os.path.join(ROOT, entry)
    assert not any(name.startswith(".") for name in os.listdir(app_dir))


def test_make_devserver_fails_when_app_yaml_changes_its_bind(tmp_path, monkeypatch):
    (tmp_path / "app.yaml").write_text("entrypoint: gunicorn --bind 0.0.0.0:$PORT main:app\n")
    monkeypatch.setattr(devserver, "ROOT", tmp_path)
    with pytest.raises(devserver.DevServerError, match="no longer binds"):
        devserver.loopback_app_yaml()


def test_make_devserver_runs_the_loopback_app_yaml_saying_markers_are_forgeable(tmp_path):
    try:
        args, _ = devserver.command(8080, DatastoreEmulator(), "examples/local-jobs.yaml", "a@example.com", tmp_path)
    except devserver.DevServerMissing as missing:
        pytest.skip(str(missing))
    assert args[-1] == str(tmp_path / "app" / "app.yaml")
    assert f"--env_var={OFF_APP_ENGINE_SETTING}={OFF_APP_ENGINE_VALUE}" in args
    assert not any(a.startswith("--host=") and a != "--host=localhost" for a in args)  # dev_appserver's own: localhost


def test_dev_appservers_virtualenv_is_the_one_of_app_yamls_service(tmp_path):
    (tmp_path / "app.yaml").write_text("runtime: python313\n")
    assert devserver.service_name(tmp_path) == "default"
    (tmp_path / "app.yaml").write_text("runtime: python313\nservice: dedup\n")
    assert devserver.service_name(tmp_path) == "dedup"
    try:
        venv = devserver.virtualenv(tmp_path / "state", root=tmp_path)
    except devserver.DevServerMissing as missing:
        pytest.skip(str(missing))
    assert venv.path == tmp_path / "state" / "venvs" / "dedup"


@pytest.mark.slow
def test_make_devserver_skips_the_package_index_only_once_its_virtualenv_is_complete(tmp_path):
    def index_skipped() -> bool:
        _, env = devserver.command(8080, DatastoreEmulator(), "examples/local-jobs.yaml", "a@example.com", tmp_path)
        return env.get("PIP_NO_INDEX") == "1"

    try:
        venv = devserver.virtualenv(tmp_path)
    except devserver.DevServerMissing as missing:
        pytest.skip(str(missing))
    assert not index_skipped()
    # A stamp that does not name this service's virtualenv (app.yaml's service renamed) is not enough.
    (tmp_path / "venvs").mkdir()
    (tmp_path / "venvs" / "requirements.sha256").write_text(devserver.requirements_digest())
    assert not index_skipped()
    (venv.path / "bin").mkdir(parents=True)
    (venv.path / "bin" / "python").touch()
    assert not index_skipped()  # there, but not known to be complete
    venv.mark_ready()  # what make devserver-venv does once pip has installed requirements.txt
    assert index_skipped()
    venv.stamp.write_text(venv.fingerprint.replace(venv.python, "/another/python3.13"))
    assert not index_skipped()


@pytest.mark.live
@pytest.mark.slow
def test_make_run_listens_on_loopback_only():
    app, downstream = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "devtools.serve", f"--port={app}", f"--downstream-port={downstream}"],
        cwd=ROOT,
        env={name: value for name, value in os.environ.items() if not name.startswith(("DEDUP_", "DATASTORE_"))},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sockets.wait_serving(f"http://127.0.0.1:{app}/api/v1/runs", server)
        listening = sockets.listening(sockets.process_tree(server.pid))
        ports = {port for _, port in listening}
        assert {app, downstream} <= ports and len(ports) >= 3, listening  # the app, the downstream, the emulator
        assert [address for address, _ in listening if not sockets.is_loopback(address)] == []
        for address in sockets.non_loopback_addresses():
            assert [port for port in ports if sockets.reachable(address, port)] == [], address
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def test_the_test_sessions_emulator_jvm_compiles_with_c1_only(emulator, monkeypatch):
    """quick_jit reaches the JVM (the java launcher says what it picked up) and keeps the caller's options."""
    assert "Picked up JDK_JAVA_OPTIONS: -XX:TieredStopAtLevel=1" in emulator.log_tail(lines=100_000)
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-Xmx1g")
    assert DatastoreEmulator(quick_jit=True)._process_env()["JDK_JAVA_OPTIONS"] == "-Xmx1g -XX:TieredStopAtLevel=1"
    assert DatastoreEmulator()._process_env()["JDK_JAVA_OPTIONS"] == "-Xmx1g"
