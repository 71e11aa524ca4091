"""make schemas: the JSON Schema of jobs.yaml and scheduler.yaml, generated from their declared models.

The files name their schema on their first line (``# yaml-language-server: $schema=...``), so an
editor with a YAML language server (VS Code's YAML extension) checks them as they are typed.
``python -m devtools.config_schemas`` writes them under schemas/; ``--check`` says whether the
published ones are current (tests/test_config_schemas.py holds them to it).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from jobs.config import jobs_file_model
from schedules.config import SchedulerFile

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def jobs_schema() -> dict[str, Any]:
    """jobs.yaml's: a job id outside the pattern is flagged too (pydantic leaves it open)."""
    schema = jobs_file_model().model_json_schema()
    schema["properties"]["jobs"]["additionalProperties"] = False
    return {"$schema": DIALECT, **schema}


def scheduler_schema() -> dict[str, Any]:
    """scheduler.yaml's: ``defaults`` described as the keys of a job, none of them required."""
    schema = SchedulerFile.model_json_schema()
    job = copy.deepcopy(schema["$defs"]["SchedulerJob"])
    job.pop("required", None)
    jobs = schema["$defs"]["SchedulerJob"]
    # name is the job's key by default, and project and location may be the defaults'.
    jobs["required"] = [field for field in jobs["required"] if field not in ("name", "project", "location")]
    job["description"] = schema["properties"]["defaults"].get("description", "")
    schema["properties"]["defaults"] = {"anyOf": [job, {"type": "null"}], "default": None}
    return {"$schema": DIALECT, **schema}


PUBLISHED = {"jobs.schema.json": jobs_schema, "scheduler.schema.json": scheduler_schema}


def text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name, generate in PUBLISHED.items():
        path, wanted = SCHEMAS / name, text(generate())
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == wanted:
            continue
        if "--check" in argv:
            stale.append(name)
            continue
        SCHEMAS.mkdir(exist_ok=True)
        path.write_text(wanted, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale: {', '.join(stale)}; run make schemas", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
