"""ID tokens for the app's outgoing calls: one per audience, fetched as the app's service account.

google-auth's ``fetch_id_token`` finds the app's identity (on App Engine, the metadata server;
elsewhere a service account key file named by GOOGLE_APPLICATION_CREDENTIALS) and asks it for
a token for one audience.  Each fetch is a round trip, so a token is kept per audience until
shortly before it expires (google-auth's refresh threshold, under four minutes before ``exp``),
and shared by every thread.  Tokens are never logged or stored: only the audience is named in an
error.
"""

from __future__ import annotations

import threading
from typing import Any

import google.auth.exceptions
import google.auth.transport.requests
import google.oauth2.id_token

from dedup.errors import RetryableJobError


class IdTokens:
    """The process's ID tokens, by audience."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._credentials: dict[str, Any] = {}  # audience -> google-auth ID token credentials
        self.fetches = 0  # tokens fetched, for tests and the bench: a second call should not fetch

    def token(self, audience: str) -> str:
        """A token for ``audience`` that is not about to expire; RetryableJobError if none can be had
        (a missing identity or an unreachable metadata server is fixed by a deploy or by waiting)."""
        with self._lock:
            try:
                credentials = self._credentials.get(audience)
                if credentials is None:
                    credentials = google.oauth2.id_token.fetch_id_token_credentials(  # type: ignore[no-untyped-call]
                        audience, _request()
                    )
                    self._credentials[audience] = credentials
                if not credentials.valid:
                    credentials.refresh(_request())
                    self.fetches += 1
                return str(credentials.token)
            except (google.auth.exceptions.GoogleAuthError, ValueError) as exc:
                self._credentials.pop(audience, None)
                raise RetryableJobError(f"no ID token for the audience {audience!r}: {_reason(exc)}") from None

    def clear(self) -> None:
        """Forget every token (tests start without any)."""
        with self._lock:
            self._credentials.clear()
            self.fetches = 0

    def forget(self, audience: str) -> None:
        """Drop ``audience``'s token: the service refused it (a 401), so the next call fetches anew."""
        with self._lock:
            self._credentials.pop(audience, None)


def _reason(exc: BaseException) -> str:
    """What failed, in google-auth's words: the first text among the (nested) exception's arguments,
    without the response objects it carries beside it."""
    while exc.args and isinstance(exc.args[0], BaseException):
        exc = exc.args[0]
    return exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)


def _request() -> google.auth.transport.requests.Request:
    return google.auth.transport.requests.Request()


# One cache for the process: every http job's calls share its tokens.
ID_TOKENS = IdTokens()
