"""A stand-in for Cloud Logging as App Engine fills it and ``entries.list`` reads it.

- ``stdout``: an app's JSON line as the logging agent turns it into a LogEntry (``severity``,
  ``time``, ``httpRequest`` and the ``logging.googleapis.com/*`` fields promoted out of
  ``jsonPayload``, the rest left in it);
- ``request_log``: the line App Engine's front end writes for every request, refused ones
  included (``protoPayload`` of type ``google.appengine.logging.v1.RequestLog``);
- ``entries_list``: ``POST /v2/entries:list`` with ``resourceNames``, ``filter``, ``orderBy``,
  ``pageSize`` and ``pageToken``, the filter in a subset of the Logging query language: comparisons
  (``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``:``, ``=~``, ``!~``) on dotted field paths, ``AND``
  (or juxtaposition), ``OR``, ``NOT`` and parentheses, with the language's precedence (``NOT``,
  then ``OR``, then ``AND``); anything else is refused with 400, as a filter the real API cannot
  parse is.

GoogleFakes (devtools/google_fakes.py) serves it beside the other APIs.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import threading
from collections.abc import Callable
from typing import Any

REQUEST_LOG = "appengine.googleapis.com%2Frequest_log"
REQUEST_LOG_TYPE = "type.googleapis.com/google.appengine.logging.v1.RequestLog"
APP_ENGINE_USER_AGENT = "AppEngine-Google; (+http://code.google.com/appengine)"
# What the agent lifts out of a JSON line into the LogEntry's own fields.
PROMOTED = {
    "severity": "severity",
    "httpRequest": "httpRequest",
    "logging.googleapis.com/trace": "trace",
    "logging.googleapis.com/spanId": "spanId",
    "logging.googleapis.com/trace_sampled": "traceSampled",
    "logging.googleapis.com/sourceLocation": "sourceLocation",
    "logging.googleapis.com/labels": "labels",
    "logging.googleapis.com/insertId": "insertId",
}
_RESOURCE = re.compile(r"(projects|organizations|folders|billingAccounts)/[^/]+")
TIMESTAMP_FIELDS = frozenset({"timestamp", "receiveTimestamp"})
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50

Entry = dict[str, Any]
Match = Callable[[Entry], bool]


class CloudLogging:
    """The entries of every project, as App Engine writes them; read by ``entries_list``."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()

    def write(self, entry: Entry) -> Entry:
        with self._lock:
            entry.setdefault("insertId", f"fake-{next(self._ids):06d}")
            entry.setdefault("receiveTimestamp", _now())
            self.entries.append(entry)
        return entry

    def stdout(self, project: str, service: str, line: str, version: str = "v1") -> Entry:
        """One line an App Engine app printed: JSON becomes ``jsonPayload``, anything else ``textPayload``."""
        entry: Entry = {"logName": f"projects/{project}/logs/stdout", "resource": _gae_app(project, service, version)}
        try:
            payload = json.loads(line)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return self.write({**entry, "timestamp": _now(), "textPayload": line})
        for field, promoted in PROMOTED.items():
            if field in payload:
                entry[promoted] = payload.pop(field)
        when = payload.pop("time", None) or payload.pop("timestamp", None)
        entry["timestamp"] = _rfc3339(_instant(when)) if isinstance(when, str) else _now()
        return self.write({**entry, "jsonPayload": payload})

    def request_log(
        self,
        project: str,
        service: str,
        method: str,
        resource: str,
        status: int,
        ip: str = "0.1.0.2",
        version: str = "v1",
    ) -> Entry:
        """App Engine's own line for a request (``resource``: its path and query), whoever answered it."""
        now = _now()
        return self.write(
            {
                "logName": f"projects/{project}/logs/{REQUEST_LOG}",
                "resource": _gae_app(project, service, version),
                "timestamp": now,
                "severity": "WARNING" if status >= 400 else "INFO",
                "httpRequest": {"requestMethod": method, "status": status, "userAgent": APP_ENGINE_USER_AGENT},
                "protoPayload": {
                    "@type": REQUEST_LOG_TYPE,
                    "appId": f"s~{project}",
                    "moduleId": service,
                    "versionId": version,
                    "startTime": now,
                    "endTime": now,
                    "method": method,
                    "resource": resource,
                    "status": status,
                    "ip": ip,
                    "userAgent": APP_ENGINE_USER_AGENT,
                    "host": f"{service}-dot-{project}.appspot.com",
                },
            }
        )

    def entries_list(self, body: Any) -> tuple[int, dict[str, Any]]:
        """``entries.list``: (HTTP status, the response or an error body)."""
        if not isinstance(body, dict):
            return _invalid("the request body must be a JSON object")
        names = body.get("resourceNames")
        if not isinstance(names, list) or not names or not all(_resource_name(n) for n in names):
            return _invalid("resourceNames must name at least one resource (projects/PROJECT_ID, ...)")
        try:
            match = parse_filter(body.get("filter") or "")
        except ValueError as exc:
            return _invalid(f"Unparseable filter: {exc}")
        order = body.get("orderBy") or "timestamp asc"
        if order not in ("timestamp asc", "timestamp desc"):
            return _invalid(f"invalid orderBy {order!r}")
        size = body.get("pageSize") or DEFAULT_PAGE_SIZE
        token = body.get("pageToken") or "0"
        if not isinstance(size, int) or not 0 < size <= MAX_PAGE_SIZE or not str(token).isdigit():
            return _invalid("invalid pageSize or pageToken")
        with self._lock:
            entries = list(self.entries)
        found = sorted(
            (e for e in entries if any(e["logName"].startswith(f"{n}/logs/") for n in names) and match(e)),
            key=lambda e: _instant(e["timestamp"]),
            reverse=order.endswith("desc"),
        )
        start = int(token)
        page: dict[str, Any] = {"entries": found[start : start + size]} if found[start : start + size] else {}
        if start + size < len(found):
            page["nextPageToken"] = str(start + size)
        return 200, page


def _gae_app(project: str, service: str, version: str) -> dict[str, Any]:
    return {
        "type": "gae_app",
        "labels": {"project_id": project, "module_id": service, "version_id": version, "zone": "us16"},
    }


def _resource_name(name: Any) -> bool:
    return isinstance(name, str) and _RESOURCE.fullmatch(name) is not None


def _invalid(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}


def _now() -> str:
    return _rfc3339(datetime.datetime.now(datetime.UTC))


def _rfc3339(instant: datetime.datetime) -> str:
    return instant.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


def _instant(text: str) -> datetime.datetime:
    instant = datetime.datetime.fromisoformat(text)
    return instant if instant.tzinfo else instant.replace(tzinfo=datetime.UTC)


# -- the query language ----------------------------------------------------------------------

_TOKEN = re.compile(
    r'\s*(?:(?P<open>\()|(?P<close>\))|"(?P<quoted>(?:[^"\\]|\\.)*)"'
    r"|(?P<op>>=|<=|!=|=~|!~|=|>|<|:)|(?P<word>[^\s()\"=<>!:]+))"
)
_KEYWORDS = frozenset({"AND", "OR", "NOT"})


def parse_filter(text: str) -> Match:
    """The filter as a predicate on an entry; ValueError for what this subset cannot parse."""
    tokens = _tokens(text)
    if not tokens:
        return lambda entry: True
    match, rest = _conjunction(tokens)
    if rest:
        raise ValueError(f"unexpected {rest[0][1]!r}")
    return match


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while text[position:].strip():
        found = _TOKEN.match(text, position)
        if found is None or found.lastgroup is None:
            raise ValueError(f"cannot read {text[position:].strip()[:20]!r}")
        kind, value = found.lastgroup, found[found.lastgroup]
        if kind == "word" and value in _KEYWORDS:
            kind = value
        if kind == "quoted":
            value = re.sub(r"\\(.)", r"\1", value)
        tokens.append((kind, value))
        position = found.end()
    return tokens


Tokens = list[tuple[str, str]]


def _conjunction(tokens: Tokens) -> tuple[Match, Tokens]:
    """AND binds loosest; two terms side by side are an AND too."""
    parts = []
    while True:
        part, tokens = _disjunction(tokens)
        parts.append(part)
        if tokens and tokens[0][0] == "AND":
            tokens = tokens[1:]
        elif not tokens or tokens[0][0] == "close":
            return (lambda entry: all(p(entry) for p in parts)), tokens


def _disjunction(tokens: Tokens) -> tuple[Match, Tokens]:
    parts = []
    part, tokens = _unary(tokens)
    parts.append(part)
    while tokens and tokens[0][0] == "OR":
        part, tokens = _unary(tokens[1:])
        parts.append(part)
    return (lambda entry: any(p(entry) for p in parts)), tokens


def _unary(tokens: Tokens) -> tuple[Match, Tokens]:
    if not tokens:
        raise ValueError("the filter ends where a term was expected")
    kind, value = tokens[0]
    if kind == "NOT" or (kind == "word" and value == "-"):
        inner, rest = _unary(tokens[1:])
        return (lambda entry: not inner(entry)), rest
    if kind == "open":
        inner, rest = _conjunction(tokens[1:])
        if not rest or rest[0][0] != "close":
            raise ValueError("a parenthesis is not closed")
        return inner, rest[1:]
    if kind == "word" and len(tokens) >= 3 and tokens[1][0] == "op" and tokens[2][0] in ("quoted", "word"):
        return _comparison(value, tokens[1][1], tokens[2][1]), tokens[3:]
    raise ValueError(f"expected a comparison (FIELD OPERATOR VALUE) at {value!r}")


def _comparison(path: str, operator: str, wanted: str) -> Match:
    if not re.fullmatch(r"[A-Za-z_@][\w@]*(?:\.[A-Za-z_@][\w@]*)*", path):
        raise ValueError(f"{path!r} is not a field path this stand-in reads")
    steps = path.split(".")

    def match(entry: Entry) -> bool:
        value: Any = entry
        for step in steps:
            value = value.get(step) if isinstance(value, dict) else None
        if value is None or isinstance(value, (dict, list)):
            return False  # a comparison with an absent field is false
        return _compare(value, operator, wanted, steps[-1] in TIMESTAMP_FIELDS)

    return match


def _compare(value: Any, operator: str, wanted: str, timestamp: bool) -> bool:
    if operator == ":":
        return wanted.lower() in _text(value).lower()
    if operator in ("=~", "!~"):
        return (re.search(wanted, _text(value)) is not None) == (operator == "=~")
    left: Any
    right: Any
    if timestamp:
        left, right = _instant(str(value)), _instant(wanted)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and _is_number(wanted):
        left, right = value, float(wanted)
    else:
        left, right = _text(value), wanted
    return {
        "=": left == right,
        "!=": left != right,
        "<": left < right,
        "<=": left <= right,
        ">": left > right,
        ">=": left >= right,
    }[operator]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
