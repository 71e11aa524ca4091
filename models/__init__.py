"""NDB models: the Datastore entities this app stores.

The run record and a job's lock are the library's (``dedup.run_record``, ``dedup.job_lock``):
the protocol writes them, in this app and in any handler that uses the library.  The run
record's names are here too, for the app's modules that read it beside its own entities.
"""

from dedup.run_record import DELIVERED_SOURCES, RunRecord, RunSource, RunStatus

__all__ = ["DELIVERED_SOURCES", "RunRecord", "RunSource", "RunStatus"]
