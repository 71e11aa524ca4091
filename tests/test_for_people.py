"""handlers/for_people.py: durations with units, times relative to the page's moment."""

from __future__ import annotations

import datetime

import pytest

from handlers.for_people import ago, span


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (0, "0 s"),
        (0.00004, "< 1 ms"),
        (0.0005, "1 ms"),
        (0.042, "42 ms"),
        (0.42, "420 ms"),
        (0.9996, "1 s"),
        (1, "1 s"),
        (5, "5 s"),
        (5.5, "5.5 s"),
        (12, "12 s"),
        (59.6, "1 min"),
        (60, "1 min"),
        (185, "3 min 5 s"),
        (3600, "1 h"),
        (7440, "2 h 4 min"),
        (86400, "1 d"),
        (266400, "3 d 2 h"),
        (-90, "-1 min 30 s"),
    ],
)
def test_a_duration_has_its_units(seconds, shown):
    assert span(seconds) == shown


def test_a_time_is_said_relative_to_now_both_ways():
    now = datetime.datetime(2030, 1, 1, 12, tzinfo=datetime.UTC)
    assert ago(now - datetime.timedelta(minutes=3), now) == "3 min ago"
    assert ago(now + datetime.timedelta(hours=2), now) == "in 2 h"
    assert ago(now, now) == "now"


@pytest.mark.parametrize(
    "schedule, words",
    [
        ("*/5 * * * *", "Every 5 minutes"),
        ("0 * * * *", "Every hour"),
        ("30 2 * * *", "At 02:30"),  # 24-hour time, as the pages' times are
        ("0 6 * * 1", "At 06:00, only on Monday"),
        ("15 3 L * *", "At 03:15, on the last day of the month"),
    ],
)
def test_a_schedule_is_said_in_words(schedule, words):
    from handlers.for_people import in_words

    assert in_words(schedule) == words


@pytest.mark.parametrize("schedule", ["", "not cron", "* * *", "* * * * * * * *", "\x00"])
def test_a_schedule_the_describer_cannot_read_is_said_as_nothing(schedule):
    from handlers.for_people import in_words

    assert in_words(schedule) == ""
