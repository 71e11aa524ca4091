"""`make run`: the emulator plus gunicorn serving main:app, as App Engine would."""

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
    args = parser.parse_args()
    try:
        emulator = DatastoreEmulator(project="dedup-local").start()
    except EmulatorError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"Datastore emulator on {emulator.host}; serving http://127.0.0.1:{args.port} "
          f"with jobs from {args.jobs}", flush=True)
    env = {**os.environ, **emulator.env, "DEDUP_JOBS_FILE": args.jobs}
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{args.port}", "--workers", "2",
         "--threads", "8", "--worker-class", "gthread", "--timeout", "660", "--no-control-socket", "main:app"],
        env=env,
    )
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        return server.wait()
    finally:
        emulator.stop()


if __name__ == "__main__":
    sys.exit(main())
