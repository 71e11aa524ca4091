"""A job kind registered in jobs/kinds/__init__.py is documented, published and run, or a test fails.

docs/architecture.md, "Adding a job kind": one module in jobs/kinds/ and one registration
line.  What a user needs beside the code follows from the registry, and is checked here:
the kind's section of docs/jobs.md, its place in the published JSON Schema (so an editor
offers it), and a test that delivers a job of the kind (a YAML ``kind: <name>`` in tests/).
"""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from jobs.kinds import KINDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_manual_has_a_section_on_the_kind(kind):
    assert re.search(rf"^##+ `{kind}`", read("docs", "jobs.md"), re.MULTILINE), f"docs/jobs.md: no '## `{kind}`'"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_published_schema_offers_the_kind(kind):
    schema = json.loads(read("schemas", "jobs.schema.json"))
    kinds = {
        definition["properties"]["kind"].get("const")
        for definition in schema["$defs"].values()
        if "kind" in definition.get("properties", {})
    }
    assert kind in kinds


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_test_declares_a_job_of_the_kind(kind):
    tests = [path for path in glob.glob(os.path.join(ROOT, "tests", "test_*.py")) if path != os.path.abspath(__file__)]
    declaring = [path for path in tests if re.search(rf"\bkind: {kind}\s*$", read(path), re.MULTILINE)]
    assert declaring, f"no test delivers a job of kind {kind!r}: declare one (kind: {kind}) and run it"
