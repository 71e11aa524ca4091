"""gcloud-tasks-emulator, a third-party Cloud Tasks emulator (PyPI), for the tests of the real transport.

It speaks Cloud Tasks' gRPC API and delivers App Engine tasks to one host and port, so the app's
dispatcher reaches it as it reaches Cloud Tasks: google-cloud-tasks over gRPC, no credentials
(``DEDUP_TASKS_API_BASE=http://...``).  It pins protobuf<5, which the app's protobuf 7 cannot
share, so it lives in a virtualenv of its own, ``.tasks-emulator/``, built from the hashed
requirements-tasks-emulator.txt (``python -m devtools.tasks_emulator --build-venv``, which
``make test`` runs first).

Where it differs from Cloud Tasks (tests/test_tasks_emulator.py records each):
- it accepts a task whose name the queue has seen (Cloud Tasks refuses it: ALREADY_EXISTS);
- its ``X-AppEngine-QueueName`` is the queue's whole name, not the queue id App Engine sends;
- it ignores ``app_engine_routing``: every App Engine task goes to the one target it was given;
- it retries a failed task at once, with no backoff.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from devtools.emulator import free_port

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".tasks-emulator"
REQUIREMENTS = ROOT / "requirements-tasks-emulator.txt"
STAMP = VENV / ".requirements.sha256"


def venv_ready() -> bool:
    """The virtualenv holds exactly requirements-tasks-emulator.txt (its digest written after the install)."""
    return STAMP.is_file() and STAMP.read_text() == _digest()


def _digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def build_venv() -> Path:
    """``.tasks-emulator/`` from the hashed requirements, with this Python; nothing when it is current."""
    if venv_ready():
        return VENV
    print(f"Building {VENV.name}/ (gcloud-tasks-emulator) from {REQUIREMENTS.name}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run(
        [
            str(VENV / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--require-hashes",
            "-r",
            str(REQUIREMENTS),
        ],
        check=True,
    )
    STAMP.write_text(_digest())
    return VENV


class TasksEmulator:
    """The emulator on a free port, with queue.yaml's queues in ``project`` and ``location``,
    delivering App Engine tasks to 127.0.0.1:``target_port``."""

    def __init__(
        self,
        target_port: int,
        project: str,
        location: str,
        queue_yaml: Path = ROOT / "queue.yaml",
        max_retries: int = 20,
        log_path: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.target_port = target_port
        self.project, self.location = project, location
        self.queue_yaml = queue_yaml
        self.max_retries = max_retries
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> TasksEmulator:
        if not venv_ready():
            raise RuntimeError(f"{VENV} is not built: run python -m devtools.tasks_emulator --build-venv")
        log = open(self.log_path, "ab") if self.log_path else None
        self.process = subprocess.Popen(
            [
                str(VENV / "bin" / "gcloud-tasks-emulator"),
                "start",
                f"--port={self.port}",
                "--target-host=127.0.0.1",
                f"--target-port={self.target_port}",
                f"--queue-yaml={self.queue_yaml}",
                f"--queue-yaml-project={self.project}",
                f"--queue-yaml-location={self.location}",
                f"--max-retries={self.max_retries}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log or subprocess.DEVNULL,
            stderr=log or subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        if log is not None:
            log.close()  # the child holds its own descriptor
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gcloud-tasks-emulator exited with {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("gcloud-tasks-emulator did not listen in time")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> TasksEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-venv", action="store_true", help="build .tasks-emulator/ and exit")
    args = parser.parse_args()
    if args.build_venv:
        build_venv()
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
