"""What the Makefile runs, read from ``make -n`` (nothing is executed): the first install shows
its progress, `make test` builds dev_appserver's virtualenv before pytest starts and measures
coverage, and `make bench` takes its scale and records only on request."""

from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dry_run(*arguments: str) -> list[str]:
    """The commands ``make -n`` prints for ``arguments``, one a line."""
    completed = subprocess.run(["make", "-n", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.splitlines()


@pytest.mark.slow
def test_the_first_install_says_what_it_installs_and_shows_pips_progress():
    commands = dry_run("-B", "venv")  # -B: as on a fresh clone
    install = next(i for i, line in enumerate(commands) if "pip install" in line)
    assert "--quiet" not in commands[install] and "--progress-bar on" in commands[install]
    assert any("Installing the" in line for line in commands[:install])


def test_make_test_and_make_devserver_build_dev_appservers_virtualenv_first():
    for target, runs in (("test", "-m pytest"), ("devserver", "-m devtools.devserver")):
        commands = dry_run(target)
        build = commands.index(".venv/bin/python -m devtools.devserver --build-venv")
        starts = next(i for i, line in enumerate(commands) if runs in line and "--build-venv" not in line)
        assert build < starts, target


def test_make_test_measures_coverage_and_make_check_does_not():
    """`make test` prints line and branch coverage and holds it to pyproject.toml's floor;
    the fast tier stays unmeasured (coverage slows every test)."""
    (full,) = [line for line in dry_run("test") if "-m pytest" in line]
    arguments = full.split("-m pytest", 1)[1].split()
    assert arguments[-3:] == ["--cov", "--cov-report=term", "--cov-report=html"]
    assert arguments[:4] == ["-n", "2", "--dist", "worksteal"]  # one worker per core, idle ones stealing
    (fast,) = [line for line in dry_run("check") if "-m pytest" in line]
    assert "--cov" not in fast


def test_make_bench_takes_its_scale_and_records_only_on_request():
    (plain,) = [line for line in dry_run("bench") if "bench.run" in line]
    assert plain.endswith("-m bench.run --rtt-ms 10")
    (scaled,) = [
        line
        for line in dry_run("bench", "REQUESTS=10", "CONCURRENCY=4", "THROUGHPUT_REQUESTS=16", "RECORD=1", "RTT_MS=")
        if "bench.run" in line
    ]
    assert scaled.endswith("-m bench.run --requests 10 --concurrency 4 --throughput-requests 16 --record")
