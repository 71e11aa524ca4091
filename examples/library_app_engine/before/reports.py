"""Stands in for what the app's route does: a report sent downstream (its calls, counted)."""

SENT: list[str | None] = []


def send_nightly_report(idempotency_key: str | None = None) -> None:
    SENT.append(idempotency_key)
