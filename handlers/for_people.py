"""How the pages write times, durations and ids for a person (issue 25 §6).

Every time is absolute, with its zone, and relative to the page's moment ("3 min ago");
durations carry units; an id is shortened, with the whole of it a click away (and a copy
button on the run's own page).  The pages
get these as template globals (``install``); the API keeps RFC 3339 and seconds.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

from cron_descriptor import ExpressionDescriptor, Options
from flask import Flask
from markupsafe import Markup, escape

from handlers.links import link
from handlers.slot_statuses import STATUS_STYLESHEET
from handlers.state import app_state


def span(seconds: float) -> str:
    """A duration as a person reads it: 42 ms, 5.5 s, 12 s, 3 min 5 s, 2 h 4 min, 3 d 2 h."""
    if seconds < 0:
        return "-" + span(-seconds)
    if 0 < seconds < 0.0005:
        return "< 1 ms"
    if 0 < seconds and (ms := int(seconds * 1000 + 0.5)) < 1000:  # half up, not to even
        return f"{ms} ms"
    if seconds < 10:
        return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:.1f} s".replace(".0 s", " s")
    whole = round(seconds)
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if whole >= size:
            first, rest = divmod(whole, size)
            rest //= smaller_size
            return f"{first} {unit}" + (f" {rest} {smaller}" if rest else "")
    return f"{whole} s"


def spelled(seconds: float) -> str:
    """A setting's duration in words, as a confirmation says it: "1 day", "2 days 3 hours", "90 seconds"."""
    whole, parts = round(seconds), []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count} {unit}{'' if count == 1 else 's'}")
    return " ".join(parts[:2]) or "0 seconds"


def ago(instant: datetime.datetime, now: datetime.datetime) -> str:
    """``instant`` relative to ``now``: "3 min ago", "in 2 h", "now"."""
    delta = (now - instant).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"{span(abs(delta))} ago" if delta > 0 else f"in {span(-delta)}"


def when(value: str | datetime.datetime | None, zone: Any = None) -> Markup:
    """A time for a page: absolute to the second with its zone (UTC, or ``zone``), then relative to
    the page's moment; the machine's RFC 3339 form in ``datetime`` and the tooltip."""
    if value is None or value == "":
        return Markup("–")
    if isinstance(value, str):
        from dedup.keys import parse_rfc3339

        value = parse_rfc3339(value, "time")
    shown = value.astimezone(zone) if zone is not None else value.astimezone(datetime.UTC)
    label = shown.strftime("%Y-%m-%d %H:%M:%S ") + (shown.tzname() or "UTC")
    exact = value.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")
    relative = ago(value, app_state().clock.now())
    return Markup(
        f'<time datetime="{escape(exact)}">{escape(label)}</time> <span class="ago">({escape(relative)})</span>'
    )


def duration(seconds: float | None) -> str:
    return "–" if seconds is None else span(seconds)


def short_id(value: str, href: str, length: int = 12) -> Markup:
    """A link to ``href`` showing the first ``length`` characters of an id; the page it links to
    shows the whole id, with a button that copies it (a tooltip per row would cost the listing
    more than the page's size bound allows)."""
    return Markup(f'<a href="{escape(href)}"><code>{escape(value[:length])}…</code></a>')


def copy_button(value: str) -> Markup:
    """A button that copies ``value`` (shown where JavaScript runs; the value is on the page anyway)."""
    whole = escape(value)
    return Markup(f'<button type="button" class="copy" data-copy="{whole}" aria-label="copy it" hidden>copy</button>')


@functools.lru_cache(maxsize=1024)  # a page names the same few schedules on every row and every load
def in_words(schedule: str) -> str:
    """A cron schedule as Cloud Scheduler's console says it: "At 02:30, only on Monday".

    In 24-hour time, as the page's times are.  The cron stays beside it: the words are an aid,
    and a schedule the describer cannot read (croniter, which runs the schedules, read it at
    start-up) is said as nothing rather than fail the page.
    """
    options = Options()
    options.use_24hour_time_format = True
    options.verbose = False
    try:
        return str(ExpressionDescriptor(schedule, options).get_description())
    except Exception:  # cron_descriptor raises its own errors and, on odd input, Python's
        return ""


def install(app: Flask) -> None:
    app.jinja_env.globals.update(
        when=when,
        duration=duration,
        short_id=short_id,
        copy_button=copy_button,
        in_words=in_words,
        link=link,  # a link with a query (handlers.links): None values left out
        status_stylesheet=Markup(STATUS_STYLESHEET),  # the statuses' colours (handlers/slot_statuses.py)
    )
