"""What the schedule tests share: the clock's start, slot times by the hour, cron's marker, and an
app built from a jobs file and a scheduler.yaml written to a folder (a deployed version)."""

from __future__ import annotations

import datetime
import pathlib
import textwrap
from typing import Any

import webtest

from handlers import create_app

T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)  # the tests' ManualClock starts here
CRON = {"X-Appengine-Cron": "true"}  # App Engine's cron marker: /tasks/audit as cron.yaml calls it


def at(hour: float) -> str:
    """The slot ``hour`` hours after T0, spelled as the app lists it."""
    from dedup.keys import format_utc

    return format_utc(T0 + datetime.timedelta(hours=hour))


def schedule_site(
    folder: pathlib.Path, jobs: str, schedules: str | None, clock: Any, ndb_client: Any
) -> webtest.TestApp:
    """The app on ``jobs`` and ``schedules`` (YAML, dedented; None: no scheduler.yaml), in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    if schedules is not None:
        (folder / "scheduler.yaml").write_text(textwrap.dedent(schedules))
    (folder / "jobs.yaml").write_text(textwrap.dedent(jobs))
    return webtest.TestApp(create_app(jobs_file=str(folder / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
