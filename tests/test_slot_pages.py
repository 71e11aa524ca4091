"""schedules/slots.py's pages of slots over many Scheduler jobs: each page computes about its own
slots, so a range read page by page is linear in its slots, not quadratic in its jobs (a day's
history of 200 five-minute jobs took 84 s of CPU when each page computed every job's page)."""

from __future__ import annotations

import datetime

from schedules import slots
from schedules.bound import BoundJob
from schedules.config import SchedulerJob

T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


def fleet(count: int) -> list[BoundJob]:
    return [
        BoundJob(
            SchedulerJob(
                name=f"every-5-{n:03d}",
                target="invoice",
                schedule=f"{n % 5}-59/5 * * * *",  # five offsets: times shared by several jobs, and not
                project="acme-prod",
                location="us-central1",
            )
        )
        for n in range(count)
    ]


def test_a_page_computes_its_own_slots_and_one_more_a_job(monkeypatch):
    jobs = fleet(50)
    computed = 0
    schedule_times = slots._times

    def counted(job, since):
        nonlocal computed
        for instant in schedule_times(job, since):
            computed += 1
            yield instant

    monkeypatch.setattr(slots, "_times", counted)
    page = slots.slots_between(jobs, T0, T0 + DAY, limit=100)
    assert len(page) == 100 and computed <= 100 + len(jobs)


def test_the_pages_list_every_slot_once_in_one_order():
    jobs = fleet(12)
    every = sorted(
        (slot for job in jobs for slot in slots._job_slots(job, T0, T0 + DAY, 10**6)),
        key=lambda s: (s.schedule_time, s.job.name, s.job.project, s.job.location),
    )
    paged, since = [], T0
    while since is not None:
        page, since = slots.slot_page(jobs, since, T0 + DAY, limit=250)
        paged += page
    assert [(s.schedule_time, s.job.name) for s in paged] == [(s.schedule_time, s.job.name) for s in every]
    assert len(paged) == 12 * 288
