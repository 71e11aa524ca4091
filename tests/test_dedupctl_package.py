"""dedupctl as people install it: a wheel built from pyproject.toml, installed into a fresh
virtualenv outside the clone with its dependencies at the versions requirements.txt pins (the
locked distributions, copied: no package index), then run from there, by its console script,
against the app on gunicorn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from dedupctl.client import Exit
from devtools.gunicorn import GunicornServer
from devtools.packaging import ROOT, closure, install_outside, locked_blocks, requires_dist
from tests.support.live import serving

pytestmark = pytest.mark.live
# What the client may bring: requests and click, and what they need. Never the app's stack.
ALLOWED = {"dedupctl", "requests", "click", "urllib3", "idna", "certifi", "charset-normalizer", "pip"}
JOBS = """
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[Path]:
    """The bin/ of a fresh virtualenv holding the dedupctl wheel and its pinned dependencies."""
    folder = tmp_path_factory.mktemp("outside-the-clone")
    wheels = folder / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("dedupctl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert tops == {"dedupctl", wheel.name.removesuffix("-py3-none-any.whl") + ".dist-info"}  # no app, no tests
    requires = requires_dist(wheel)
    assert sorted(canonicalize_name(Requirement(r).name) for r in requires if "extra ==" not in r) == [
        "click",
        "requests",
    ]
    locks = locked_blocks(ROOT / "requirements.txt")
    needed = closure([r for r in requires if "extra ==" not in r])
    from importlib import metadata

    for name in needed:  # the test's own environment was installed from the same locks, hashes checked
        assert locks[name].startswith(f"{name}=={metadata.version(name)} "), name
    # Offline, so the suite never waits on the package index (devtools.packaging).
    bin_dir = install_outside(wheel, folder)
    yield bin_dir


@pytest.fixture(scope="module")
def server(emulator, tmp_path_factory) -> Iterator[GunicornServer]:
    with serving(emulator, tmp_path_factory.mktemp("package"), JOBS, workers=1, threads=2, quiet=True) as running:
        yield running


def outside(bin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The console script, run from a folder with no clone in sight and no PYTHONPATH."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEDUPCTL_ID_TOKEN")}
    return subprocess.run(
        [str(bin_dir / "dedupctl"), *args],
        cwd=bin_dir.parent.parent,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_installed_client_holds_only_its_small_dependencies(installed):
    listed = subprocess.run(
        [installed / "python", "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    names = {canonicalize_name(entry["name"]) for entry in json.loads(listed.stdout)}
    assert "dedupctl" in names and names <= ALLOWED, names - ALLOWED
    where = subprocess.run(
        [installed / "python", "-c", "import dedupctl; print(dedupctl.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=installed,
    ).stdout
    assert "site-packages" in where and not where.startswith(str(ROOT))


def test_the_installed_client_runs_a_job_once_against_the_app(installed, server, datastore, tmp_path):
    helped = outside(installed, "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("Usage: dedupctl ") and "``" not in helped.stdout
    parameters = json.dumps({"dir": str(tmp_path)})
    done = outside(installed, "run", "effect", "--url", server.url, "--no-auth", "--parameters-json", parameters)
    assert done.returncode == Exit.OK, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == "completed" and len(os.listdir(tmp_path)) == 1
    shown = outside(installed, "runs", "show", answer["run_id"], "--url", server.url, "--no-auth")
    assert shown.returncode == Exit.OK and json.loads(shown.stdout)["run_id"] == answer["run_id"]
    # --audience needs google-auth, an extra: without it, a clear refusal, not a traceback.
    adc = outside(installed, "runs", "list", "--url", server.url, "--audience", "client-id")
    assert adc.returncode == Exit.REFUSED and "dedupctl[adc]" in adc.stderr and "Traceback" not in adc.stderr
    tokened = outside(installed, "runs", "list", "--url", server.url, "--no-auth", DEDUPCTL_ID_TOKEN="x")
    assert tokened.returncode == Exit.OK and json.loads(tokened.stdout)["runs"][0]["run_id"] == answer["run_id"]
