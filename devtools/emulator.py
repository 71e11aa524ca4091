"""Start, reset and stop a real Datastore-mode emulator: either of Google's two.

- ``legacy``: the Cloud Datastore emulator in Firestore-in-Datastore mode
  (``gcloud beta emulators datastore start --use-firestore-in-datastore-mode``).  It refuses a
  stale version-fenced write (``conflict_detected``), as the v1 API's contract says.
- ``firestore``: the Firestore emulator in Datastore mode (``gcloud emulators firestore start
  --database-mode=datastore-mode``), the one Google now recommends.  It applies a stale
  version-fenced update or delete and reports no conflict (docs/retention-and-cost.md), so the
  app's start-up check (dedup/fence_check.py) chooses the transactional path on it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

INSTALL_HINT = """\
Both Datastore-mode emulators are needed (they ship with the gcloud CLI and need Java 17+).
Install them with one of:
  apt-get install google-cloud-cli google-cloud-cli-datastore-emulator \
    google-cloud-cli-firestore-emulator openjdk-17-jre-headless
  gcloud components install cloud-datastore-emulator cloud-firestore-emulator beta
"""


QUICK_JIT = "-XX:TieredStopAtLevel=1"
FLAVORS = ("legacy", "firestore")


class EmulatorError(RuntimeError):
    pass


def _sdk_root(gcloud: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.realpath(gcloud)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DatastoreEmulator:
    """One emulator process on a free port with its own data directory."""

    def __init__(
        self,
        project: str = "dedup-local",
        port: int | None = None,
        require_indexes: str | None = None,
        store_on_disk: bool = False,
        quick_jit: bool = False,
        flavor: str = "legacy",
    ) -> None:
        """``require_indexes``: an index.yaml; queries needing an index it lacks then fail,
        as in production.  (gcloud does not pass this option, so the emulator binary
        gcloud ships is started directly, with the same flags gcloud uses.)

        ``quick_jit``: the JVM compiles with C1 only.  A test session's emulator lives for
        seconds to minutes on two shared cores, where C2's compiling costs more CPU than its
        faster code gives back (the fast tier: about a fifth of its CPU).  Benchmarks keep C2.

        ``flavor``: which of the two emulators (``FLAVORS``); the Firestore one takes neither
        ``require_indexes`` nor ``store_on_disk``."""
        if flavor not in FLAVORS:
            raise ValueError(f"flavor must be one of {FLAVORS}, not {flavor!r}")
        if flavor == "firestore" and store_on_disk:
            raise ValueError("the Firestore emulator keeps nothing on disk")
        self.flavor = flavor
        self.project = project
        self.quick_jit = quick_jit
        self.require_indexes = require_indexes
        self.store_on_disk = store_on_disk  # survives restart() (chaos tests)
        self.port = port or free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self._data_dir: str | None = None
        self._log_path: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            "DATASTORE_EMULATOR_HOST": self.host,
            "DATASTORE_PROJECT_ID": self.project,
            "DATASTORE_DATASET": self.project,
            "GOOGLE_CLOUD_PROJECT": self.project,
        }

    def start(self, timeout: float = 120) -> DatastoreEmulator:
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> DatastoreEmulator:
        """Start the process and return at once (``wait_ready`` waits for it to serve), so a
        caller can do other work, a test session its collection, while the JVM starts."""
        gcloud = shutil.which("gcloud")
        if gcloud is None:
            raise EmulatorError("gcloud is not on PATH.\n" + INSTALL_HINT)
        data_dir = self._data_dir = self._data_dir or tempfile.mkdtemp(prefix="datastore-emulator-")
        self._log_path = os.path.join(data_dir, "emulator.log")
        command = [
            gcloud,
            "beta",
            "emulators",
            "datastore",
            "start",
            f"--project={self.project}",
            "--store-on-disk" if self.store_on_disk else "--no-store-on-disk",
            "--use-firestore-in-datastore-mode",
            f"--host-port={self.host}",
            f"--data-dir={data_dir}",
        ]
        if self.flavor == "firestore":
            command = self._firestore_command(gcloud)
        elif self.require_indexes:
            command = self._direct_command(gcloud, data_dir, self.require_indexes)
        log = open(self._log_path, "ab")
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._process_env(),
            start_new_session=True,  # its own process group: stop() ends the Java child too
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = 120) -> DatastoreEmulator:
        """Wait until the spawned emulator serves; stop it and raise if it exits or never does."""
        assert self.process is not None, "spawn() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmulatorError(
                    f"the emulator exited with {self.process.returncode}:\n{self.log_tail()}\n{INSTALL_HINT}"
                )
            if self.healthy():
                return self
            time.sleep(0.05)
        self.stop()
        raise EmulatorError(f"the emulator did not answer within {timeout}s:\n{self.log_tail()}")

    def _process_env(self) -> dict[str, str]:
        env = {**os.environ, "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
        if self.quick_jit:
            # The java launcher reads JDK_JAVA_OPTIONS (Java 9+); the caller's own options stay.
            env["JDK_JAVA_OPTIONS"] = " ".join(filter(None, [env.get("JDK_JAVA_OPTIONS"), QUICK_JIT]))
        return env

    def _direct_command(self, gcloud: str, data_dir: str, index_file: str) -> list[str]:
        """The emulator itself, not gcloud's wrapper: only it takes ``--require_indexes``."""
        binary = os.path.join(_sdk_root(gcloud), "platform", "cloud-datastore-emulator", "cloud_datastore_emulator")
        if not os.path.exists(binary):
            raise EmulatorError(f"no emulator at {binary}.\n" + INSTALL_HINT)
        # What `cloud_datastore_emulator create` writes (a JVM start of its own, half a second):
        # a project directory holding an empty, auto-generated index file.
        project_dir = os.path.join(data_dir, "project")
        os.makedirs(os.path.join(project_dir, "WEB-INF"), exist_ok=True)
        with open(os.path.join(project_dir, "WEB-INF", "index.yaml"), "w", encoding="utf-8") as handle:
            handle.write("indexes:\n# AUTOGENERATED\n")
        host, port = self.host.split(":")
        return [
            binary,
            "start",
            f"--host={host}",
            f"--port={port}",
            "--store_on_disk=False",
            "--firestore_in_datastore_mode",
            "--require_indexes",
            f"--index_file={os.path.abspath(index_file)}",
            project_dir,
        ]

    def _firestore_command(self, gcloud: str) -> list[str]:
        """The Firestore emulator itself in Datastore mode, as ``gcloud emulators firestore start
        --database-mode=datastore-mode`` runs it (without gcloud's wrapper: one process fewer)."""
        binary = os.path.join(_sdk_root(gcloud), "platform", "cloud-firestore-emulator", "cloud_firestore_emulator")
        if not os.path.exists(binary):
            raise EmulatorError(f"no Firestore emulator at {binary}.\n" + INSTALL_HINT)
        host, port = self.host.split(":")
        return [binary, "start", f"--host={host}", f"--port={port}", "--database-mode=datastore-mode"]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def reset(self) -> None:
        """Wipe all data (POST /reset)."""
        request = urllib.request.Request(f"http://{self.host}/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise EmulatorError(f"reset answered {response.status}")

    def restart(self, down_seconds: float = 0) -> None:
        """Stop the process and start it again on the same port and data (store_on_disk)."""
        self._stop_process()
        time.sleep(down_seconds)
        self.start()

    def stop(self) -> None:
        self._stop_process()
        if self._data_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def _stop_process(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait(timeout=10)
        self.process = None
        # The Java server can outlive its wrapper for a moment: wait until the port is dead.
        deadline = time.monotonic() + 15
        while self.healthy() and time.monotonic() < deadline:
            time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        if not self._log_path or not os.path.exists(self._log_path):
            return ""
        with open(self._log_path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])

    def __enter__(self) -> DatastoreEmulator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
