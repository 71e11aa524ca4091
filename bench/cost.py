"""`python -m bench.cost`: what the ledger costs a month, in Datastore entity operations and App Engine instance hours.

Entity reads, writes and deletes per outcome (as `make bench` counts them on
the wire; tests/test_cost_model.py holds the counts to it) times how often
each outcome happens, priced at list prices given as parameters.  Datastore
bills entity operations, not RPCs: BeginTransaction, Commit and Rollback are
free, and so are calls answered from this process's memory of completed runs.

    monthly cost = days x (sum over outcomes of rate/day x
                   (reads x read price + writes x write price + deletes x delete price)
                   less the daily free usage, which TTL deletes do not get)

Standard edition pricing (entity operations); Enterprise edition bills by size instead.

Instance hours (automatic scaling, app.yaml's instance class): an instance stays up, and is
billed, for ``idle`` minutes after its last request, so requests that come at least that often
keep one up all day; the fleet's busiest moment needs in-flight requests / concurrent requests
instances, the first of which also serves the audit cron:

    instance hours/day = 24 x max(min_instances,
                                  min(1, idle / min(fleet interval, audit interval))
                                  + (peak instances - 1) x min(1, idle / fleet interval))
    monthly cost = days x max(0, hours x class price - free F1 hours x F1 price)

Left out: the time a request itself runs, start-ups, and CPU: a lower bound for long requests.

Cloud Monitoring (DEDUP_METRICS_EXPORT=cloud-monitoring, App Engine's default): user-defined
metrics are billed by the bytes of the points written, a scalar point 8 bytes and a distribution
point 80, less 150 MiB a month free per billing account, then by tiers per MiB.  The app writes a
series only when it changed, at most once an export (handlers/metrics.py), so a slot that ran
writes its outcome and its claim's round trips (2 scalar points) and its delay, duration and
attempts (3 distributions), an idle job writes nothing, and each audit pass writes each job's
progress age (1 scalar point a job, 96 passes a day):

    MiB / month = (slots / day x (2 x 8 + 3 x 80) + jobs x 96 x 8) bytes x days / 2**20
    monthly cost = the tiers' prices over MiB / month less the free 150
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from dedup.queries import CLEANUP_BATCH

DAYS_PER_MONTH = 30.4
# Free usage per day (the default database), Firestore in Datastore mode.  TTL deletes get none.
FREE_PER_DAY = {"reads": 50_000, "writes": 20_000, "deletes": 20_000}
# List prices per 100,000 entities, us-central1 (Iowa), when this was written; pass the
# current ones (https://cloud.google.com/datastore/pricing, "Pricing by region").
PRICES_PER_100K = {"reads": 0.03, "writes": 0.09, "deletes": 0.01}
AUDIT_MINUTES = 15  # cron.yaml: /tasks/audit every 15 minutes (tests/test_cost_model.py reads it there)

# Cloud Monitoring's prices for user-defined metrics, from https://cloud.google.com/stackdriver/pricing
# ("Monitoring data ingested") as read when this was written: check them before relying on the figures.
METRIC_POINT_BYTES = {"scalar": 8, "distribution": 80}
METRICS_FREE_MIB = 150  # a month, per billing account
METRICS_TIERS = ((100_000, 0.2580), (250_000, 0.1510), (math.inf, 0.0610))  # up to this many MiB: $ a MiB
# What a decided slot of a run writes (schedules/metrics.py, dedup/metrics.py; tests/test_cost_model.py
# counts it): its outcome and the claim's round trips, and three distributions.
SLOT_POINTS = {"scalar": 2, "distribution": 3}
# Series a Scheduler job holds in each process that served it (each process writes its own,
# opentelemetry_id): typically its ran_once outcome, its round trips and three distributions; at
# most every outcome from every source that decides it (schedules.metrics: 8 by a run, 6 by the
# audit, paused by a resume, covered by a compaction's two, duplicates), three distributions from
# either runner, its round trips; and in the process that audits it, its progress age.
SERIES_PER_JOB = {"typical": 5 + 1, "at most": 8 + 6 + 1 + 2 + 1 + 3 * 2 + 1 + 1}
# What each audit pass writes of each job (schedules.metrics.PROGRESS_AGE): one scalar point.
AUDIT_POINTS_PER_DAY = 24 * 60 // AUDIT_MINUTES

# App Engine standard, automatic scaling.  List prices per instance hour, us-central1 (Iowa), from
# https://cloud.google.com/appengine/pricing ("Standard environment instances"), as of December 2026;
# pass the current ones (--instance-price).
INSTANCE_PRICES = {"F1": 0.05, "F2": 0.10, "F4": 0.20, "F4_1G": 0.30}
# The same page's free tier: 28 F-class instance hours a day.  Read as F1 hours (App Engine bills
# the larger classes as multiples of F1 hours: an F2 hour uses two), so worth 28 x the F1 price.
FREE_INSTANCE_HOURS = 28
# How long an idle instance stays up, billed, after its last request: the same page bills an automatic
# scaling instance until it shuts down, 15 minutes after its last request.  An assumption (--idle-minutes).
IDLE_MINUTES = 15
# automatic_scaling.max_concurrent_requests when app.yaml sets none (App Engine's default, app.yaml reference).
CONCURRENT_REQUESTS = 10


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


# Per outcome.  A fresh run reads its record once (the lookup beside the claim's insert; a missing record
# counted as read, the conservative count) and writes it twice (the insert, the finish fenced on its
# version); a TTL policy deletes it once it expires.  A refused insert (a duplicate's) writes nothing.
FRESH_RUN = Operations(reads=1, writes=2, expiry_deletes=1)
RENEWAL = Operations(writes=1)  # each heartbeat renewal, a third of the lease apart: fenced on a version
DUPLICATE_ELSEWHERE = Operations(reads=1)  # completed or in progress, one lookup
DUPLICATE_REMEMBERED = Operations()  # completed, this process answered it before
# overlap: forbid: the claim is a transaction that reads the record and the job's lock (2, against a fresh
# run's 1) and writes both; the finish updates the record and deletes the lock, each fenced on its version;
# each renewal reads the record and the lock (it must still hold the lock) and writes the lock too.
JOB_LOCK = Operations(reads=1, writes=1, deletes=1)
JOB_LOCK_RENEWAL = Operations(reads=2, writes=1)
# The missed-execution audit (schedules/audit.py): each pass reads and writes each Scheduler job's mark
# (a read, then a transaction's read and write) and reads its two day summaries (schedules/summaries.py);
# it reads the record of each slot whose run noted nothing there (a missed slot, a note lost), once.
AUDIT_PER_JOB_PASS = Operations(reads=4, writes=1)
AUDIT_PER_SLOT = Operations(reads=1)
# A finished run of a Scheduler job's slot notes its digest in its day's summary after its answer (a
# transaction's read and write): the home rows and the audit read that, not the run's record.
SLOT_NOTE = Operations(reads=1, writes=1)
# Without a TTL policy, /tasks/cleanup deletes expired records: a keys-only query (one read per batch of
# up to CLEANUP_BATCH), a lookup of each record (its version) and a delete fenced on that version; its
# deletes get the free usage.
CLEANUP_PER_RECORD = Operations(reads=1 + 1 / CLEANUP_BATCH, deletes=1)


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
    interval_minutes: float = 60.0  # how often its requests come (its schedule's period)
    in_flight: float = 1.0  # requests at once at its busiest moment

    def operations_per_day(self, cleanup: bool = False, audit_minutes: float = AUDIT_MINUTES) -> Operations:
        per_run = FRESH_RUN + RENEWAL * self.renewals_per_run
        per_run += DUPLICATE_ELSEWHERE * (self.duplicates_per_run * (1 - self.remembered_share))
        if self.exclusive:
            per_run += JOB_LOCK + JOB_LOCK_RENEWAL * self.renewals_per_run
        if self.scheduler_jobs:
            per_run += SLOT_NOTE  # the audit judges the slot from its note
        if cleanup:  # /tasks/cleanup instead of a TTL policy
            per_run += CLEANUP_PER_RECORD + Operations(expiry_deletes=-per_run.expiry_deletes)
        audit = AUDIT_PER_JOB_PASS * (self.scheduler_jobs * 24 * 60 / audit_minutes)
        return per_run * self.runs_per_day + audit


@dataclasses.dataclass(frozen=True)
class Hosting:
    """How App Engine serves the app: app.yaml's instance class and scaling, cron.yaml's audit."""

    instance_class: str = "F2"  # app.yaml (tests/test_cost_model.py holds the two together)
    min_instances: int = 0  # app.yaml's automatic_scaling.min_instances (unset: 0)
    audit_minutes: float = AUDIT_MINUTES
    idle_minutes: float = IDLE_MINUTES
    concurrent_requests: int = CONCURRENT_REQUESTS
    instance_price: float | None = None  # $ per instance hour; None: INSTANCE_PRICES[instance_class]
    free_instance_hours: float = FREE_INSTANCE_HOURS

    @property
    def price(self) -> float:
        return INSTANCE_PRICES[self.instance_class] if self.instance_price is None else self.instance_price

    def instance_hours_per_day(self, fleet: Fleet) -> float:
        """Hours a day of instances up for the fleet (the formula in this module's docstring)."""
        peak = max(1, math.ceil(fleet.in_flight / self.concurrent_requests))
        first = min(1.0, self.idle_minutes / min(fleet.interval_minutes, self.audit_minutes))
        others = (peak - 1) * min(1.0, self.idle_minutes / fleet.interval_minutes)
        return 24 * max(self.min_instances, first + others)

    def monthly_cost(self, hours_per_day: float) -> float:
        free = self.free_instance_hours * INSTANCE_PRICES["F1"]
        return max(0.0, hours_per_day * self.price - free) * DAYS_PER_MONTH


FLEETS = (
    # All ten are delivered at the top of the hour.
    Fleet("10 jobs hourly", runs_per_day=10 * 24, scheduler_jobs=10, interval_minutes=60, in_flight=10),
    # A 1-minute job with a 60 s lease running 30 s renews once; 1 % of runs are delivered twice.  All
    # are delivered at the top of the minute and run at once.
    Fleet(
        "1,000 jobs every minute",
        runs_per_day=1000 * 24 * 60,
        scheduler_jobs=1000,
        renewals_per_run=1,
        duplicates_per_run=0.01,
        interval_minutes=1,
        in_flight=1000,
    ),
    # Clients retry 5 % of calls with the same key; behind a load balancer, 1 in 10 lands on the same instance.
    # 100 calls a second of about 80 ms each (bench/results.md's fresh run at 10 ms RTT) are 8 at once.
    Fleet(
        "guarded API, 100 requests/s",
        runs_per_day=100 * 86_400 / 1.05,
        duplicates_per_run=0.05,
        remembered_share=0.1,
        interval_minutes=1 / 6000,
        in_flight=8,
    ),
)


def metrics_mib_per_month(slots_per_day: float, jobs: int = 0) -> float:
    """MiB a month of the points a fleet's decided slots, and the audit's ages of its ``jobs``,
    write (this module's docstring)."""
    per_slot = sum(SLOT_POINTS[kind] * METRIC_POINT_BYTES[kind] for kind in SLOT_POINTS)
    per_day = slots_per_day * per_slot + jobs * AUDIT_POINTS_PER_DAY * METRIC_POINT_BYTES["scalar"]
    return per_day * DAYS_PER_MONTH / 2**20


def metrics_monthly_cost(mib: float, free: float = METRICS_FREE_MIB) -> float:
    """Dollars a month for ``mib`` of points, priced by the tiers, less the free MiB."""
    billable, total, floor = max(0.0, mib - free), 0.0, 0.0
    for ceiling, price in METRICS_TIERS:
        total += max(0.0, min(billable, ceiling) - floor) * price
        floor = ceiling
    return total


# Fleets of Scheduler jobs, as Cloud Monitoring's model sees them: jobs, and slots a day each.
METRIC_FLEETS = (
    ("1,000 jobs hourly", 1000, 24),
    ("1,000 jobs every minute", 1000, 1440),
    ("5,000 jobs hourly", 5000, 24),
    ("5,000 jobs every minute", 5000, 1440),
)


def metrics_report() -> str:
    lines = [
        "Cloud Monitoring: a slot writes 2 scalar points (8 bytes) and 3 distributions (80 bytes), each audit "
        f"pass a scalar point a job ({AUDIT_POINTS_PER_DAY} a day), "
        f"less {METRICS_FREE_MIB} free MiB a month; ${METRICS_TIERS[0][1]:g} a MiB to 100,000 MiB.",
        "",
        "| fleet | slots / day | series a process, typical | at most | MiB / month | Monitoring $ / month |",
        "|---|---|---|---|---|---|",
    ]
    for name, jobs, slots in METRIC_FLEETS:
        mib = metrics_mib_per_month(jobs * slots, jobs)
        typical, most = jobs * SERIES_PER_JOB["typical"], jobs * SERIES_PER_JOB["at most"]
        lines.append(
            f"| {name} | {jobs * slots:,} | {typical:,} | {most:,} | {mib:,.0f} | {metrics_monthly_cost(mib):,.2f} |"
        )
    return "\n".join(lines) + "\n"


def monthly_cost(operations_per_day: Operations, prices: dict[str, float], free: bool = True) -> float:
    """Dollars a month for these daily operations, at ``prices`` per 100,000 entities."""
    total = operations_per_day.expiry_deletes * prices["deletes"] / 100_000  # TTL deletes: no free usage
    for kind in ("reads", "writes", "deletes"):
        billable = getattr(operations_per_day, kind) - (FREE_PER_DAY[kind] if free else 0)
        total += max(0.0, billable) * prices[kind] / 100_000
    return total * DAYS_PER_MONTH


def report(prices: dict[str, float], free: bool = True, cleanup: bool = False, hosting: Hosting = Hosting()) -> str:
    lines = [
        f"Prices per 100,000 entities: reads ${prices['reads']:g}, writes ${prices['writes']:g}, "
        f"deletes ${prices['deletes']:g}; {'less' if free else 'without'} the daily free usage; "
        f"expired records deleted by {'/tasks/cleanup' if cleanup else 'a TTL policy'}; "
        f"{DAYS_PER_MONTH:g} days a month.",
        f"Instances: {hosting.instance_class} at ${hosting.price:.2f} an hour, min_instances {hosting.min_instances}, "
        f"{hosting.concurrent_requests} requests at once each, up {hosting.idle_minutes:g} minutes after their "
        f"last request; /tasks/audit every {hosting.audit_minutes:g} minutes; less {hosting.free_instance_hours:g} "
        f"free F1 hours a day.",
        "",
        "| fleet | runs / day | entity reads / day | writes / day | deletes / day | Datastore $ / month "
        "| instance hours / day | instances $ / month | total $ / month |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for fleet in FLEETS:
        daily = fleet.operations_per_day(cleanup, hosting.audit_minutes)
        datastore = monthly_cost(daily, prices, free)
        hours = hosting.instance_hours_per_day(fleet)
        instances = hosting.monthly_cost(hours)
        lines.append(
            f"| {fleet.name} | {fleet.runs_per_day:,.0f} | {daily.reads:,.0f} | {daily.writes:,.0f} "
            f"| {daily.deletes + daily.expiry_deletes:,.0f} | {datastore:,.2f} | {hours:,.1f} | {instances:,.2f} "
            f"| {datastore + instances:,.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for kind, price in PRICES_PER_100K.items():
        parser.add_argument(f"--{kind[:-1]}-price", type=float, default=price, help=f"$ per 100,000 entity {kind}")
    parser.add_argument("--no-free-tier", action="store_true", help="a named database: no free usage")
    parser.add_argument("--cleanup", action="store_true", help="no TTL policy: /tasks/cleanup deletes expired records")
    parser.add_argument("--instance-class", choices=INSTANCE_PRICES, default=Hosting.instance_class, help="app.yaml's")
    parser.add_argument("--instance-price", type=float, help="$ per instance hour (default: the class's list price)")
    parser.add_argument("--min-instances", type=int, default=Hosting.min_instances, help="automatic_scaling's")
    parser.add_argument("--audit-minutes", type=float, default=AUDIT_MINUTES, help="cron.yaml's /tasks/audit interval")
    parser.add_argument("--idle-minutes", type=float, default=IDLE_MINUTES, help="an instance's life after a request")
    parser.add_argument(
        "--concurrent-requests", type=int, default=CONCURRENT_REQUESTS, help="automatic_scaling.max_concurrent_requests"
    )
    parser.add_argument(
        "--free-instance-hours", type=float, default=FREE_INSTANCE_HOURS, help="free F1 instance hours a day"
    )
    args = parser.parse_args(argv)
    prices = {"reads": args.read_price, "writes": args.write_price, "deletes": args.delete_price}
    figures = [*prices.values(), args.idle_minutes, args.free_instance_hours, args.min_instances]
    if args.instance_price is not None:
        figures.append(args.instance_price)
    if any(not math.isfinite(figure) or figure < 0 for figure in figures):
        parser.error("prices, minutes, hours and instances must be finite and not negative")
    if not (math.isfinite(args.audit_minutes) and args.audit_minutes > 0) or args.concurrent_requests < 1:
        parser.error("--audit-minutes must be positive and --concurrent-requests at least 1")
    hosting = Hosting(
        instance_class=args.instance_class,
        min_instances=args.min_instances,
        audit_minutes=args.audit_minutes,
        idle_minutes=args.idle_minutes,
        concurrent_requests=args.concurrent_requests,
        instance_price=args.instance_price,
        free_instance_hours=args.free_instance_hours,
    )
    sys.stdout.write(report(prices, free=not args.no_free_tier, cleanup=args.cleanup, hosting=hosting))
    sys.stdout.write("\n" + metrics_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
