"""`python -m bench.cost`: what the ledger costs in Datastore entity operations, per month.

Entity reads, writes and deletes per outcome (as `make bench` counts them on
the wire; tests/test_round_trips.py holds the counts) times how often each
outcome happens, priced at list prices given as parameters.  Datastore bills
entity operations, not RPCs: BeginTransaction, Commit and Rollback are free,
and so are calls answered from this process's memory of completed runs.

    monthly cost = days x sum over outcomes of
                   rate/day x (reads x read price + writes x write price + deletes x delete price),
                   less the daily free usage (default database only)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

DAYS_PER_MONTH = 30.4
# Free usage per day (the default database), Firestore in Datastore mode.
FREE_PER_DAY = {"reads": 50_000, "writes": 20_000, "deletes": 20_000}
# List prices per 100,000 entities, us-central1 (Iowa), when this was written; pass the
# current ones (https://cloud.google.com/datastore/pricing, "Pricing by region").
PRICES_PER_100K = {"reads": 0.03, "writes": 0.09, "deletes": 0.01}


@dataclasses.dataclass(frozen=True)
class Operations:
    """Billed entity operations of one outcome."""

    reads: float
    writes: float
    deletes: float

    def __add__(self, other: Operations) -> Operations:
        return Operations(self.reads + other.reads, self.writes + other.writes, self.deletes + other.deletes)

    def __mul__(self, times: float) -> Operations:
        return Operations(self.reads * times, self.writes * times, self.deletes * times)


# Per outcome.  A fresh run reads its record three times (the fast-path lookup, then the claim's and the
# finish's transactional reads; a missing record counted as read, the conservative count) and writes it twice
# (claim, finish); its record is deleted once when it expires (TTL or /tasks/cleanup).
FRESH_RUN = Operations(reads=3, writes=2, deletes=1)
RENEWAL = Operations(reads=1, writes=1, deletes=0)  # each heartbeat renewal: a third of the lease apart
DUPLICATE_ELSEWHERE = Operations(reads=1, writes=0, deletes=0)  # completed or in progress, one lookup
DUPLICATE_REMEMBERED = Operations(reads=0, writes=0, deletes=0)  # completed, this process answered it before
# overlap: forbid adds the job's lock: read beside the record in each transaction, written by the claim,
# deleted by the finish.
JOB_LOCK = Operations(reads=2, writes=1, deletes=1)


@dataclasses.dataclass(frozen=True)
class Fleet:
    """How a deployment uses the ledger."""

    name: str
    runs_per_day: float
    renewals_per_run: float = 0.0  # heartbeats: run seconds / (lease / 3)
    duplicates_per_run: float = 0.0  # deliveries of a run after its first
    remembered_share: float = 0.0  # of those, answered from memory (the instance that ran it)
    exclusive: bool = False

    def operations_per_day(self) -> Operations:
        per_run = FRESH_RUN + RENEWAL * self.renewals_per_run
        per_run += DUPLICATE_ELSEWHERE * (self.duplicates_per_run * (1 - self.remembered_share))
        if self.exclusive:
            per_run += JOB_LOCK
        return per_run * self.runs_per_day


FLEETS = (
    Fleet("10 jobs hourly", runs_per_day=10 * 24),
    # A 1-minute job with a 60 s lease running 30 s renews once; 1 % of runs are delivered twice.
    Fleet("1,000 jobs every minute", runs_per_day=1000 * 24 * 60, renewals_per_run=1, duplicates_per_run=0.01),
    # Clients retry 5 % of calls with the same key; behind a load balancer, 1 in 10 lands on the same instance.
    Fleet(
        "guarded API, 100 requests/s",
        runs_per_day=100 * 86_400 / 1.05,
        duplicates_per_run=0.05,
        remembered_share=0.1,
    ),
)


def monthly_cost(operations_per_day: Operations, prices: dict[str, float], free: bool = True) -> float:
    """Dollars a month for these daily operations, at ``prices`` per 100,000 entities."""
    total = 0.0
    for kind in ("reads", "writes", "deletes"):
        billable = getattr(operations_per_day, kind) - (FREE_PER_DAY[kind] if free else 0)
        total += max(0.0, billable) * prices[kind] / 100_000
    return total * DAYS_PER_MONTH


def report(prices: dict[str, float], free: bool = True) -> str:
    lines = [
        f"Prices per 100,000 entities: reads ${prices['reads']:g}, writes ${prices['writes']:g}, "
        f"deletes ${prices['deletes']:g}; {'less' if free else 'without'} the daily free usage; "
        f"{DAYS_PER_MONTH:g} days a month.",
        "",
        "| fleet | runs / day | entity reads / day | writes / day | deletes / day | $ / month |",
        "|---|---|---|---|---|---|",
    ]
    for fleet in FLEETS:
        daily = fleet.operations_per_day()
        lines.append(
            f"| {fleet.name} | {fleet.runs_per_day:,.0f} | {daily.reads:,.0f} | {daily.writes:,.0f} "
            f"| {daily.deletes:,.0f} | {monthly_cost(daily, prices, free):,.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for kind, price in PRICES_PER_100K.items():
        parser.add_argument(f"--{kind[:-1]}-price", type=float, default=price, help=f"$ per 100,000 entity {kind}")
    parser.add_argument("--no-free-tier", action="store_true", help="a named database: no free usage")
    args = parser.parse_args(argv)
    prices = {"reads": args.read_price, "writes": args.write_price, "deletes": args.delete_price}
    if any(price < 0 for price in prices.values()):
        parser.error("prices cannot be negative")
    sys.stdout.write(report(prices, free=not args.no_free_tier))
    return 0


if __name__ == "__main__":
    sys.exit(main())
