"""Run the app under a real gunicorn, as App Engine does, against the test emulator."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from devtools.emulator import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class GunicornServer:
    def __init__(
        self,
        emulator,
        jobs_file: str,
        workers: int = 2,
        threads: int = 8,
        app: str = "main:app",
        extra_env: dict | None = None,
        quiet: bool = False,
        log_path: str | None = None,
    ) -> None:
        """``log_path``: the app's output (its log lines) is appended there; else it is shown,
        unless ``quiet``."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.emulator = emulator
        self.jobs_file = jobs_file
        self.workers = workers
        self.threads = threads
        self.process: subprocess.Popen | None = None
        self.app = app
        self.extra_env = extra_env or {}
        self.quiet = quiet
        self.log_path = log_path

    def start(self, timeout: float = 60, probe: bool = True) -> GunicornServer:
        """Start gunicorn and wait until the app answers a request, or (``probe=False``) only until
        gunicorn listens: its workers may still be starting, as on a new App Engine instance."""
        env = {**os.environ, **self.emulator.env, "DEDUP_JOBS_FILE": self.jobs_file, **self.extra_env}
        env = {name: value for name, value in env.items() if value is not None}  # None in extra_env: unset
        output = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL if self.quiet else None
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                str(self.workers),
                "--threads",
                str(self.threads),
                "--worker-class",
                "gthread",
                "--timeout",
                "120",
                "--no-control-socket",
                self.app,
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
        )
        if self.log_path:
            output.close()  # type: ignore[union-attr]  # the child holds its own descriptor
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.process.returncode}{self._log_tail()}")
            if not probe:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return self
                except OSError:
                    time.sleep(0.01)
                    continue
            try:
                urllib.request.urlopen(f"{self.url}/jobs/-readiness-probe", timeout=2)
            except urllib.error.HTTPError:
                return self  # a JSON 404: the app is serving
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("gunicorn did not start serving in time")

    def _log_tail(self) -> str:
        if not self.log_path:
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return f"; the end of {self.log_path}:\n" + "".join(handle.readlines()[-15:])

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> GunicornServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
