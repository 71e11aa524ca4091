"""Commits that land but whose answer is lost: a gRPC interceptor.

Datastore documents that a commit reported as failed (UNAVAILABLE, DEADLINE_EXCEEDED,
...) may still have been applied.  This lets the real commit reach the real
emulator, waits for it to be applied, and then reports an error to NDB.
"""

from __future__ import annotations

import threading

import grpc


class LostCommitAnswers(grpc.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._to_lose = 0
        self._code = grpc.StatusCode.UNAVAILABLE
        self.lost = 0

    def lose_next_commits(self, count: int = 1, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        with self._lock:
            self._to_lose, self._code = count, code

    def intercept_unary_unary(self, continuation, client_call_details, request):
        call = continuation(client_call_details, request)
        if not client_call_details.method.endswith("/Commit"):
            return call
        with self._lock:
            if self._to_lose <= 0:
                return call
            self._to_lose -= 1
            code = self._code
        call.result()  # the commit is applied
        with self._lock:
            self.lost += 1
        return FailedCall(code, "the commit was applied; its answer was lost (injected)")


class FailedCall(grpc.RpcError, grpc.Call, grpc.Future):
    """A finished call that failed, as gRPC hands one to NDB."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def initial_metadata(self):
        return ()

    def trailing_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def add_callback(self, callback):
        return False

    def cancel(self):
        return False

    def cancelled(self):
        return False

    def running(self):
        return False

    def done(self):
        return True

    def result(self, timeout=None):
        raise self

    def exception(self, timeout=None):
        return self

    def traceback(self, timeout=None):
        return None

    def add_done_callback(self, fn):
        fn(self)
