"""What the tests' small HTTP front ends share: serving a handler on a free port, and relaying
the app's answer back to the client."""

from __future__ import annotations

import http.server
import threading

import requests

from tests.support import POLL_SECONDS

# Headers the relay sets itself (or that belong to one connection only).
NOT_RELAYED = ("content-length", "transfer-encoding", "connection", "server", "date")


def relay(handler: http.server.BaseHTTPRequestHandler, answer: requests.Response) -> None:
    """Send ``answer`` (the app's) to the client of ``handler``, as a front end passes it on."""
    handler.send_response(answer.status_code)
    for name, value in answer.headers.items():
        if name.lower() not in NOT_RELAYED:
            handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(answer.content)))
    handler.end_headers()
    handler.wfile.write(answer.content)


class LocalServer:
    """``handler_class`` served on 127.0.0.1 and a free port, in a thread, until ``close()``."""

    def __init__(self, handler_class: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
