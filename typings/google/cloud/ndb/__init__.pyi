# google-cloud-ndb ships no types (no py.typed).  This stub makes it Any for mypy, and makes
# `from google.cloud import ndb` resolve whatever order mypy reads the namespace package in.
from typing import Any

def __getattr__(name: str) -> Any: ...
