"""NDB models: the Datastore entities this app stores."""

from models.run import DELIVERED_SOURCES, RunRecord, RunSource, RunStatus

__all__ = ["DELIVERED_SOURCES", "RunRecord", "RunSource", "RunStatus"]
