"""NDB models: the Datastore entities this app stores."""

from models.run import RunRecord, RunSource, RunStatus

__all__ = ["RunRecord", "RunSource", "RunStatus"]
