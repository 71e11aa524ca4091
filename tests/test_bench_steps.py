"""bench/steps.py: the round trips one step adds, counted on the wire (issue 42 §3's target: one
per recorded step on the fenced path)."""

from __future__ import annotations

import logging
import os

import pytest

from bench import steps


def test_a_step_costs_one_round_trip_per_record_on_the_fenced_path(datastore, caplog):
    caplog.set_level(logging.ERROR)
    figures = steps.measure(datastore, runs=9)  # medians: a loaded machine can make one run look longer
    fenced = figures["fenced"]
    assert steps.per_step(fenced, "3 at_least_once steps") == 1  # its result, after the call
    assert steps.per_step(fenced, "3 at_most_once steps") == 2  # "started" before, the result after
    # Unverified, each record is a transaction that reads first: dearer, never cheaper.
    transactional = figures["transactional"]
    assert steps.per_step(transactional, "3 at_least_once steps") > 1
    assert transactional["no steps"]["rpcs"] >= fenced["no steps"]["rpcs"]
    table = steps.section(figures, 9)
    assert "| fenced | 3 at_least_once steps | " in table and "| transactional | no steps |" in table


@pytest.mark.slow
def test_the_bench_steps_command_prints_its_table(capsys):
    before = dict(os.environ), logging.getLogger("dedup").level
    assert steps.main(["--runs", "1"]) == 0
    # Neither its emulator's address nor its quiet logging is left to the next test.
    assert (dict(os.environ), logging.getLogger("dedup").level) == before
    table = capsys.readouterr().out
    assert "## Round trips a step adds" in table and "| fenced | 3 at_most_once steps |" in table
