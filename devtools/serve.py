"""`make run`: the emulator, gunicorn serving main:app as App Engine would, and the example downstream.

Every port is a setting (a make variable, or the environment variable of the same name):
``PORT`` for the app (default 8080), ``DOWNSTREAM_PORT`` for the example downstream service
(default 8081; the example jobs file's ``http`` job is pointed at it), ``EMULATOR_PORT`` for
the Datastore emulator (default: a free port).  A port already in use is named, with the
setting that changes it, before anything starts.  "ready: …" is printed once the app answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence

import yaml

from devtools.emulator import DatastoreEmulator, EmulatorError, free_port

DEFAULT_PORT = 8080
DEFAULT_DOWNSTREAM_PORT = 8081
EXAMPLE_JOBS = "examples/local-jobs.yaml"
EXAMPLE_SCHEDULER = "examples/local-scheduler.yaml"
LOOPBACK = "127.0.0.1"
READY_TIMEOUT_SECONDS = 120


@dataclasses.dataclass(frozen=True)
class Port:
    """A port make run listens on: its number, the setting that changes it, what listens there."""

    number: int
    setting: str
    serves: str


class PortInUse(RuntimeError):
    """A port make run needs is taken (or given twice): the message names it and its setting."""


class NotServing(RuntimeError):
    """A server exited, or did not answer in time."""


def check_ports(ports: Sequence[Port]) -> None:
    """Raise PortInUse for the first port that cannot be bound on loopback, or that two servers share."""
    taken: dict[int, Port] = {}
    for port in ports:
        if port.number in taken:
            other = taken[port.number]
            raise PortInUse(f"{other.setting} and {port.setting} are both {port.number}: give each its own port")
        taken[port.number] = port
        with socket.socket() as sock:
            # As gunicorn binds: a port whose last connection is in TIME_WAIT is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((LOOPBACK, port.number))
            except OSError as exc:
                raise PortInUse(
                    f"port {port.number} ({port.serves}) is in use ({exc.strerror}): stop what listens there, "
                    f"or choose another port with {port.setting}, e.g. make run {port.setting}={free_port()}"
                ) from None


def wait_until_answers(
    url: str,
    processes: Sequence[subprocess.Popen],
    timeout: float = READY_TIMEOUT_SECONDS,
    headers: Mapping[str, str] | None = None,
    ready: Callable[[int], bool] = lambda status: True,
) -> None:
    """Poll ``url`` until it answers with a status ``ready`` accepts (any, by default).

    Raises NotServing when one of ``processes`` exits first, or after ``timeout`` seconds.
    Redirects are not followed: a redirect is an answer.
    """
    opener = urllib.request.build_opener(_NoRedirects)
    request = urllib.request.Request(url, headers=dict(headers or {}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                words = process.args if isinstance(process.args, Sequence) else [process.args]  # or one path
                raise NotServing(f"{' '.join(map(str, words[-1:]))} exited with status {process.returncode}")
        try:
            with opener.open(request, timeout=5) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        except (urllib.error.URLError, OSError):
            status = None
        if status is not None and ready(status):
            return
        time.sleep(0.25)
    raise NotServing(f"{url} did not answer within {timeout:.0f} s")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def jobs_calling(downstream_port: int, source: str, directory: str) -> str:
    """A copy of the jobs file ``source`` in ``directory`` whose ``http`` jobs on loopback call the
    example downstream at ``downstream_port``: the port is make run's setting, not the file's."""
    with open(source, encoding="utf-8") as handle:
        document = yaml.safe_load(handle)
    for settings in document["jobs"].values():
        url = urllib.parse.urlsplit(settings.get("url", "")) if settings.get("kind") == "http" else None
        if url is not None and url.hostname == LOOPBACK:
            settings["url"] = url._replace(netloc=f"{LOOPBACK}:{downstream_port}").geturl()
    path = os.path.join(directory, os.path.basename(source))
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(document, handle, sort_keys=False)
    return path


def port_number(text: str) -> int:
    """A port given as a flag or a setting: 1 to 65535."""
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1 to 65535)")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # A string default goes through ``type`` as a flag would: a bad setting is refused by name.
    setting = {name: os.environ.get(name, "").strip() or None for name in ("PORT", "DOWNSTREAM_PORT", "EMULATOR_PORT")}
    parser.add_argument("--port", type=port_number, default=setting["PORT"] or str(DEFAULT_PORT), help="(PORT)")
    parser.add_argument("--jobs", default=os.environ.get("DEDUP_JOBS_FILE", EXAMPLE_JOBS))
    parser.add_argument(
        "--downstream-port",
        type=port_number,
        default=setting["DOWNSTREAM_PORT"] or str(DEFAULT_DOWNSTREAM_PORT),
        help="the example downstream service's (DOWNSTREAM_PORT)",
    )
    parser.add_argument(
        "--emulator-port",
        type=port_number,
        default=setting["EMULATOR_PORT"],
        help="the Datastore emulator's (EMULATOR_PORT; default a free port)",
    )
    args = parser.parse_args(argv)
    ports = [
        Port(args.port, "PORT", "the app"),
        Port(args.downstream_port, "DOWNSTREAM_PORT", "the example downstream service"),
    ]
    if args.emulator_port:
        ports.append(Port(args.emulator_port, "EMULATOR_PORT", "the Datastore emulator"))
    try:
        check_ports(ports)
    except PortInUse as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1
    try:
        emulator = DatastoreEmulator(project="dedup-local", port=args.emulator_port).start()
    except EmulatorError as exc:
        print(exc, file=sys.stderr)
        return 1
    base, downstream = f"http://{LOOPBACK}:{args.port}", f"http://{LOOPBACK}:{args.downstream_port}"
    print(f"Datastore emulator on {emulator.host}; starting {base} with jobs from {args.jobs}", flush=True)
    print(f"and the example downstream service (examples/downstream.py) on {downstream}", flush=True)
    example = args.jobs == EXAMPLE_JOBS
    scratch = tempfile.mkdtemp(prefix="make-run-")
    # Local development: no caller verification unless DEDUP_AUTH says otherwise.
    env = {
        "DEDUP_AUTH": "none",
        # The Scheduler jobs make run knows it is the target of (executions listing, dashboard).
        "DEDUP_SCHEDULER_FILE": EXAMPLE_SCHEDULER if example else "",
        **os.environ,
        **emulator.env,
        "DEDUP_JOBS_FILE": jobs_calling(args.downstream_port, args.jobs, scratch) if example else args.jobs,
    }
    servers = [
        _gunicorn(args.port, "main:app", env),
        _gunicorn(args.downstream_port, "examples.downstream_main:app", env, workers=1),
    ]

    stopping: list[bool] = []

    def stop(*_: object) -> None:
        stopping.append(True)
        for server in servers:
            if server.poll() is None:
                server.terminate()

    signal.signal(signal.SIGTERM, stop)
    try:
        wait_until_answers(f"{base}/admin/", servers)
        wait_until_answers(f"{downstream}/", servers)
        print(f"ready: {base}/admin/ (the dashboard; {base}/ leads there)", flush=True)
        return servers[0].wait()
    except NotServing as exc:
        if stopping:  # SIGTERM before the servers answered
            return 0
        print(f"make run: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop()
        for server in servers:
            server.wait()
        emulator.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def _gunicorn(port: int, app: str, env: dict[str, str], workers: int = 2) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--bind",
            f"{LOOPBACK}:{port}",
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
