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


class FaultProxy:
    """Forwards to the app; ``plan`` says what to do with each next POST: "drop" (forward,
    then close without answering: the app did the work, the answer is lost), "503" (a front
    end refusing without forwarding), or nothing (forward).  GETs are forwarded as they are.
    ``received`` holds each POST's path and headers, and ``answered`` the app's status for it."""

    def __init__(self, target: str) -> None:
        self.target, self.plan, self.seen = target, [], []
        self.received: list[tuple[str, dict[str, str]]] = []
        self.answered: list[tuple[str, int]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                relay(self, requests.get(proxy.target + self.path, headers=headers, timeout=60))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                step = proxy.plan.pop(0) if proxy.plan else "pass"
                proxy.seen.append(step)
                proxy.received.append((self.path, dict(self.headers.items())))
                if step == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = requests.post(proxy.target + self.path, data=body, headers=headers, timeout=60)
                proxy.answered.append((self.path, answer.status_code))
                if step == "drop":
                    self.close_connection = True
                    return  # the run happened; its answer never reaches the client
                relay(self, answer)

        self.local = LocalServer(Handler)
        self.url = self.local.url

    def close(self) -> None:
        self.local.close()
