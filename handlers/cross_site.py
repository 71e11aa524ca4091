"""No cross-site requests: a signed-in browser must never be made to act by another site.

The rule of Go's ``net/http.CrossOriginProtection`` (2025), without tokens: a
request that may change something (any method but GET, HEAD, OPTIONS) is
refused when the browser says it is cross-site (``Sec-Fetch-Site`` present
and not ``same-origin`` or ``none``) or, from a browser that does not send
that header, when its ``Origin`` is not this host.  Servers, scripts and
Scheduler send neither header and are not affected.  A cross-site form can
still send ``text/plain`` without a CORS preflight, so views marked
``@json_body`` also require ``Content-Type: application/json``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, current_app, request
from werkzeug.exceptions import Forbidden, UnsupportedMediaType

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What Sec-Fetch-Site says of a request this app may act on: its own pages, or a person
# typing the URL or following a bookmark.
TRUSTED_FETCH_SITES = frozenset({"same-origin", "none"})


def json_body(view: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a view whose body is JSON: anything else (a cross-site form's text/plain) is 415."""
    view.json_body = True  # type: ignore[attr-defined]
    return view


def changes_state(view: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a view that does work even on GET (a cron target): the cross-site rule applies to it."""
    view.changes_state = True  # type: ignore[attr-defined]
    return view


def refuse_cross_site_requests(app: Flask) -> None:
    """Install the rule on ``app`` (after caller verification), and refuse every page to frames."""
    app.before_request(_refuse_cross_site)
    app.after_request(_refuse_framing)


def _refuse_framing(response: Response) -> Response:
    """No page of this app may be framed by another (clickjacking): a confirmation page framed
    under a decoy would make a signed-in operator's click a same-origin POST, which the rule
    above lets through.  CSP's ``frame-ancestors`` for current browsers, X-Frame-Options for old."""
    response.headers.setdefault("Content-Security-Policy", "frame-ancestors 'none'")
    response.headers.setdefault("X-Frame-Options", "DENY")
    return response


def cross_site_problem(method: str, headers: Any, host: str) -> str | None:
    """Why this request is cross-site, or None (pure: the headers and Host it came with)."""
    if method.upper() in SAFE_METHODS:
        return None
    fetch_site = headers.get("Sec-Fetch-Site")
    if fetch_site is not None:
        if fetch_site.strip().lower() in TRUSTED_FETCH_SITES:
            return None
        return "the browser says this request comes from another site (Sec-Fetch-Site); it is refused"
    origin = headers.get("Origin")
    if origin is not None and _origin_host(origin) != _without_default_port(host):
        return "this request comes from another origin (Origin is not this host); it is refused"
    return None


def _origin_host(origin: str) -> str | None:
    """host[:port] of an Origin header (brackets of an IPv6 address kept, userinfo dropped);
    None for "null" (an opaque origin) or anything malformed."""
    try:
        parsed = urllib.parse.urlsplit(origin.strip().lower())
    except ValueError:
        return None
    netloc = parsed.netloc.rpartition("@")[2]
    if parsed.scheme not in ("http", "https") or not netloc:
        return None
    return _without_default_port(netloc)


def _without_default_port(host: str) -> str:
    """As Go compares hosts: an explicit :80 or :443 names the same host as none."""
    host = host.strip().lower()
    for port in (":80", ":443"):
        if host.endswith(port):
            return host[: -len(port)]
    return host


def _refuse_cross_site() -> None:
    if request.routing_exception is not None:
        return  # no such route or method: routing answers
    view = current_app.view_functions.get(request.endpoint or "")
    # A GET that does work (the cleanup cron calls) is checked as any state-changing request.
    method = "POST" if getattr(view, "changes_state", False) else request.method
    problem = cross_site_problem(method, request.headers, request.headers.get("Host", request.host))
    if problem:
        raise Forbidden(problem)
    if (
        request.method not in SAFE_METHODS
        and getattr(view, "json_body", False)
        and request.mimetype != "application/json"
    ):
        raise UnsupportedMediaType(
            f"this endpoint takes Content-Type: application/json, not {request.mimetype or 'none'!r}"
        )
