"""A real gunicorn serving the app on the test emulator, with a jobs file written from YAML."""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path
from typing import Any, Iterator

from devtools.gunicorn import GunicornServer


@contextlib.contextmanager
def serving(emulator: Any, folder: Path, jobs_yaml: str, **options: Any) -> Iterator[GunicornServer]:
    """gunicorn on ``jobs_yaml`` (dedented, written to ``folder``); ``options`` go to GunicornServer."""
    jobs = folder / "jobs.yaml"
    jobs.write_text(textwrap.dedent(jobs_yaml))
    with GunicornServer(emulator, str(jobs), **options) as running:
        yield running
