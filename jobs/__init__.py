"""Jobs: what a run does.  Declared in jobs.yaml, one plug-in module per kind.

Job code imports what it needs from here::

    from jobs import RunContext, PermanentJobError, RetryableJobError
"""

from dedup.errors import PermanentJobError, RetryableJobError
from jobs.base import JobKind, RunContext

__all__ = ["JobKind", "PermanentJobError", "RetryableJobError", "RunContext"]
