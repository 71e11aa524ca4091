"""Caller verification, defence in depth beside app.yaml's ``login: admin``.

``X-CloudScheduler-*`` headers prove nothing (anyone can send them), so a
request is served only on evidence its sender cannot forge, read by the
modes DEDUP_AUTH lists (one or more, e.g. ``appengine,iap``), one module each:

- ``appengine`` (``appengine.py``): markers that App Engine itself sets (cron,
  task queues, the internal source IPs of Scheduler, Cloud Tasks and cron), on
  a request with no signed-in user (a 403 beside one), and the admin signed in
  behind ``login: admin``;
- ``iap`` (``iap.py``): the ``X-Goog-IAP-JWT-Assertion`` Identity-Aware Proxy signs (ES256);
- ``oidc`` (``oidc.py``): a Google-signed ID token, as Cloud Scheduler HTTP targets send;
- ``none`` (``none.py``): local development only; refused on App Engine.

Off App Engine (``GAE_ENV`` other than ``standard``: unset, or ``localdev``
under dev_appserver) nothing strips client-sent ``X-Appengine-*`` headers, so
while ``none`` or ``appengine`` is among the modes only requests addressed to
a loopback ``Host`` are served (``LoopbackRule``).

Each mode is one class (``verifier.Verifier``) that checks its own settings
(settings.py reads their variables with every other setting) and turns a
request's headers into a ``Principal`` (or nothing), listed once in
``gate.VERIFIERS``; ``handlers.access`` decides what the principal may do.  No
or bad credentials are a 401, a principal without the role a 403, with fixed
messages that echo neither the token nor the configuration.

Everything is importable from ``handlers.auth``, as it was from one module.
"""

from dedup.callers import DEFAULT_CERTS_URL, GOOGLE_ISSUERS, ID_TOKEN, MISSING_TOKEN, UNVERIFIED_EMAIL, WRONG_ISSUER
from handlers.auth.appengine import APPENGINE_MARKERS, OFF_APP_ENGINE_SETTING, OFF_APP_ENGINE_VALUE, AppEngineMarkers
from handlers.auth.gate import (
    DIFFERENT_PEOPLE,
    IPV6_LOOPBACK,
    MODES,
    NOT_LOOPBACK,
    PRODUCTION_GAE_ENV,
    UNTRUSTED_HEADERS,
    VERIFIERS,
    Admission,
    AuthSettings,
    CallerGate,
    LoopbackRule,
    Rejection,
    is_loopback_host,
    mode_names,
)
from handlers.auth.iap import (
    DEFAULT_IAP_CERTS_URL,
    IAP_ASSERTION,
    IAP_AUDIENCE_SHAPE,
    IAP_HEADER,
    IAP_ISSUER,
    IAP_NO_EMAIL,
    IAP_WRONG_ISSUER,
    IapAssertions,
)
from handlers.auth.none import AnyCaller
from handlers.auth.oidc import GoogleIdTokens
from handlers.auth.verifier import AuthConfigError, RequestHeaders, Selection, Verifier

__all__ = [
    "APPENGINE_MARKERS",
    "DEFAULT_CERTS_URL",
    "DEFAULT_IAP_CERTS_URL",
    "DIFFERENT_PEOPLE",
    "GOOGLE_ISSUERS",
    "IAP_ASSERTION",
    "IAP_AUDIENCE_SHAPE",
    "IAP_HEADER",
    "IAP_ISSUER",
    "IAP_NO_EMAIL",
    "IAP_WRONG_ISSUER",
    "ID_TOKEN",
    "IPV6_LOOPBACK",
    "MISSING_TOKEN",
    "MODES",
    "NOT_LOOPBACK",
    "OFF_APP_ENGINE_SETTING",
    "OFF_APP_ENGINE_VALUE",
    "PRODUCTION_GAE_ENV",
    "UNTRUSTED_HEADERS",
    "UNVERIFIED_EMAIL",
    "VERIFIERS",
    "WRONG_ISSUER",
    "Admission",
    "AnyCaller",
    "AppEngineMarkers",
    "AuthConfigError",
    "AuthSettings",
    "CallerGate",
    "GoogleIdTokens",
    "IapAssertions",
    "LoopbackRule",
    "Rejection",
    "RequestHeaders",
    "Selection",
    "Verifier",
    "is_loopback_host",
    "mode_names",
]
