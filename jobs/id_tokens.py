"""ID tokens for the app's outgoing calls: one per audience, fetched as the app's service account.

google-auth's ``fetch_id_token`` finds the app's identity (on App Engine, the metadata server;
elsewhere a service account key file named by GOOGLE_APPLICATION_CREDENTIALS) and asks it for
a token for one audience.  Each fetch is a round trip, so a token is kept per audience until
shortly before it expires (google-auth's refresh threshold, under four minutes before ``exp``),
and shared by every thread.  A fetch holds only its own audience's lock, and it spends the
call's time: it never runs past the deadline of the call it is for.  Tokens are never logged
or stored: only the audience is named in an error.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import google.auth.exceptions
import google.auth.transport.requests
import google.oauth2.id_token

from dedup.errors import RetryableJobError


class IdTokens:
    """The process's ID tokens, by audience."""

    def __init__(self) -> None:
        self._locks_lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}  # audience -> the lock its fetches take
        self._credentials: dict[str, Any] = {}  # audience -> google-auth ID token credentials

    def token(self, audience: str, deadline: float) -> tuple[str, bool]:
        """A token for ``audience`` that is not about to expire, and whether it was fetched just now
        (not kept); RetryableJobError if none can be had before ``deadline`` (``time.monotonic()``):
        a missing identity or an unreachable metadata server is fixed by a deploy or by waiting."""
        lock = self._lock_of(audience)
        if not lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise RetryableJobError(f"no ID token for the audience {audience!r} in time: another call is fetching it")
        try:
            request = _CappedRequest(deadline)
            credentials = self._credentials.get(audience)
            if credentials is None:
                credentials = google.oauth2.id_token.fetch_id_token_credentials(  # type: ignore[no-untyped-call]
                    audience, request
                )
                self._credentials[audience] = credentials
            if credentials.valid:
                return str(credentials.token), False
            credentials.refresh(request)
            return str(credentials.token), True
        except (google.auth.exceptions.GoogleAuthError, ValueError) as exc:
            self._credentials.pop(audience, None)
            raise RetryableJobError(f"no ID token for the audience {audience!r}: {_reason(exc)}") from None
        finally:
            lock.release()

    def forget(self, audience: str) -> None:
        """Drop ``audience``'s token: the service refused it (a 401), so the next call fetches anew."""
        self._credentials.pop(audience, None)

    def clear(self) -> None:
        """Forget every token (tests start without any)."""
        self._credentials.clear()

    def _lock_of(self, audience: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(audience, threading.Lock())


class _CappedRequest(google.auth.transport.requests.Request):
    """google-auth's transport, each request's timeout cut to the time left before ``deadline``."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline

    def __call__(
        self, url: str, method: str = "GET", body: Any = None, headers: Any = None, timeout: Any = None, **kwargs: Any
    ) -> Any:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise google.auth.exceptions.TransportError(  # type: ignore[no-untyped-call]
                "the call's time ran out before its ID token came"
            )
        capped = min(timeout, left) if timeout else left
        return super().__call__(url, method, body, headers, capped, **kwargs)  # type: ignore[no-untyped-call]


def _reason(exc: BaseException) -> str:
    """What failed, in google-auth's words: the first text among the (nested) exception's arguments,
    without the response objects it carries beside it."""
    while exc.args and isinstance(exc.args[0], BaseException):
        exc = exc.args[0]
    return exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)


# One cache for the process: every http job's calls share its tokens.
ID_TOKENS = IdTokens()
