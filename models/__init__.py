"""NDB models: the Datastore entities this app stores."""

from models.run import RunRecord, RunStatus

__all__ = ["RunRecord", "RunStatus"]
