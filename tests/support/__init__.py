"""Helpers the tests share."""

from devtools import POLL_SECONDS  # one figure for every local server

__all__ = ["POLL_SECONDS"]
