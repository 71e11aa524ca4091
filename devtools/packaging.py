"""A wheel built from this tree, installed as people install it: into a fresh virtualenv outside
the clone, with its dependencies at the versions requirements.txt locks (the distributions this
environment already holds, copied file by file: no package index, so no test waits on one).

Shared by the client's packaging test (dedupctl) and the library's (devtools.library_wheel)."""

from __future__ import annotations

import shutil
import subprocess
import venv
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def locked_blocks(lock: Path) -> dict[str, str]:
    """A lock file's entries (``name==version`` and its hashes), by normalised name."""
    blocks: dict[str, str] = {}
    name = None
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            name = canonicalize_name(line.split("==")[0])
            blocks[name] = ""
        if name and not line.lstrip().startswith("#"):
            blocks[name] += line + "\n"
    return blocks


def closure(requirements: list[str], extras: tuple[str, ...] = ()) -> set[str]:
    """The distributions ``requirements`` need, as this environment (installed from the same
    locks) has them: markers evaluated, with ``extras`` of the first (a wheel's own)."""
    found: set[str] = set()
    seen: set[tuple[str, str]] = set()
    # (a distribution, the extras asked of it): the wheel's own with ``extras``, each dependency
    # with the extras its requirement names (google-api-core[grpc] brings grpcio-status).
    queue = [(text, extras) for text in requirements]
    while queue:
        text, asked = queue.pop()
        requirement = Requirement(text)
        if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in ("", *asked)):
            continue
        name = canonicalize_name(requirement.name)
        found.add(name)
        for extra in ("", *sorted(requirement.extras)):
            if (name, extra) not in seen:
                seen.add((name, extra))
                queue += [(each, tuple(requirement.extras)) for each in metadata.requires(name) or []]
    return found


def requires_dist(wheel: Path) -> list[str]:
    """A wheel's Requires-Dist lines, extras' included."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def copy_distribution(name: str, site: Path) -> None:
    """An installed distribution's files (its RECORD), copied into another environment's site-packages."""
    distribution = metadata.distribution(name)
    for file in distribution.files or []:
        source = Path(str(distribution.locate_file(file)))
        if ".." in file.parts or "__pycache__" in file.parts or not source.is_file():
            continue  # console scripts live outside site-packages; bytecode is rebuilt
        target = site / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def install_outside(wheel: Path, folder: Path, extras: tuple[str, ...] = ()) -> Path:
    """A fresh virtualenv in ``folder`` holding ``wheel`` and the locked distributions its
    requirements (with ``extras``) need, ``pip check``ed: its bin/."""
    environment = folder / "venv"
    venv.create(environment, with_pip=True)
    bin_dir = environment / "bin"
    (site,) = (environment / "lib").glob("python*/site-packages")
    for name in sorted(closure(requires_dist(wheel), extras)):
        copy_distribution(name, site)
    pip = [str(bin_dir / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--no-index", "--no-deps", str(wheel)], check=True, timeout=300, cwd=folder)
    subprocess.run([*pip, "check"], check=True, timeout=120, cwd=folder, capture_output=True)
    return bin_dir
