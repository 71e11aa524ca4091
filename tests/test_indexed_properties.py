"""Issue 37 §4: index entries are kept to what the queries need.

Each indexed property costs every write its index entries, and one whose value rises with time
(a schedule time, a creation time) concentrates a fleet's writes on one index range, where
Datastore warns of hotspots above about 500 writes a second.  So a model indexes exactly what a
query filters or sorts on: the run listing (dedup/queries.py: job_id, status, source, newest
first by created), the cleanup (expire_at), the ledger digest (jobs/builtin.py: created), and the
home page's attention-first order (the audit mark's attention_until, a pause's paused and
changed_at).
"""

from __future__ import annotations

import os

import yaml
from google.cloud import ndb

from dedup.job_lock import JobLock
from dedup.run_record import RunRecord
from models.attention_share import AttentionShare
from models.audit import AuditMark
from models.delivery_tally import DeliveryTally
from models.schedule_history import ScheduleHistory
from models.schedule_pause import SchedulePauses
from models.slot_day import SlotDay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUERIED = {
    RunRecord: {"job_id", "status", "source", "created", "expire_at"},
    # The home page's attention-first order (schedules/attention.py): keys-only inequality and
    # equality without the audit shares' entities, and the pauses changed since they were written.
    AuditMark: {"attention_until"},
    SchedulePauses: {"paused", "changed_at"},
}


def indexed(model: type[ndb.Model]) -> set[str]:
    return {prop._name for prop in model._properties.values() if prop._indexed}


def test_each_model_indexes_only_what_a_query_reads():
    for model in (
        RunRecord,
        AuditMark,
        AttentionShare,
        DeliveryTally,
        JobLock,
        ScheduleHistory,
        SchedulePauses,
        SlotDay,
    ):
        assert indexed(model) == QUERIED.get(model, set()), model._get_kind()


def test_the_composite_indexes_use_only_indexed_properties():
    with open(os.path.join(ROOT, "index.yaml"), encoding="utf-8") as handle:
        composites = yaml.safe_load(handle)["indexes"]
    for index in composites:
        [model] = [m for m in QUERIED if m._get_kind() == index["kind"]]
        assert {p["name"] for p in index["properties"]} <= indexed(model), index
