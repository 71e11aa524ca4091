"""Time as the protocol sees it: injectable so tests step time instead of sleeping."""

from __future__ import annotations

import datetime
import threading
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime.datetime:
        """The current time, timezone-aware UTC."""


class SystemClock:
    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)


class ManualClock:
    """A clock that moves only when told to (tests, simulations)."""

    def __init__(self, start: datetime.datetime | None = None) -> None:
        self._now = start or datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime.datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += datetime.timedelta(seconds=seconds)
