"""A python job in three steps that survive a takeover (docs/jobs.md, "Steps").

Each step passes its own downstream key (``<run id>:<step name>``) to what it calls.  A takeover
after ``reserve`` was recorded does not reserve again; a charge whose answer was lost is never
sent again silently: the run waits for a person (``on_unknown: review``).  ``Service`` stands in
for the APIs a real job calls (a billing system, a payment provider, a mailer).
"""

from __future__ import annotations

from typing import Any

from jobs import RunContext


class Service:
    """An API that deduplicates by the key it is given, as Stripe's Idempotency-Key does."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.applied: dict[str, dict[str, Any]] = {}

    def call(self, key: str, **fields: Any) -> dict[str, Any]:
        if key not in self.applied:
            self.applied[key] = {"id": f"{self.name}-{len(self.applied) + 1}", **fields}
        return self.applied[key]


billing, payments, mailer = Service("invoice"), Service("charge"), Service("receipt")


def bill_customer(context: RunContext) -> dict:
    """Reserve an invoice, charge it, send the receipt: once each, however the run is taken over."""
    invoice = context.step("reserve", lambda key: billing.call(key, amount=4200))
    charge = context.step(
        "charge",
        lambda key: payments.call(key, amount=invoice["amount"]),
        semantic="at_most_once",
        on_unknown="review",  # a charge in doubt waits for a person; it is never sent twice silently
    )
    receipt = context.step("notify", lambda key: mailer.call(key, charge=charge["id"]))
    return {"invoice": invoice["id"], "charge": charge["id"], "receipt": receipt["id"]}
