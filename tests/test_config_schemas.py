"""The JSON Schema of jobs.yaml and scheduler.yaml: published as generated, named by every shipped file,
and what the shipped files hold is valid under it (what an editor checks as the user types)."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from devtools.config_schemas import PUBLISHED, SCHEMAS, text

ROOT = Path(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = {
    "jobs.yaml": "jobs.schema.json",
    "scheduler.yaml": "scheduler.schema.json",
    "examples/local-jobs.yaml": "jobs.schema.json",
    "examples/local-scheduler.yaml": "scheduler.schema.json",
    "tests/fixtures/jobs.yaml": "jobs.schema.json",
    "tests/fixtures/scheduler.yaml": "scheduler.schema.json",
}
MODELINE = "# yaml-language-server: $schema="


def schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_published_schema_is_the_one_the_models_generate(name):
    assert (SCHEMAS / name).read_text(encoding="utf-8") == text(PUBLISHED[name]()), "run make schemas"


def as_json(document: Any) -> Any:
    """YAML as a language server hands it to the schema: timestamps are strings."""
    return json.loads(json.dumps(document, default=lambda v: v.isoformat() if isinstance(v, datetime.datetime) else v))


@pytest.mark.parametrize("path, name", sorted(SHIPPED.items()))
def test_each_shipped_file_names_its_schema_first_and_is_valid_under_it(path, name):
    source = ROOT / path
    first = source.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(MODELINE), first
    named = (source.parent / first.removeprefix(MODELINE)).resolve()
    assert named == (SCHEMAS / name).resolve()
    document = as_json(yaml.safe_load(source.read_text(encoding="utf-8")))
    jsonschema.Draft202012Validator(schema(name)).validate(document)


def test_every_jobs_and_scheduler_file_of_the_repository_is_listed():
    found = {
        str(path.relative_to(ROOT))
        for pattern in ("jobs.yaml", "scheduler.yaml", "examples/*.yaml", "tests/fixtures/*.yaml")
        for path in ROOT.glob(pattern)
        if "jobs" in path.name or "scheduler" in path.name
    }
    assert found == set(SHIPPED)


@pytest.mark.parametrize(
    "name, document",
    [
        ("jobs.schema.json", {"jobs": {"j": {"kind": "python", "target": "a.b:c", "colour": "red"}}}),
        ("jobs.schema.json", {"jobs": {"j": {"kind": "cobol"}}}),
        ("jobs.schema.json", {"jobs": {"bad id!": {"kind": "python", "target": "a.b:c"}}}),
        ("jobs.schema.json", {"jobs": {"j": {"kind": "http", "url": "https://x.internal", "lease_seconds": "10"}}}),
        ("scheduler.schema.json", {"jobs": {"n": {"target": "j", "project": "p"}}}),
        ("scheduler.schema.json", {"defaults": {"colour": 1}, "jobs": {}}),
        ("scheduler.schema.json", {"jobs": {"n": {"target": "j", "schedule": "0 * * * *", "retry": {"x": 1}}}}),
    ],
)
def test_an_editor_flags_what_start_up_refuses(name, document):
    """Not a formality: an unknown key, an unknown kind, a string for a number, a missing key."""
    assert list(jsonschema.Draft202012Validator(schema(name)).iter_errors(document))
