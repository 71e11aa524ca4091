"""Build the library's wheel (library/pyproject.toml over dedup/), and say what it costs installed.

    python -m devtools.library_wheel [--out DIR] [--report]

The wheel is built from a staging folder holding library/'s pyproject.toml, README.md and
CHANGELOG.md beside a copy of dedup/: the app imports dedup/ where it is, the wheel packages the
same files, and no second copy is kept.  ``--report`` installs it into a fresh virtualenv
(devtools.packaging: the locked dependencies, no package index) and prints the wheel's size,
what it and its dependencies take installed, and how long importing the protocol takes there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from devtools.packaging import ROOT, closure, install_outside, requires_dist

LIBRARY = ROOT / "library"
PACKAGE = "dedup"
# What importing the protocol means: the ledger, its Datastore store and the runner (with NDB,
# gRPC and the Datastore client they bring).
IMPORTED = "dedup.ledger, dedup.record_store, dedup.runner"


def build(out: Path) -> Path:
    """The wheel, built into ``out``: its path."""
    from flit_core import buildapi

    with tempfile.TemporaryDirectory() as stage:
        for name in ("pyproject.toml", "README.md", "CHANGELOG.md"):
            shutil.copy2(LIBRARY / name, Path(stage) / name)
        shutil.copytree(ROOT / PACKAGE, Path(stage) / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        out.mkdir(parents=True, exist_ok=True)
        here = os.getcwd()
        os.chdir(stage)  # flit builds the project in the working directory
        try:
            name = buildapi.build_wheel(str(out.resolve()))
        finally:
            os.chdir(here)
    return out / name


def installed_bytes(site: Path, names: set[str]) -> int:
    """What the named distributions' files take in ``site`` (their RECORDs)."""
    total = 0
    for distribution in metadata.distributions(path=[str(site)]):
        if distribution.metadata["Name"] and _normal(distribution.metadata["Name"]) in names:
            for file in distribution.files or []:
                path = Path(str(distribution.locate_file(file)))
                if path.is_file():
                    total += path.stat().st_size
    return total


def import_seconds(python: Path, runs: int = 5) -> float:
    """The median time the installed protocol takes to import, in a new process each run."""
    code = f"import time; t = time.perf_counter(); import {IMPORTED}; print(time.perf_counter() - t)"
    times = []
    for _ in range(runs):
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, cwd=python.parent)
        times.append(float(done.stdout))
    return statistics.median(times)


def report(wheel: Path, folder: Path) -> dict[str, float]:
    """The wheel's size, installed sizes and import time, from a fresh virtualenv in ``folder``."""
    bin_dir = install_outside(wheel, folder)
    (site,) = (bin_dir.parent / "lib").glob("python*/site-packages")
    needed = closure(requires_dist(wheel))
    return {
        "wheel_kib": wheel.stat().st_size / 1024,
        "installed_kib": installed_bytes(site, {"cloud-scheduler-dedup"}) / 1024,
        "with_dependencies_mib": installed_bytes(site, needed | {"cloud-scheduler-dedup"}) / 2**20,
        "dependencies": len(needed),
        "import_s": import_seconds(bin_dir / "python"),
    }


def _normal(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the wheel goes (default: dist/)")
    parser.add_argument("--report", action="store_true", help="install it in a fresh virtualenv and say its costs")
    args = parser.parse_args(argv)
    wheel = build(args.out)
    print(f"built {os.path.relpath(wheel)}")
    if args.report:
        with tempfile.TemporaryDirectory() as folder:
            figures = report(wheel, Path(folder))
        print(f"wheel: {figures['wheel_kib']:.0f} KiB")
        print(f"installed: {figures['installed_kib']:.0f} KiB, with its {figures['dependencies']} dependencies "
              f"{figures['with_dependencies_mib']:.1f} MiB")  # fmt: skip
        print(f"import {IMPORTED}: {figures['import_s'] * 1000:.0f} ms (median of 5 new processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
