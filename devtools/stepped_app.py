"""The app on a clock the simulation steps: the WSGI entry make simulate's schedule day serves.

``main:app`` reads the system clock, so a day of hourly slots would take a day.  Here every
gunicorn worker reads the instant from one file (``DEDUP_STEPPED_CLOCK``) that the
simulation writes, as tests step a ManualClock in-process: leases, deadlines, pauses and
the audit all see the simulation's time, and stand still while it does.  Not deployed.
"""

from __future__ import annotations

import datetime
import os

from handlers import create_app
from handlers.logs import configure_logging
from settings import Settings

CLOCK_FILE_VARIABLE = "DEDUP_STEPPED_CLOCK"


class FileClock:
    """The instant in ``path`` (RFC 3339), read at each call: one clock for every worker."""

    def __init__(self, path: str) -> None:
        self.path = path

    def now(self) -> datetime.datetime:
        with open(self.path, encoding="utf-8") as handle:
            return datetime.datetime.fromisoformat(handle.read().strip())

    def set(self, instant: datetime.datetime) -> None:
        """Move the clock (the simulation's side): written whole, so no reader sees half a time."""
        if instant.tzinfo is None:
            raise ValueError("the stepped clock takes aware instants")
        partial = f"{self.path}.partial"
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(instant.astimezone(datetime.UTC).isoformat())
        os.replace(partial, self.path)


def _app():  # type: ignore[no-untyped-def]  # gunicorn loads this module's ``app``
    settings = Settings.from_environ(os.environ)  # read once, as main.py does
    configure_logging(settings)
    return create_app(clock=FileClock(os.environ[CLOCK_FILE_VARIABLE]), settings=settings)


if os.environ.get(CLOCK_FILE_VARIABLE):
    app = _app()
