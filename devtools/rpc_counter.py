"""Count the Datastore RPCs an NDB client sends, on the wire (a gRPC interceptor).

Used by the benchmark and by the test that holds the RPC budget.  It
observes real calls to the real emulator; nothing is faked.
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time

import grpc
from google.cloud import ndb
from google.cloud.datastore_v1.services.datastore.transports import grpc as datastore_grpc


class RpcCounter(grpc.UnaryUnaryClientInterceptor):
    """Counts calls by method, and keeps when each was sent and answered.

    The times give ``sequential_round_trips``: how many calls had to wait
    for one another, which is what a request pays per round trip of latency.
    """

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.spans: list[list[float]] = []  # [sent, answered] per call, answered = inf while in flight
        # What Datastore bills: an entity read per key a lookup answers (found or
        # missing: the conservative count), a write per put, a delete per delete.
        self.entities: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation, client_call_details, request):
        name = client_call_details.method.rsplit("/", 1)[-1]
        span = [time.monotonic(), math.inf]
        with self._lock:
            self.calls[name] += 1
            self.spans.append(span)
        outcome = continuation(client_call_details, request)

        def answered(call):
            span[1] = time.monotonic()
            if call.exception() is not None:
                return  # a refused commit (an insert of a key that exists, say) wrote nothing
            response = call.result()
            with self._lock:
                if name == "Lookup":
                    self.entities["reads"] += len(response.found) + len(response.missing)
                elif name == "Commit":
                    results = list(response.mutation_results) or [None] * len(request.mutations)
                    for mutation, result in zip(request.mutations, results, strict=True):
                        if result is not None and result.conflict_detected:
                            continue  # not applied
                        self.entities["deletes" if "delete" in mutation else "writes"] += 1

        outcome.add_done_callback(answered)
        return outcome

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.spans.clear()
            self.entities.clear()

    def billed(self) -> dict[str, int]:
        """Entity reads, writes and deletes since the last reset."""
        with self._lock:
            return {kind: self.entities[kind] for kind in ("reads", "writes", "deletes")}

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for _, answered in self.spans if answered == math.inf)

    def wait_until_idle(self, timeout: float = 10) -> None:
        """Until every call sent has its answer (a rollback sent without waiting, say)."""
        deadline = time.monotonic() + timeout
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.005)

    def sequential_round_trips(self, until: float = math.inf) -> int:
        """The longest chain of calls each sent after the one before was answered.

        Calls in flight together count once: this is the number of round trip
        latencies the calls cost end to end.  Exact when each round trip takes
        long against the time between sends (``devtools.latency_proxy``);
        on loopback two calls sent together can look sequential.
        """
        with self._lock:  # ``until``: only calls answered by then (a response's path, not what follows it)
            spans = sorted((tuple(span) for span in self.spans if span[1] <= until), key=lambda span: span[1])
        chain, last_answered = 0, -math.inf
        for sent, answered in spans:  # earliest answer first: the longest chain (interval scheduling)
            if sent >= last_answered:
                chain, last_answered = chain + 1, answered
        return chain

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.calls)


def counting_client(project: str, emulator_host: str | None = None) -> tuple[ndb.Client, RpcCounter]:
    """An ndb.Client whose every RPC is counted (emulator or production alike).

    ``emulator_host``: reach the emulator there (a ``devtools.latency_proxy``
    in front of it, say) instead of at DATASTORE_EMULATOR_HOST.
    """
    counter = RpcCounter()
    return intercepted_client(project, counter, emulator_host), counter


def intercepted_client(
    project: str, interceptor: grpc.UnaryUnaryClientInterceptor, emulator_host: str | None = None
) -> ndb.Client:
    """An ndb.Client whose every RPC passes through ``interceptor`` on its way to Datastore."""
    if emulator_host is None:
        client = ndb.Client(project=project)
    else:  # ndb.Client reads the emulator's address from the environment, once
        saved = os.environ.get("DATASTORE_EMULATOR_HOST")
        os.environ["DATASTORE_EMULATOR_HOST"] = emulator_host
        try:
            client = ndb.Client(project=project)
        finally:
            if saved is None:
                os.environ.pop("DATASTORE_EMULATOR_HOST")
            else:
                os.environ["DATASTORE_EMULATOR_HOST"] = saved
    channel = grpc.intercept_channel(client.stub.grpc_channel, interceptor)
    client.stub = datastore_grpc.DatastoreGrpcTransport(
        host=client.host, credentials=client._credentials, channel=channel
    )
    return client
