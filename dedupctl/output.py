"""What dedupctl prints, to a reader that may stop early (``dedupctl runs show ID | head``).

A reader that closes the pipe ends the output, quietly: the rest goes to the
null device, so neither this write nor the interpreter's flush at exit raises
``BrokenPipeError``, and the exit code still says what the answer was.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO


def out(text: str) -> None:
    """A line of the answer, on stdout."""
    _write(sys.stdout, text)


def err(text: str) -> None:
    """A line on stderr as it is (an error answer)."""
    _write(sys.stderr, text)


def say(message: str) -> None:
    """dedupctl's own words on stderr: the token, retries, what a backfill leaves alone."""
    _write(sys.stderr, f"dedupctl: {message}")


def _write(stream: TextIO, text: str) -> None:
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        # The reader is gone: what is still buffered, and all that follows, goes nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
