"""What a request may be before any view sees it: one body limit, one HEAD rule, one value per parameter.

Werkzeug enforces ``MAX_CONTENT_LENGTH`` against ``Content-Length`` only; a
chunked body (no length) is cut silently at the limit, and a job would run
on the truncated body.  So a chunked body is read here, up to one byte past
the limit, and then presented with its length like any other: every route
answers 413 for every body over the limit, however it was sent, before
anything runs or is written.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, current_app, request
from werkzeug import exceptions as http_errors
from werkzeug.exceptions import BadRequest, MethodNotAllowed, RequestEntityTooLarge

import jobs.base

# Larger bodies than Cloud Scheduler can send are refused with 413.
MAX_BODY_BYTES = jobs.base.MAX_BODY_BYTES
_READ_CHUNK = 64 * 1024
# Why a body sent without Content-Length was not read (the request is refused).
UNREAD_BODY = "dedup.unread_body"


class BodyLimitMiddleware:
    """Give a body sent without Content-Length (chunked) a length, reading at most ``limit + 1`` bytes.

    Over the limit, only the first ``limit + 1`` bytes are kept and the
    length says so, so the app's check refuses the request (413) whatever
    the rest of the stream holds.
    """

    def __init__(self, wsgi_app: Callable[..., Iterable[bytes]], limit: int) -> None:
        self.wsgi_app = wsgi_app
        self.limit = limit

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not environ.get("CONTENT_LENGTH") and "wsgi.input_terminated" in environ:
            coding = environ.get("HTTP_TRANSFER_ENCODING", "").strip().lower()
            body = b""
            if coding not in ("", "chunked"):
                # The server de-chunks but decodes nothing else: a job would run on gzip bytes.
                environ[UNREAD_BODY] = (
                    501,
                    f"the transfer coding {coding!r} is not supported; send the body "
                    "as it is, with Content-Length or chunked",
                )
            else:
                try:
                    body = self._read_head(environ["wsgi.input"])
                except Exception:  # a malformed chunk, a client gone: the caller's stream
                    environ[UNREAD_BODY] = (400, "the request body could not be read (malformed chunked encoding)")
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
            # The body is de-chunked now: its length is the truth werkzeug reads by
            # (werkzeug ignores Content-Length beside Transfer-Encoding: chunked).
            del environ["wsgi.input_terminated"]
            environ.pop("HTTP_TRANSFER_ENCODING", None)
        return self.wsgi_app(environ, start_response)

    def _read_head(self, stream: Any) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while size <= self.limit:
            chunk = stream.read(min(_READ_CHUNK, self.limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)


def limit_requests(app: Flask, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Install the rules on ``app`` (the scheduler target, or any app using the guard).

    Register it after caller verification, so an unauthenticated request
    learns nothing more than 401/403.
    """
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    # Flask's documented hook for WSGI middleware, typed as a method.
    app.wsgi_app = BodyLimitMiddleware(app.wsgi_app, max_body_bytes)  # type: ignore[method-assign]
    app.before_request(refuse_unservable_requests)


def refuse_unservable_requests() -> None:
    """405 for HEAD, 413 for a body over the limit, 400 for a query parameter given twice;
    400 or 501 for a body that could not be read as sent."""
    if request.routing_exception is not None:
        return  # no such route (404) or method (405): routing says so
    unread = request.environ.get(UNREAD_BODY)
    if unread is not None:
        status, message = unread
        raise (http_errors.NotImplemented if status == 501 else BadRequest)(message)
    if request.method == "HEAD":
        # Flask answers HEAD for GET routes by running the view; a HEAD must never do work.
        # Every method the path serves, over all its rules (a confirmation's GET beside its form's POST).
        served = current_app.url_map.bind_to_environ(request.environ).allowed_methods()
        raise MethodNotAllowed(valid_methods=sorted(set(served) - {"HEAD", "OPTIONS"}))
    limit = request.max_content_length
    if limit is not None and (request.content_length or 0) > limit:
        raise RequestEntityTooLarge(f"the request body is larger than {limit} bytes; nothing was run or written")
    for name in request.args:
        count = len(request.args.getlist(name))
        if count > 1:
            raise BadRequest(f"query parameter {name!r} is given {count} times; give it once")
