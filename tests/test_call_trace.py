"""devtools/call_trace.py: the figures docs/architecture.md records for one fresh delivery."""

from __future__ import annotations

import os
import textwrap

import pytest

from devtools.call_trace import JOBS_YAML, ROOT, Trace, main, package_of, trace_delivery


def test_only_the_apps_own_packages_count():
    assert package_of(os.path.join(ROOT, "dedup", "ledger.py")) == "dedup"
    assert package_of(os.path.join(ROOT, "handlers", "auth", "gate.py")) == "handlers"
    assert package_of(os.path.join(ROOT, "settings.py")) == "settings"
    # Tests, tools, benchmarks and the libraries are not the app's path.
    assert package_of(os.path.join(ROOT, "tests", "conftest.py")) is None
    assert package_of(os.path.join(ROOT, "devtools", "call_trace.py")) is None
    assert package_of(os.path.join(ROOT, ".venv", "lib", "flask", "app.py")) is None
    assert package_of("/usr/lib/python3.13/json/__init__.py") is None
    # A folder whose name merely starts like the project's is outside it.
    assert package_of(ROOT + "-copy/dedup/ledger.py") is None


def test_a_package_switch_is_a_change_between_consecutive_calls():
    trace = Trace(calls=[("handlers", "a"), ("handlers", "b"), ("dedup", "c"), ("handlers", "a"), ("jobs", "d")])
    assert trace.figures() == {"calls": 5, "modules": 4, "package switches": 3, "representations": 0}


def test_one_fresh_delivery_is_traced_through_the_app(datastore, ndb_client, tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(textwrap.dedent(JOBS_YAML))
    trace = trace_delivery(ndb_client, str(jobs))
    figures = trace.figures()
    packages = {package for package, _ in trace.calls}
    assert {"handlers", "dedup", "jobs"} <= packages
    assert figures["modules"] <= figures["calls"] and figures["package switches"] < figures["calls"]
    # The run's record and its outcome are among the representations the request crossed.
    assert {"dedup.run_record.RunRecord", "dedup.outcomes.Finished"} <= trace.returned
    # The same code walks the same path: a second trace gives the same figures.
    assert trace_delivery(ndb_client, str(jobs)).figures() == figures


@pytest.mark.slow  # starts an emulator of its own
def test_the_command_prints_the_figures(capsys, emulator):
    assert main(["--types"]) == 0
    printed = capsys.readouterr().out
    for name in ("calls", "modules", "package switches", "representations", "dedup.run_record.RunRecord"):
        assert name in printed
