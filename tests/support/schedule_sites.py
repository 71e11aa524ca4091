"""What the schedule tests share: the clock's start, slot times by the hour, cron's marker, and an
app built from a jobs file and a scheduler.yaml written to a folder (a deployed version)."""

from __future__ import annotations

import datetime
import logging
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


class InProcessDaySite:
    """devtools/schedule_day.py's Site in-process: webtest on a ManualClock, the audit's lines
    caught by a logging handler, Cloud Tasks' deliveries made one after the other."""

    def __init__(self, folder: pathlib.Path, sink_url: str, clock: Any, ndb_client: Any) -> None:
        from devtools import schedule_day

        self.folder, self.sink_url, self.clock, self.ndb_client = folder, sink_url, clock, ndb_client
        self.site: webtest.TestApp | None = None
        self.records: list[logging.LogRecord] = []
        self._day = schedule_day

    def deploy(self) -> None:
        self.site = schedule_site(
            self.folder, self._day.jobs_yaml(self.sink_url), self._day.SCHEDULES, self.clock, self.ndb_client
        )

    def set_clock(self, instant: datetime.datetime) -> None:
        self.clock.advance((instant - self.clock.now()).total_seconds())

    def call(self, method, path, *, headers=None, json_body=None, params=None):  # type: ignore[no-untyped-def]
        assert self.site is not None, "deploy() first"
        handler = _Collect(self.records)
        audit_log = logging.getLogger("dedup.audit")
        audit_log.addHandler(handler)
        try:
            options: dict[str, Any] = {"headers": dict(headers or {}), "expect_errors": True}
            if method == "GET":
                response = self.site.get(path, params=dict(params or {}), **options)
            elif json_body is not None:
                response = self.site.post_json(path, json_body, **options)
            else:
                response = self.site.post(path, b"", **options)
        finally:
            audit_log.removeHandler(handler)
        return response.status_int, response.json if response.content_type.endswith("json") else None

    def deliver_tasks(self, tasks: Any) -> None:
        from devtools.cloud_tasks_fake import to_webtest

        tasks.deliver(to_webtest(self.site), times=2)

    def audit_lines(self) -> list[Any]:
        return [
            self._day.AuditLine(r.levelname, getattr(r, "outcome", None), getattr(r, "schedule_time", None))
            for r in self.records
            if r.levelno >= logging.WARNING
        ]


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.WARNING)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
