"""`python -m bench.memory`: a gunicorn worker's memory over many fresh runs, beside the original pattern.

Issue 37 §2: a finished run must leave nothing behind, so that a worker's memory does not follow
its run rate.  Each app is served by one gunicorn worker (8 threads, as app.yaml runs it) on
one emulator; keep-alive clients on 8 threads send fresh Scheduler deliveries of a job with an
hour's lease (heartbeat on), and after each checkpoint the worker's resident memory (VmRSS) is
read.  The app and the original pattern (bench/original_pattern.py: no heartbeat, no fast
path) get the same deliveries.  Memory figures depend on the machine and the libraries, so
compare the columns and the growth, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import sys
import tempfile
import threading

import requests

from dedup.keys import format_utc
from devtools.emulator import DatastoreEmulator
from devtools.gunicorn import GunicornServer

JOBS = """\
jobs:
  noop:
    kind: python
    target: bench.jobs:noop
    lease_seconds: 3600
"""
ENV = {"DEDUP_AUTH": "none"}  # measure the runs, not token checks
APPS = {"app": "main:app", "original pattern": "bench.original_pattern:served()"}
CHECKPOINTS = (1_000, 10_000, 20_000, 30_000)
CLIENTS = 8
FIRST_SLOT = datetime.datetime(2034, 1, 1, tzinfo=datetime.UTC)


def worker_pid(master: int) -> int:
    """The one worker gunicorn's master process forked."""
    with open(f"/proc/{master}/task/{master}/children", encoding="ascii") as handle:
        [worker] = handle.read().split()
    return int(worker)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        kib = next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
    return kib / 1024


def memory_over_runs(url: str, pid: int, checkpoints: tuple[int, ...], clients: int = CLIENTS) -> list[float]:
    """The worker's MiB after each checkpoint's count of fresh runs (each answered 200, or this fails)."""
    local = threading.local()

    def deliver(index: int) -> None:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        slot = format_utc(FIRST_SLOT + datetime.timedelta(seconds=index))
        answer = session.post(
            f"{url}/jobs/noop",
            headers={"X-CloudScheduler-JobName": "memory", "X-CloudScheduler-ScheduleTime": slot},
            timeout=60,
        )
        if answer.status_code != 200:
            raise RuntimeError(f"run {index}: {answer.status_code} {answer.text[:200]}")

    figures, sent = [], 0
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for target in checkpoints:
            list(pool.map(deliver, range(sent, target)))
            sent = target
            figures.append(rss_mib(pid))
    return figures


def measure(checkpoints: tuple[int, ...]) -> dict[str, list[float]]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(JOBS)
    log = os.path.join(tempfile.gettempdir(), "bench-memory.log")  # gunicorn's and the apps' lines
    emulator = DatastoreEmulator(project="bench-memory").start()
    try:
        measured = {}
        for label, app in APPS.items():
            with GunicornServer(emulator, handle.name, workers=1, app=app, log_path=log, extra_env=ENV) as server:
                assert server.process is not None
                measured[label] = memory_over_runs(server.url, worker_pid(server.process.pid), checkpoints)
            emulator.reset()
        return measured
    finally:
        emulator.stop()
        os.unlink(handle.name)


def render(checkpoints: tuple[int, ...], measured: dict[str, list[float]]) -> str:
    labels = list(measured)
    lines = [
        "| fresh runs | " + " | ".join(f"{label}, worker MiB" for label in labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    for row, runs in enumerate(checkpoints):
        lines.append(f"| {runs:,} | " + " | ".join(f"{measured[label][row]:.1f}" for label in labels) + " |")
    growth = " | ".join(f"{measured[label][-1] - measured[label][0]:+.1f}" for label in labels)
    lines.append(f"| growth after the first {checkpoints[0]:,} | {growth} |")
    return "\n".join(lines)


def section(checkpoints: tuple[int, ...], measured: dict[str, list[float]]) -> str:
    """``render``'s table as a section of make bench's report."""
    intro = (
        "One gunicorn worker (8 threads) per app, keep-alive clients on 8 threads sending fresh Scheduler\n"
        "deliveries of a job with an hour's lease (heartbeat on); the worker's resident memory (VmRSS)\n"
        "after each count of runs. Compare the growth, not the absolute figures."
    )
    return f"\n## Worker memory over fresh runs (bench/memory.py)\n\n{intro}\n\n{render(checkpoints, measured)}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, nargs="+", default=list(CHECKPOINTS), help="the checkpoints, in fresh runs (ascending)"
    )
    args = parser.parse_args(argv)
    checkpoints = tuple(args.runs)
    if not well_ordered(checkpoints):
        parser.error("--runs: positive counts in ascending order")
    print(render(checkpoints, measure(checkpoints)))
    return 0


def well_ordered(checkpoints: tuple[int, ...]) -> bool:
    """Checkpoints a measurement can reach one after another: positive, ascending, none twice."""
    return bool(checkpoints) and list(checkpoints) == sorted(set(checkpoints)) and checkpoints[0] >= 1


if __name__ == "__main__":
    sys.exit(main())
