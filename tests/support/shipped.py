"""The example jobs.yaml and scheduler.yaml as they ship, and the top-level ones as they will deploy.

The top-level ``jobs.yaml`` and ``scheduler.yaml`` are examples a user replaces with their own
jobs, so no test depends on what they hold.  A test of the examples reads their copies under
``tests/fixtures/`` (``EXAMPLE_JOBS``, ``EXAMPLE_SCHEDULE``), which name a reserved example host
and a placeholder project that validation refuses (so the examples never deploy as they are);
``filled_in`` writes them with those values filled in, as a user would.  Only a test of what
deploys reads the top-level files, through ``deployed``, whatever they hold.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLE_JOBS = FIXTURES / "jobs.yaml"
EXAMPLE_SCHEDULE = FIXTURES / "scheduler.yaml"
# Each example file, and the values a user replaces in it: placeholder -> a real-looking value.
FILL_INS = {
    "jobs.yaml": {"crm.example.com": "crm.acme-corp.internal"},
    "scheduler.yaml": {"your-project-id": "acme-prod"},
}


def filled_in(directory: Path) -> tuple[Path, Path]:
    """The examples (jobs.yaml, scheduler.yaml) written to ``directory``, side by side as the app
    reads them, with their placeholders filled in."""
    return _written(EXAMPLE_JOBS, directory, example=True), _written(EXAMPLE_SCHEDULE, directory, example=True)


def deployed(directory: Path) -> tuple[Path, Path | None]:
    """The top-level jobs.yaml and scheduler.yaml (None: there is none) written to ``directory`` as
    they will deploy: a user's own as they are, the examples with a placeholder filled in where one is left."""
    schedule = ROOT / "scheduler.yaml"
    jobs = _written(ROOT / "jobs.yaml", directory, example=False)
    return jobs, _written(schedule, directory, example=False) if schedule.exists() else None


def _written(source: Path, directory: Path, example: bool) -> Path:
    text = source.read_text(encoding="utf-8")
    for placeholder, value in FILL_INS[source.name].items():
        assert not example or placeholder in text, f"{source} no longer holds {placeholder!r}: update {__name__}"
        text = text.replace(placeholder, value)
    path = directory / source.name
    path.write_text(text, encoding="utf-8")
    return path
