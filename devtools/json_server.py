"""A local HTTP server answering JSON: what the stand-ins of Google's APIs share.

Each stand-in is a function from a request (method, path with its query, raw body, headers) to
an answer (status, JSON payload); this serves it on 127.0.0.1 and a free port, one thread per
request, until ``close()``.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any

from devtools import POLL_SECONDS

# (method, path with its query, raw body, headers) -> (status, JSON payload)
Route = Callable[[str, str, bytes, dict[str, str]], tuple[int, Any]]


class JsonServer:
    def __init__(self, route: Route, methods: tuple[str, ...] = ("GET", "POST", "PATCH", "DELETE")) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, payload = route(self.command, self.path, raw, dict(self.headers.items()))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        for method in methods:
            setattr(Handler, f"do_{method}", Handler._serve)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
