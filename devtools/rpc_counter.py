"""Count the Datastore RPCs an NDB client sends, on the wire (a gRPC interceptor).

Used by the benchmark and by the test that holds the RPC budget.  It
observes real calls to the real emulator; nothing is faked.
"""

from __future__ import annotations

import collections
import threading

import grpc
from google.cloud import ndb
from google.cloud.datastore_v1.services.datastore.transports import grpc as datastore_grpc


class RpcCounter(grpc.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation, client_call_details, request):
        name = client_call_details.method.rsplit("/", 1)[-1]
        with self._lock:
            self.calls[name] += 1
        return continuation(client_call_details, request)

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.calls)


def counting_client(project: str) -> tuple[ndb.Client, RpcCounter]:
    """An ndb.Client whose every RPC is counted (emulator or production alike)."""
    counter = RpcCounter()
    return intercepted_client(project, counter), counter


def intercepted_client(project: str, interceptor: grpc.UnaryUnaryClientInterceptor) -> ndb.Client:
    """An ndb.Client whose every RPC passes through ``interceptor`` on its way to Datastore."""
    client = ndb.Client(project=project)
    channel = grpc.intercept_channel(client.stub.grpc_channel, interceptor)
    client.stub = datastore_grpc.DatastoreGrpcTransport(
        host=client.host, credentials=client._credentials, channel=channel
    )
    return client
