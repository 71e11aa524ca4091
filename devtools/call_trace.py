"""`python -m devtools.call_trace`: what one fresh Scheduler delivery walks through in the app's code.

Counts, for one delivery of a new slot (after a warm-up delivery, so imports, the routing
cache and the fence check are not in the figure), the app's own Python calls on the request's
thread:

- ``calls``: function calls whose code lives in the app's packages (not the libraries);
- ``modules``: the distinct app modules those calls are in;
- ``package switches``: how often consecutive calls change top-level package
  (``handlers`` -> ``dedup`` -> ``handlers`` is two), a measure of how often a reader
  following the request changes folder;
- ``representations``: the distinct app-defined types the request's app functions return
  (a run as a key, a description, an attempt, a record, an outcome, an answer, ...).

docs/architecture.md records the figures before and after the layering issue; run this to
check them.  The figures depend on the code, not the machine: a second run gives the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The app's code: what a deployment uploads and runs (not tests, tools or benchmarks).
APP_PACKAGES = ("dedup", "dispatch", "handlers", "jobs", "models", "schedules", "service", "settings", "main")

JOBS_YAML = """
jobs:
  traced:
    kind: python
    target: devtools.call_trace:nothing
    lease_seconds: 60
"""


def nothing(context: Any) -> dict[str, bool]:
    """The traced job: does nothing, so the figures are the app's own path."""
    return {"done": True}


def package_of(filename: str) -> str | None:
    """The app's top-level package a code file belongs to, or None (a library, a test, a tool)."""
    if not filename.startswith(ROOT + os.sep):
        return None
    first = os.path.relpath(filename, ROOT).split(os.sep)[0]
    name = first[: -len(".py")] if first.endswith(".py") else first
    return name if name in APP_PACKAGES else None


@dataclasses.dataclass
class Trace:
    """The app calls one request made, in order, and the app types its app functions returned."""

    calls: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (package, module file)
    returned: set[str] = dataclasses.field(default_factory=set)

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        filename = frame.f_code.co_filename
        package = package_of(filename)
        if package is None:
            return
        if event == "call":
            self.calls.append((package, filename))
            return
        kind = type(arg)
        module = sys.modules.get(kind.__module__)
        module_file = getattr(module, "__file__", None) or ""
        if package_of(module_file) is not None:
            self.returned.add(f"{kind.__module__}.{kind.__qualname__}")

    def figures(self) -> dict[str, int]:
        packages = [package for package, _ in self.calls]
        return {
            "calls": len(self.calls),
            "modules": len({module for _, module in self.calls}),
            "package switches": sum(1 for a, b in zip(packages, packages[1:], strict=False) if a != b),
            "representations": len(self.returned),
        }


def delivery_headers(schedule_time: str) -> dict[str, str]:
    return {
        "X-CloudScheduler": "true",
        "X-CloudScheduler-JobName": "traced",
        "X-CloudScheduler-ScheduleTime": schedule_time,
    }


_days = itertools.count(1)


def wait_for_fence_check(database: Any, timeout: float = 60) -> None:
    """Until the start-up fence check answers: before it, every run takes the transactional
    path, and the figures would depend on how fast the check was."""
    from dedup import fence_check

    deadline = time.monotonic() + timeout
    while fence_check.current_or_none(database) is None:
        if time.monotonic() > deadline:
            raise RuntimeError("the start-up fence check did not answer")
        time.sleep(0.05)


def trace_delivery(ndb_client: Any, jobs_path: str) -> Trace:
    """Deliver one slot to warm up, then trace the delivery of the next one."""
    import webtest  # type: ignore[import-untyped]  # a dev tool: webtest is a dev requirement

    from dedup import fence_check
    from handlers import create_app

    client = webtest.TestApp(create_app(jobs_file=jobs_path, ndb_client=ndb_client))
    wait_for_fence_check(fence_check.database_of(ndb_client))
    day = next(_days)  # each trace its own slots, so a second trace in one database is fresh too
    client.post("/jobs/traced", headers=delivery_headers(f"2025-10-{day:02d}T23:50:00Z"), status=200)
    trace = Trace()
    sys.setprofile(trace.profile)
    try:
        answer = client.post("/jobs/traced", headers=delivery_headers(f"2025-10-{day:02d}T23:55:00Z"), status=200)
    finally:
        sys.setprofile(None)
    if answer.json["duplicate"] is not False:
        raise RuntimeError(f"the traced delivery was not a fresh run: {answer.json}")
    return trace


def report(figures: dict[str, int], types: Iterable[str], verbose: bool) -> str:
    lines = [f"{name:>18}: {value}" for name, value in figures.items()]
    if verbose:
        lines += ["", "types returned:"] + [f"  {name}" for name in sorted(types)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.call_trace", description=__doc__.splitlines()[0])
    parser.add_argument("--types", action="store_true", help="list the app types the delivery returned")
    arguments = parser.parse_args(argv)

    from google.cloud import ndb

    from devtools.emulator import DatastoreEmulator

    emulator = DatastoreEmulator(project="call-trace").start()
    saved = dict(os.environ)
    try:
        os.environ.update(emulator.env)
        os.environ.setdefault("DEDUP_AUTH", "none")  # a local tool: no caller to verify
        with tempfile.TemporaryDirectory() as folder:
            jobs_path = os.path.join(folder, "jobs.yaml")
            with open(jobs_path, "w", encoding="utf-8") as handle:
                handle.write(textwrap.dedent(JOBS_YAML))
            trace = trace_delivery(ndb.Client(project=emulator.project), jobs_path)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        emulator.stop()
    print(report(trace.figures(), trace.returned, arguments.types))
    return 0


if __name__ == "__main__":
    sys.exit(main())
