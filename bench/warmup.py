"""The first delivery to a new instance, with and without App Engine's warmup request (issue 40 §5).

A new instance: gunicorn as app.yaml starts it (2 workers x 8 threads), timed from when it
listens, which is when App Engine could route a request to it.  Without warmup the first
delivery waits for a worker to import the app and bind the schedules; with warmup App Engine
sends ``/_ah/warmup`` first and routes traffic only after it answers, so the first delivery
finds a warm worker.  Each case starts ``rounds`` fresh servers; the figures are medians.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import requests

from devtools.gunicorn import GunicornServer

JOBS = """\
jobs:
  noop:
    kind: python
    target: bench.jobs:noop
    lease_seconds: 600
"""


def _deliver(url: str, index: int) -> tuple[int, float]:
    started = time.perf_counter()
    answer = requests.post(
        f"{url}/jobs/noop",
        timeout=120,
        headers={
            "X-CloudScheduler-JobName": "warmup-bench",
            "X-CloudScheduler-ScheduleTime": f"2034-01-01T00:00:00.{index:06d}Z",
        },
    )
    return answer.status_code, (time.perf_counter() - started) * 1000


def measure(emulator: Any, rounds: int = 3) -> dict[str, dict[str, float]]:
    """Per case (``cold``, ``warmed``): the median milliseconds of the warmup request (warmed only),
    the first delivery after it, and the second; every delivery must answer 200."""
    samples: dict[str, dict[str, list[float]]] = {"cold": {}, "warmed": {}}
    index = 0
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as jobs:
        jobs.write(JOBS)
        jobs.flush()
        for _ in range(rounds):
            for case, figures in samples.items():
                server = GunicornServer(
                    emulator, jobs.name, quiet=True, extra_env={"DEDUP_FINISHED_CACHE_ENTRIES": "0"}
                )
                try:
                    server.start(probe=False)
                    if case == "warmed":
                        started = time.perf_counter()
                        warm = requests.get(f"{server.url}/_ah/warmup", timeout=120)
                        if warm.status_code != 200:
                            raise SystemExit(f"/_ah/warmup answered {warm.status_code}")
                        figures.setdefault("warmup", []).append((time.perf_counter() - started) * 1000)
                    for which in ("first", "second"):
                        index += 1
                        status, ms = _deliver(server.url, index)
                        if status != 200:
                            raise SystemExit(f"{case} {which} delivery answered {status}")
                        figures.setdefault(which, []).append(ms)
                finally:
                    server.stop()
    return {
        case: {name: statistics.median(values) for name, values in figures.items()} for case, figures in samples.items()
    }


def section(figures: dict[str, dict[str, float]], rounds: int) -> str:
    cold, warmed = figures["cold"], figures["warmed"]
    return (
        "\n## A new instance's first delivery, with and without warmup\n\n"
        f"gunicorn as app.yaml starts it, timed from when it listens; median of {rounds} fresh "
        "starts each (bench/warmup.py).\n\n"
        "| case | /_ah/warmup | first delivery | second delivery |\n"
        "|---|---:|---:|---:|\n"
        f"| no warmup (the first request is the loading request) | - | {cold['first']:.0f} ms | "
        f"{cold['second']:.0f} ms |\n"
        f"| inbound_services: warmup | {warmed['warmup']:.0f} ms | {warmed['first']:.0f} ms | "
        f"{warmed['second']:.0f} ms |\n"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.warmup [--rounds N]``: this section alone, on an emulator of its own."""
    import argparse
    import os

    from devtools.emulator import DatastoreEmulator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=3, choices=range(1, 21), metavar="N", help="fresh starts per case"
    )
    args = parser.parse_args(argv)
    with DatastoreEmulator(project="dedup-bench") as emulator:
        os.environ.update(emulator.env)
        os.environ.setdefault("DEDUP_AUTH", "none")
        print(section(measure(emulator, args.rounds), args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
