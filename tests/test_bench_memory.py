"""bench/memory.py (`python -m bench.memory`), on a small scale: each app's worker is measured at
each checkpoint, and the growth after the first is reported."""

from __future__ import annotations

import re

import pytest

from bench import memory


@pytest.mark.live
@pytest.mark.slow
def test_the_command_measures_both_apps_at_each_checkpoint(capsys):
    assert memory.main(["--runs", "40", "80"]) == 0
    table = capsys.readouterr().out
    assert "| fresh runs | app, worker MiB | original pattern, worker MiB |" in table
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \|$", table, re.M)
    assert [runs for runs, _, _ in rows] == ["40", "80"]
    assert all(20 < float(mib) < 2000 for _, *both in rows for mib in both)  # a Python worker's size
    assert re.search(r"^\| growth after the first 40 \| [+-][\d.]+ \| [+-][\d.]+ \|$", table, re.M)


@pytest.mark.parametrize("runs", [["100", "50"], ["0", "10"], ["10", "10"]])
def test_checkpoints_must_be_positive_and_ascending(runs, capsys):
    with pytest.raises(SystemExit) as exited:
        memory.main(["--runs", *runs])
    assert exited.value.code == 2 and "ascending" in capsys.readouterr().err
