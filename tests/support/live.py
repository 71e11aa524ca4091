"""A real gunicorn serving the app on the test emulator, with a jobs file written from YAML."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devtools.gunicorn import GunicornServer


@contextlib.contextmanager
def serving(emulator: Any, folder: Path, jobs_yaml: str, **options: Any) -> Iterator[GunicornServer]:
    """gunicorn on ``jobs_yaml`` (dedented, written to ``folder``); ``options`` go to GunicornServer.

    Such a server lives for a whole module while the Datastore is wiped between its tests,
    which production never does: its cache of completed runs would answer for records
    that are gone, so it is off (tests/test_rpc_budget.py and test_finished_cache.py test it).
    """
    jobs = folder / "jobs.yaml"
    jobs.write_text(textwrap.dedent(jobs_yaml))
    options["extra_env"] = {"DEDUP_FINISHED_CACHE_ENTRIES": "0", **options.get("extra_env", {})}
    with GunicornServer(emulator, str(jobs), **options) as running:
        yield running
