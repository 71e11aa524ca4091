"""dedupctl as people install it: a wheel built from pyproject.toml, installed into a fresh
virtualenv outside the clone with its dependencies at the versions requirements.txt pins (the
locked distributions, copied: no package index), then run from there, by its console script,
against the app on gunicorn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from dedupctl.client import Exit
from devtools.gunicorn import GunicornServer
from tests.support.live import serving

pytestmark = pytest.mark.live
ROOT = Path(__file__).resolve().parent.parent
# What the client may bring: requests and click, and what they need. Never the app's stack.
ALLOWED = {"dedupctl", "requests", "click", "urllib3", "idna", "certifi", "charset-normalizer", "pip"}
JOBS = """
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
"""


def locked_blocks(lock: Path) -> dict[str, str]:
    """requirements.txt's entries (``name==version`` and its hashes), by normalised name."""
    blocks: dict[str, str] = {}
    name = None
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            name = canonicalize_name(line.split("==")[0])
            blocks[name] = ""
        if name and not line.lstrip().startswith("#"):
            blocks[name] += line + "\n"
    return blocks


def closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` need, as the test's own environment (installed from the
    same locks) has them: markers evaluated, no extras."""
    from importlib import metadata

    found: set[str] = set()
    queue = [Requirement(text) for text in requirements]
    while queue:
        requirement = queue.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name not in found:
            found.add(name)
            queue += [Requirement(text) for text in metadata.requires(name) or []]
    return found


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
    requires = _requires_dist(wheel)
    assert sorted(canonicalize_name(Requirement(r).name) for r in requires if "extra ==" not in r) == [
        "click",
        "requests",
    ]
    locks = locked_blocks(ROOT / "requirements.txt")
    needed = closure([r for r in requires if "extra ==" not in r])
    from importlib import metadata

    for name in needed:  # the test's own environment was installed from the same locks, hashes checked
        assert locks[name].startswith(f"{name}=={metadata.version(name)} "), name
    environment = folder / "venv"
    venv.create(environment, with_pip=True)
    bin_dir = environment / "bin"
    # Offline, so the suite never waits on the package index: the dependencies are the locked
    # distributions this environment already holds, copied file by file from their RECORDs;
    # pip then installs the wheel without an index and checks every requirement is met.
    (site,) = (environment / "lib").glob("python*/site-packages")
    for name in sorted(needed):
        copy_distribution(name, site)
    subprocess.run(
        [bin_dir / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
        cwd=folder,
    )
    subprocess.run([bin_dir / "python", "-m", "pip", "check"], check=True, timeout=120, cwd=folder)
    yield bin_dir


def copy_distribution(name: str, site: Path) -> None:
    """An installed distribution's files (its RECORD), copied into another environment's site-packages."""
    import shutil
    from importlib import metadata

    distribution = metadata.distribution(name)
    for file in distribution.files or []:
        source = Path(str(distribution.locate_file(file)))
        if ".." in file.parts or "__pycache__" in file.parts or not source.is_file():
            continue  # console scripts live outside site-packages; bytecode is rebuilt
        target = site / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _requires_dist(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


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
