"""handlers/slot_statuses.py: a status added to ExecutionStatus is added everywhere, or a test fails.

docs/architecture.md, "Adding a slot status": the enum member and how it is derived
(schedules/slots.py), one entry of the table, and the documents that list statuses for
readers and clients.  Each of those is checked here against the enum.
"""

from __future__ import annotations

import os
import re

import yaml

from dedupctl.backfill import LEFT_ALONE, REOPENABLE
from handlers.slot_statuses import LEGEND, MARK_SHAPES, NEEDS_ATTENTION, RUNS_IN_BULK, STATUSES, status_stylesheet
from schedules.slots import ExecutionStatus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVERY = {str(status) for status in ExecutionStatus}


def test_every_status_has_one_entry_and_every_page_list_derives_from_it():
    assert set(STATUSES) == set(ExecutionStatus)
    assert {status for status, _ in LEGEND} == EVERY == set(MARK_SHAPES)
    assert len(set(MARK_SHAPES.values())) == len(MARK_SHAPES)  # told apart by shape, not colour alone
    assert set(RUNS_IN_BULK) <= set(NEEDS_ATTENTION)  # a slot worth running in bulk is counted too


def test_the_stylesheet_gives_every_status_a_badge_and_a_mark_colour():
    css = status_stylesheet()
    for status, traits in STATUSES.items():
        badge = re.search(rf"([^}}]*\.{status}\b[^{{]*)\{{ background: (#[0-9a-f]{{6}}); \}}", css)
        mark = re.search(rf"([^}}]*\.mark\.{status}\b[^{{]*)\{{ fill: (#[0-9a-f]{{6}}); \}}", css)
        assert badge and badge.group(2) == traits.colour, status
        assert mark and mark.group(2) == traits.colour, status


def test_the_api_document_lists_every_status():
    with open(os.path.join(ROOT, "handlers", "openapi.yaml"), encoding="utf-8") as handle:
        document = yaml.safe_load(handle)
    assert set(document["components"]["schemas"]["ExecutionStatus"]["enum"]) == EVERY


def test_the_backfill_cli_says_what_it_does_with_every_status():
    """dedupctl is a client that imports nothing of the app: its own words for each status."""
    assert set(REOPENABLE) | set(LEFT_ALONE) == EVERY


def test_the_operators_manual_explains_every_status():
    with open(os.path.join(ROOT, "docs", "schedules.md"), encoding="utf-8") as handle:
        table = set(re.findall(r"^\| `([a-z_]+)` \|", handle.read(), re.MULTILINE))
    assert EVERY <= table
