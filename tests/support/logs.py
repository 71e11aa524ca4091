"""Log capture for tests: configure_logging's output in either format, and the records behind it."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator

import pytest

from handlers.logs import configure_logging
from settings import Settings

TRACE = "105445aa7843bc8bf206b12000100000/1;o=1"


class CapturedLogs(logging.Handler):
    """What configure_logging wrote (``text``; calling it parses the lines) and the
    records behind it, so a test can count the lines each record took."""

    def __init__(self, parse: Callable[[str], list]) -> None:
        super().__init__()
        self.stream = io.StringIO()
        self.records: list[logging.LogRecord] = []
        self._parse = parse

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def __call__(self) -> list:
        return self._parse(self.text)


def capture_logs(environ: dict[str, str], parse: Callable[[str], list]) -> Iterator[CapturedLogs]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    captured = CapturedLogs(parse)
    configure_logging(Settings.from_environ(environ), captured.stream)
    root.addHandler(captured)
    try:
        yield captured
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


@pytest.fixture
def json_logs():
    # splitlines, not split("\n"): a raw U+2028 or NEL inside a line would break json.loads here.
    yield from capture_logs(
        {"DEDUP_LOG_FORMAT": "json", "GOOGLE_CLOUD_PROJECT": "acme-prod"},
        lambda text: [json.loads(line) for line in text.splitlines()],
    )


@pytest.fixture
def text_logs():
    """The default format wherever GAE_ENV is unset (Cloud Run, local runs)."""
    yield from capture_logs({"GOOGLE_CLOUD_PROJECT": "acme-prod"}, str.splitlines)


def request_lines(lines):
    return [line for line in lines if line["logger"] == "dedup.requests"]
