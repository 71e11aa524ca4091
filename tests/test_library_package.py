"""Issue 38 §1: the protocol as people install it: the library's wheel (library/pyproject.toml over
dedup/), installed into a fresh virtualenv outside the clone with its locked dependencies (no
package index), imported from there without a web framework, and run against the emulator."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devtools import library_wheel
from devtools.packaging import ROOT, closure, install_outside, locked_blocks, requires_dist

pytestmark = pytest.mark.live
# What the protocol brings: NDB, the Datastore client and API core, gRPC, the OpenTelemetry API
# and ciso8601. Never a web framework, never the app.
DECLARED = [
    "ciso8601",
    "google-api-core",
    "google-auth",
    "google-cloud-datastore",
    "google-cloud-ndb",
    "grpcio",
    "opentelemetry-api",
    "requests",
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return library_wheel.build(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Iterator[Path]:
    """The bin/ of a fresh virtualenv holding the wheel and its locked dependencies, pip-checked."""
    yield install_outside(wheel, tmp_path_factory.mktemp("outside-the-clone"))


def test_the_wheel_holds_the_protocol_alone_typed_with_its_declared_dependencies(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert {name.split("/")[0] for name in names} == {
        "dedup",
        wheel.name.removesuffix("-py3-none-any.whl") + ".dist-info",
    }
    shipped = {name for name in names if name.startswith("dedup/")}
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "dedup").rglob("*") if p.suffix in (".py", ".typed")}
    assert shipped == source and {"dedup/py.typed", "dedup/run_record.py", "dedup/adapters/flask.py"} <= shipped
    requires = requires_dist(wheel)
    core = [r for r in requires if "extra ==" not in r]
    assert sorted(canonicalize_name(Requirement(r).name) for r in core) == DECLARED
    # Each framework is an extra: flask for dedup.adapters.flask, functions-framework for a Cloud Run function.
    assert {str(Requirement(r).marker) for r in requires if r not in core} == {
        'extra == "flask"',
        'extra == "functions"',
    }
    # Each range admits the version the app is locked at, and every distribution they need is locked.
    for text in requires:
        requirement = Requirement(text)
        assert requirement.specifier.contains(metadata.version(requirement.name)), text
    # The core's in the app's locks; the extras' in the development locks (the tests serve them).
    locks = locked_blocks(ROOT / "requirements.txt")
    for name in closure(requires):
        assert locks[name].startswith(f"{name}=={metadata.version(name)} "), name
    locks = locked_blocks(ROOT / "requirements-dev.txt")
    for name in closure(requires, extras=("flask", "functions")):
        assert locks[name].startswith(f"{name}=={metadata.version(name)} "), name


def outside(bin_dir: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` run by the fresh virtualenv's python, from a folder with no clone in sight."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(bin_dir / "python"), "-c", textwrap.dedent(code)],
        cwd=bin_dir.parent.parent,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_installed_protocol_imports_from_the_wheel_without_a_web_framework(installed):
    done = outside(
        installed,
        """
        import json, sys
        import dedup, dedup.ledger, dedup.record_store, dedup.runner, dedup.idempotency, dedup.deliveries
        import dedup.answers, dedup.stored_response, dedup.http_status, dedup.app_engine_markers, dedup.environment
        app = {"flask", "werkzeug", "handlers", "models", "service", "schedules", "jobs"}
        print(json.dumps({"file": dedup.__file__, "app": sorted(m for m in sys.modules if m.split(".")[0] in app)}))
        """,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert "site-packages" in found["file"] and not found["file"].startswith(str(ROOT))
    assert found["app"] == []
    # The Flask adapter without its extra: a refusal that says what to install.
    for adapter in ("flask", "flask_guard", "flask_json"):
        refused = outside(installed, f"import dedup.adapters.{adapter}")
        assert refused.returncode == 1 and "pip install 'cloud-scheduler-dedup[flask]'" in refused.stderr, adapter


RUN_TWICE = """
import concurrent.futures, datetime, json, threading
from google.cloud import ndb
from dedup.clock import SystemClock
from dedup.keys import scheduled_run_key
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.runner import run_once

effects = []
lock = threading.Lock()
client = ndb.Client()
ledger = Ledger(SystemClock())
scope = {"header_project": "acme-prod", "header_location": "us-central1"}
key = scheduled_run_key("nightly-report", "2025-06-01T02:00:00Z", **scope)
described = RunDescription(source="scheduler", job_id="report", scheduler_job_name=key.scheduler_job_name)
policy = RunPolicy(lease_seconds=60, retention_seconds=3600)

def work(attempt):
    with lock:
        effects.append((attempt.run_id, attempt.number))
    return {"rows": 3}

def deliver(_):
    with client.context():
        return type(run_once(ledger, key.run_id, described, policy, work)).__name__

with concurrent.futures.ThreadPoolExecutor(8) as pool:
    outcomes = list(pool.map(deliver, range(8)))
print(json.dumps({"effects": len(effects), "outcomes": sorted(set(outcomes)), "again": deliver(0)}))
"""


def test_the_installed_protocol_runs_a_scheduled_execution_once_on_the_emulator(installed, datastore):
    done = outside(installed, RUN_TWICE, **datastore.env)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # Eight deliveries at once: one ran the work, the rest were told it runs or replayed its answer.
    assert found["effects"] == 1 and "Finished" in found["outcomes"], found
    assert set(found["outcomes"]) <= {"Finished", "InProgress", "Replayed", "Contended"}
    assert found["again"] == "Replayed"


def test_the_report_says_the_wheels_size_and_import_time(wheel, tmp_path):
    figures = library_wheel.report(wheel, tmp_path)
    assert 0 < figures["wheel_kib"] < figures["installed_kib"] < figures["with_dependencies_mib"] * 1024
    assert figures["dependencies"] == len(closure(requires_dist(wheel))) and figures["import_s"] > 0


def test_make_library_builds_the_wheel_where_it_is_asked(tmp_path, capsys):
    assert library_wheel.main(["--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("built ") and list(tmp_path.glob("cloud_scheduler_dedup-*.whl"))
