"""The idempotency guard around a plain function: docs/manual-runs.md shows this file."""

from __future__ import annotations

from dedup.clock import SystemClock
from dedup.idempotency import IdempotencyGuard
from dedup.ledger import Ledger

guard = IdempotencyGuard(Ledger(SystemClock()), "shipments")
SHIPPED: list[str] = []  # stands in for the side effect that must happen once


@guard.wrap(key=lambda order: order["id"], parameters=lambda order: {"address": order["address"]})
def ship(order: dict) -> dict:
    SHIPPED.append(order["id"])
    return {"label": f"label-{order['id']}"}
