"""`make run`: the emulator, gunicorn serving main:app as App Engine would, and the example downstream."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from devtools.emulator import DatastoreEmulator, EmulatorError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8080)))
    parser.add_argument("--jobs", default=os.environ.get("DEDUP_JOBS_FILE", "examples/local-jobs.yaml"))
    parser.add_argument("--downstream-port", type=int, default=8081)
    args = parser.parse_args()
    try:
        emulator = DatastoreEmulator(project="dedup-local").start()
    except EmulatorError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"Datastore emulator on {emulator.host}; serving http://127.0.0.1:{args.port} with jobs from {args.jobs}",
        flush=True,
    )
    print(f"Example downstream service (examples/downstream.py) on http://127.0.0.1:{args.downstream_port}", flush=True)
    # Local development: no caller verification unless DEDUP_AUTH says otherwise.
    env = {
        "DEDUP_AUTH": "none",
        # The Scheduler jobs make run knows it is the target of (executions listing, dashboard).
        "DEDUP_SCHEDULER_FILE": "examples/local-scheduler.yaml" if args.jobs == "examples/local-jobs.yaml" else "",
        **os.environ,
        **emulator.env,
        "DEDUP_JOBS_FILE": args.jobs,
    }
    servers = [
        _gunicorn(args.port, "main:app", env),
        _gunicorn(args.downstream_port, "examples.downstream_main:app", env, workers=1),
    ]

    def stop(*_):
        for server in servers:
            if server.poll() is None:
                server.terminate()

    signal.signal(signal.SIGTERM, stop)
    try:
        return servers[0].wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop()
        for server in servers:
            server.wait()
        emulator.stop()


def _gunicorn(port: int, app: str, env: dict, workers: int = 2) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--threads",
            "8",
            "--worker-class",
            "gthread",
            "--timeout",
            "660",
            "--no-control-socket",
            app,
        ],
        env=env,
    )


if __name__ == "__main__":
    sys.exit(main())
