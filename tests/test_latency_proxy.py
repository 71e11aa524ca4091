"""The delaying proxy `make bench RTT_MS=N` puts between the app and the emulator: bytes pass
intact both ways, connections stay apart, half-closes pass on, and NDB works through it."""

from __future__ import annotations

import socket
import threading

import pytest
from google.cloud import ndb

from devtools.latency_proxy import DelayingProxy


class Echo:
    """A TCP server that sends back what it reads, prefixed with the connection's number, until EOF."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.count = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.count += 1
            threading.Thread(target=self._echo, args=(connection, self.count), daemon=True).start()

    def _echo(self, connection: socket.socket, number: int) -> None:
        with connection:
            received = b""
            while chunk := connection.recv(65536):
                received += chunk
            connection.sendall(f"{number}:".encode() + received)


def exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)  # the half-close must reach the server through the proxy
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("one_way_ms", [0, 5])
def test_bytes_pass_intact_both_ways_on_concurrent_connections(one_way_ms):
    echo = Echo()
    payloads = [bytes([i]) * (200_000 + i) for i in range(8)]  # several chunks each
    with DelayingProxy("127.0.0.1", echo.port, one_way_ms) as proxy:
        answers: dict[int, bytes] = {}
        threads = [
            threading.Thread(target=lambda i=i: answers.__setitem__(i, exchange(proxy.port, payloads[i])))
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert sorted(answers) == list(range(8))
    for i, answer in answers.items():
        number, _, body = answer.partition(b":")
        assert body == payloads[i] and int(number) >= 1
    assert len({answer.partition(b":")[0] for answer in answers.values()}) == 8  # eight connections
    echo.server.close()


def test_a_negative_delay_is_refused():
    with pytest.raises(ValueError):
        DelayingProxy("127.0.0.1", 1, -1)


def test_ndb_reaches_the_emulator_through_it(datastore, monkeypatch):
    host, port = datastore.host.rsplit(":", 1)

    class Probe(ndb.Model):
        value = ndb.IntegerProperty()

    with DelayingProxy(host, int(port), 2) as proxy:
        monkeypatch.setenv("DATASTORE_EMULATOR_HOST", proxy.host)
        client = ndb.Client(project=datastore.project)
        with client.context():
            key = Probe(value=7).put()
            assert key.get().value == 7
            assert ndb.transaction(lambda: key.get().value) == 7
