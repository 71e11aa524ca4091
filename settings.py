"""The app's settings, read once at start-up: one frozen, typed object, one reading, one error.

``Settings.from_environ(os.environ)`` reads and checks every setting it holds, with its default
and its bounds, and raises ``SettingError`` naming the variable, what is wrong and what to
write; ``create_app`` reads it once and hands the values on, so no module reads the
environment for them afterwards.  The ops CLI and the tests check settings through it too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dedup import database
from dedup.finished_cache import MAX_BYTES, MAX_ENTRIES
from jobs.config import DEFAULT_JOBS_FILE

# App Engine's standard environment sets GAE_ENV to this.
PRODUCTION_GAE_ENV = "standard"

# How many requests of a process may wait at once (Prefer: wait) unless DEDUP_MAX_WAITERS says
# otherwise: a quarter of the 8 threads app.yaml gives each worker; and its bound.
DEFAULT_MAX_WAITERS = 2
MAX_WAITERS_LIMIT = 64
MAX_FINISHED_CACHE_ENTRIES = 100_000
MAX_FINISHED_CACHE_MIB = 1024
# Of the instance's memory (App Engine's GAE_MEMORY_MB: 384 MB on an F1, 768 on an F2), what one
# worker's cache may take: a quarter, so app.yaml's two workers leave half for the requests.
CACHE_SHARE_OF_MEMORY = 4


class SettingError(ValueError):
    """A bad DEDUP_* setting: the app refuses to start."""


@dataclass(frozen=True)
class Settings:
    """Every setting below, typed, as ``from_environ`` read and checked it.

    Each field's ``metadata["variable"]`` is the environment variable it is read from.
    """

    max_waiters: int = dataclasses.field(default=DEFAULT_MAX_WAITERS, metadata={"variable": "DEDUP_MAX_WAITERS"})
    finished_cache_entries: int = dataclasses.field(
        default=MAX_ENTRIES, metadata={"variable": "DEDUP_FINISHED_CACHE_ENTRIES"}
    )
    finished_cache_bytes: int = dataclasses.field(default=MAX_BYTES, metadata={"variable": "DEDUP_FINISHED_CACHE_MIB"})
    # None: the ``(default)`` database.
    database: str | None = dataclasses.field(default=None, metadata={"variable": database.SETTING})
    jobs_file: str = dataclasses.field(default=DEFAULT_JOBS_FILE, metadata={"variable": "DEDUP_JOBS_FILE"})
    # None: the scheduler.yaml beside the jobs file, if there is one.
    scheduler_file: str | None = dataclasses.field(default=None, metadata={"variable": "DEDUP_SCHEDULER_FILE"})
    on_app_engine: bool = dataclasses.field(default=False, metadata={"variable": "GAE_ENV"})

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """Read and check every setting of ``environ``; the first bad one raises ``SettingError``."""
        return cls(
            max_waiters=max_waiters(environ),
            finished_cache_entries=finished_cache_entries(environ),
            finished_cache_bytes=finished_cache_bytes(environ),
            database=database_of(environ),
            jobs_file=jobs_file(environ),
            scheduler_file=environ.get("DEDUP_SCHEDULER_FILE") or None,
            on_app_engine=environ.get("GAE_ENV") == PRODUCTION_GAE_ENV,
        )


def whole_number_setting(environ: Mapping[str, str], name: str, default: int, limit: int, zero_means: str) -> int:
    """A DEDUP_* setting that is a whole number from 0 to ``limit`` (unset: ``default``)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not re.fullmatch(r"[0-9]{1,7}", raw) or int(raw) > limit:
        raise SettingError(f"{name}={raw!r}: a whole number from 0 ({zero_means}) to {limit}")
    return int(raw)


def jobs_file(environ: Mapping[str, str]) -> str:
    """DEDUP_JOBS_FILE, else the jobs.yaml beside the app: the app's and ``python -m deploy``'s default."""
    return environ.get("DEDUP_JOBS_FILE") or DEFAULT_JOBS_FILE


def max_waiters(environ: Mapping[str, str]) -> int:
    """DEDUP_MAX_WAITERS: keep it a small share of gunicorn's --threads."""
    return whole_number_setting(
        environ, "DEDUP_MAX_WAITERS", DEFAULT_MAX_WAITERS, MAX_WAITERS_LIMIT, "Prefer: wait is never honoured"
    )


def database_of(environ: Mapping[str, str]) -> str | None:
    """DEDUP_DATABASE: the Datastore-mode database that holds the ledger (None: ``(default)``),
    by the rule the deploy CLI applies too (dedup/database.py)."""
    try:
        return database.client_database(environ)
    except database.DatabaseNameError as exc:
        raise SettingError(f"{database.SETTING}: {exc}") from None


def finished_cache_entries(environ: Mapping[str, str]) -> int:
    """DEDUP_FINISHED_CACHE_ENTRIES: completed runs each process remembers."""
    return whole_number_setting(
        environ, "DEDUP_FINISHED_CACHE_ENTRIES", MAX_ENTRIES, MAX_FINISHED_CACHE_ENTRIES, "no cache"
    )


def finished_cache_bytes(environ: Mapping[str, str]) -> int:
    """DEDUP_FINISHED_CACHE_MIB: what each process's cache may hold, refused when it cannot fit the
    instance class (a quarter of GAE_MEMORY_MB, which App Engine sets to the class's memory)."""
    mib = whole_number_setting(
        environ, "DEDUP_FINISHED_CACHE_MIB", MAX_BYTES // 2**20, MAX_FINISHED_CACHE_MIB, "no cache"
    )
    memory = environ.get("GAE_MEMORY_MB", "")
    if memory.isascii() and memory.isdigit() and mib * CACHE_SHARE_OF_MEMORY > int(memory):
        raise SettingError(
            f"DEDUP_FINISHED_CACHE_MIB={mib}: more than a quarter of this instance's {memory} MB "
            f"(GAE_MEMORY_MB) for one worker's cache; at most {int(memory) // CACHE_SHARE_OF_MEMORY}, "
            "or a larger instance_class in app.yaml"
        )
    return mib * 2**20
