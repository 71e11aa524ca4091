"""`python -m bench.cost`: what the ledger costs in Datastore entity operations, per month.

Entity reads, writes and deletes per outcome (as `make bench` counts them on
the wire; tests/test_cost_model.py holds the counts to it) times how often
each outcome happens, priced at list prices given as parameters.  Datastore
bills entity operations, not RPCs: BeginTransaction, Commit and Rollback are
free, and so are calls answered from this process's memory of completed runs.

    monthly cost = days x (sum over outcomes of rate/day x
                   (reads x read price + writes x write price + deletes x delete price)
                   less the daily free usage, which TTL deletes do not get)

Standard edition pricing (entity operations); Enterprise edition bills by size instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

DAYS_PER_MONTH = 30.4
# Free usage per day (the default database), Firestore in Datastore mode.  TTL deletes get none.
FREE_PER_DAY = {"reads": 50_000, "writes": 20_000, "deletes": 20_000}
# List prices per 100,000 entities, us-central1 (Iowa), when this was written; pass the
# current ones (https://cloud.google.com/datastore/pricing, "Pricing by region").
PRICES_PER_100K = {"reads": 0.03, "writes": 0.09, "deletes": 0.01}
AUDIT_PASSES_PER_DAY = 24 * 4  # cron.yaml: /tasks/audit every 15 minutes


@dataclasses.dataclass(frozen=True)
class Operations:
    """Billed entity operations; ``expiry_deletes`` are a TTL policy's (billed as deletes, no free usage)."""

    reads: float = 0
    writes: float = 0
    deletes: float = 0
    expiry_deletes: float = 0

    def __add__(self, other: Operations) -> Operations:
        return Operations(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))

    def __mul__(self, times: float) -> Operations:
        return Operations(*(a * times for a in dataclasses.astuple(self)))


# Per outcome.  A fresh run reads its record three times (the fast-path lookup, then the claim's and the
# finish's transactional reads; a missing record counted as read, the conservative count) and writes it twice
# (claim, finish); a TTL policy deletes it once it expires.
FRESH_RUN = Operations(reads=3, writes=2, expiry_deletes=1)
RENEWAL = Operations(reads=1, writes=1)  # each heartbeat renewal: a third of the lease apart
DUPLICATE_ELSEWHERE = Operations(reads=1)  # completed or in progress, one lookup
DUPLICATE_REMEMBERED = Operations()  # completed, this process answered it before
# overlap: forbid: the job's lock is read beside the record in the claim and the finish, written by the
# claim, deleted by the finish, and read and written by each renewal.
JOB_LOCK = Operations(reads=2, writes=1, deletes=1)
JOB_LOCK_RENEWAL = Operations(reads=1, writes=1)
# The missed-execution audit (schedules/audit.py): each pass reads and writes each Scheduler job's mark
# (a read, then a transaction's read and write), and reads each slot's record once.
AUDIT_PER_JOB_PASS = Operations(reads=2, writes=1)
AUDIT_PER_SLOT = Operations(reads=1)
# Without a TTL policy, /tasks/cleanup deletes expired records: a keys-only query (one read per batch of
# up to 100) and a transaction that reads each record again before deleting it; its deletes get the free usage.
CLEANUP_PER_RECORD = Operations(reads=1 + 1 / 100, deletes=1)


@dataclasses.dataclass(frozen=True)
class Fleet:
    """How a deployment uses the ledger."""

    name: str
    runs_per_day: float
    scheduler_jobs: int = 0  # audited each pass (scheduler.yaml); 0 for a guarded API
    renewals_per_run: float = 0.0  # heartbeats: run seconds / (lease / 3)
    duplicates_per_run: float = 0.0  # deliveries of a run after its first
    remembered_share: float = 0.0  # of those, answered from memory (the instance that ran it)
    exclusive: bool = False

    def operations_per_day(self, cleanup: bool = False) -> Operations:
        per_run = FRESH_RUN + RENEWAL * self.renewals_per_run
        per_run += DUPLICATE_ELSEWHERE * (self.duplicates_per_run * (1 - self.remembered_share))
        if self.exclusive:
            per_run += JOB_LOCK + JOB_LOCK_RENEWAL * self.renewals_per_run
        if self.scheduler_jobs:
            per_run += AUDIT_PER_SLOT
        if cleanup:  # /tasks/cleanup instead of a TTL policy
            per_run += CLEANUP_PER_RECORD + Operations(expiry_deletes=-per_run.expiry_deletes)
        audit = AUDIT_PER_JOB_PASS * (self.scheduler_jobs * AUDIT_PASSES_PER_DAY)
        return per_run * self.runs_per_day + audit


FLEETS = (
    Fleet("10 jobs hourly", runs_per_day=10 * 24, scheduler_jobs=10),
    # A 1-minute job with a 60 s lease running 30 s renews once; 1 % of runs are delivered twice.
    Fleet(
        "1,000 jobs every minute",
        runs_per_day=1000 * 24 * 60,
        scheduler_jobs=1000,
        renewals_per_run=1,
        duplicates_per_run=0.01,
    ),
    # Clients retry 5 % of calls with the same key; behind a load balancer, 1 in 10 lands on the same instance.
    Fleet(
        "guarded API, 100 requests/s", runs_per_day=100 * 86_400 / 1.05, duplicates_per_run=0.05, remembered_share=0.1
    ),
)


def monthly_cost(operations_per_day: Operations, prices: dict[str, float], free: bool = True) -> float:
    """Dollars a month for these daily operations, at ``prices`` per 100,000 entities."""
    total = operations_per_day.expiry_deletes * prices["deletes"] / 100_000  # TTL deletes: no free usage
    for kind in ("reads", "writes", "deletes"):
        billable = getattr(operations_per_day, kind) - (FREE_PER_DAY[kind] if free else 0)
        total += max(0.0, billable) * prices[kind] / 100_000
    return total * DAYS_PER_MONTH


def report(prices: dict[str, float], free: bool = True, cleanup: bool = False) -> str:
    lines = [
        f"Prices per 100,000 entities: reads ${prices['reads']:g}, writes ${prices['writes']:g}, "
        f"deletes ${prices['deletes']:g}; {'less' if free else 'without'} the daily free usage; "
        f"expired records deleted by {'/tasks/cleanup' if cleanup else 'a TTL policy'}; "
        f"{DAYS_PER_MONTH:g} days a month.",
        "",
        "| fleet | runs / day | entity reads / day | writes / day | deletes / day | $ / month |",
        "|---|---|---|---|---|---|",
    ]
    for fleet in FLEETS:
        daily = fleet.operations_per_day(cleanup)
        lines.append(
            f"| {fleet.name} | {fleet.runs_per_day:,.0f} | {daily.reads:,.0f} | {daily.writes:,.0f} "
            f"| {daily.deletes + daily.expiry_deletes:,.0f} | {monthly_cost(daily, prices, free):,.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for kind, price in PRICES_PER_100K.items():
        parser.add_argument(f"--{kind[:-1]}-price", type=float, default=price, help=f"$ per 100,000 entity {kind}")
    parser.add_argument("--no-free-tier", action="store_true", help="a named database: no free usage")
    parser.add_argument("--cleanup", action="store_true", help="no TTL policy: /tasks/cleanup deletes expired records")
    args = parser.parse_args(argv)
    prices = {"reads": args.read_price, "writes": args.write_price, "deletes": args.delete_price}
    if any(not math.isfinite(price) or price < 0 for price in prices.values()):
        parser.error("prices must be finite and not negative")
    sys.stdout.write(report(prices, free=not args.no_free_tier, cleanup=args.cleanup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
