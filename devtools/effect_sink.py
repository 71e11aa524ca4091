"""The downstream the simulations call: it applies a side effect per call, and counts them by key.

Also the fault rates a simulation plays (``Faults``), some of which the sink itself injects:
slow effects and transient failures.
"""

from __future__ import annotations

import collections
import dataclasses
import http.server
import random
import threading
import time


@dataclasses.dataclass
class Faults:
    duplicates: float = 0.3  # an extra concurrent delivery of an attempt
    lost_acks: float = 0.1  # a 2xx that never reaches Scheduler
    slow: float = 0.1  # the side effect outlasts the attempt deadline
    transient: float = 0.1  # the side effect fails with a 503 (the job's retryable failure)
    worker_kills: float = 0.05  # per execution: a gunicorn worker is SIGKILLed at a random moment
    outages: float = 0.05  # per execution: never delivered (the job paused, the app down past the retries)


class EffectSink:
    """The downstream: applies a side effect per call, sometimes slowly, sometimes failing.

    ``calls`` counts the calls that applied an effect, per Idempotency-Key.
    ``effects`` counts what the downstream keeps when it deduplicates on that
    key, as docs/jobs.md asks the most downstream service to: a second call
    with a key happens only when an attempt died after the effect and before
    it could record it (a killed worker), and the key absorbs it.
    """

    def __init__(self, faults: Faults, slow_seconds: float, rng: random.Random) -> None:
        self.effects: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.refused: set[str] = set()  # keys answered 422, nothing applied: the job's permanent failure
        self.received: collections.Counter[str] = collections.Counter()  # every call, applied or not
        self.lock = threading.Lock()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key", "")
                with sink.lock:
                    roll = rng.random()
                    sink.received[key] += 1
                if key in sink.refused:
                    status = 422
                elif roll < faults.transient:
                    status = 503  # nothing applied; the job's retryable failure
                else:
                    if roll < faults.transient + faults.slow:
                        time.sleep(slow_seconds)
                    with sink.lock:
                        sink.calls[key] += 1
                        sink.effects[key] = 1
                    status = 200
                body = b"{}"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/effect"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
