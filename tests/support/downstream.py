"""A small local HTTP server standing in for a downstream service.

It records every request and answers from a script of responses, so tests
can check what an ``http`` job sends and how each answer is classified.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time

from tests.support import POLL_SECONDS


@dataclasses.dataclass
class Reply:
    status: int = 200
    body: bytes = b'{"ok": true}'
    delay: float = 0.0
    headers: dict = dataclasses.field(default_factory=dict)
    trickle: float = 0.0  # seconds between body bytes


@dataclasses.dataclass
class Received:
    method: str
    path: str
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)


class Downstream:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.script: list[Reply] = []
        self.default = Reply()
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with owner._lock:
                    owner.requests.append(Received(self.command, self.path, dict(self.headers), body))
                    reply = owner.script.pop(0) if owner.script else owner.default
                if reply.delay:
                    time.sleep(reply.delay)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                try:
                    if reply.trickle:
                        for index in range(len(reply.body)):
                            self.wfile.write(reply.body[index : index + 1])
                            self.wfile.flush()
                            time.sleep(reply.trickle)
                    else:
                        self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True
        )

    def __enter__(self) -> Downstream:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def keys(self) -> list[str]:
        return [r.headers.get("Idempotency-Key") for r in self.requests]
