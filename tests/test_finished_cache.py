"""The in-process cache of completed runs: a hit costs no round trip, an entry lasts until the
record's expire_at, only completed records are ever held, and it is bounded."""

from __future__ import annotations

import datetime
import pickle

import pytest

from dedup.finished_cache import FinishedRuns
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Claimed, InProgress, Replayed
from models import RunRecord, RunStatus

POLICY = RunPolicy(60, 3600)


def record(run_id: str, status: str, expires: datetime.datetime, result=None) -> RunRecord:
    now = expires - datetime.timedelta(hours=1)
    return RunRecord(
        id=run_id, source="scheduler", job_id="j", status=status, attempt_id="a", attempt=1,
        lease_expires=now, expire_at=expires, created=now, updated=now, result=result,
    )  # fmt: skip


T = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def test_a_completed_record_is_held_until_it_expires(ndb_context):
    cache = FinishedRuns()
    cache.remember(record("r", RunStatus.COMPLETED, T + datetime.timedelta(hours=1), {"ok": 1}))
    assert cache.get("r", T).result == {"ok": 1}
    assert cache.get("r", T + datetime.timedelta(hours=1)) is None  # expire_at: gone, as for any read
    assert len(cache) == 0


@pytest.mark.parametrize("status", [s.value for s in RunStatus if s != RunStatus.COMPLETED])
def test_nothing_but_completed_records_is_ever_held(ndb_context, status):
    cache = FinishedRuns()
    cache.remember(record("r", status, T + datetime.timedelta(hours=1)))
    assert cache.get("r", T) is None


def test_it_is_bounded_least_recently_used_first_out_and_keeps_big_results_out(ndb_context):
    cache = FinishedRuns(max_entries=3, max_document_chars=100)
    later = T + datetime.timedelta(hours=1)
    for name in "abc":
        cache.remember(record(name, RunStatus.COMPLETED, later, {"n": name}))
    cache.get("a", T)  # a is used: b is now the oldest
    cache.remember(record("d", RunStatus.COMPLETED, later, {"n": "d"}))
    assert [name for name in "abcd" if cache.get(name, T)] == ["a", "c", "d"]
    cache.remember(record("big", RunStatus.COMPLETED, later, {"x": "y" * 200}))
    assert cache.get("big", T) is None and len(cache) == 3
    off = FinishedRuns(max_entries=0)  # DEDUP_FINISHED_CACHE_ENTRIES=0
    off.remember(record("r", RunStatus.COMPLETED, later, {"n": 1}))
    assert off.get("r", T) is None and len(off) == 0
    with pytest.raises(ValueError):
        FinishedRuns(max_entries=-1)


def test_the_ledger_answers_a_completed_duplicate_from_memory_and_only_then(ndb_context, clock):
    ledger = Ledger(clock)
    claimed = ledger.claim_run("run-1", RunDescription("scheduler", "j"), POLICY)
    description = RunDescription("scheduler", "j")
    assert isinstance(claimed, Claimed) and ledger.finished.get("run-1", clock.now()) is None
    assert isinstance(ledger.refusal("run-1", description), InProgress)  # read, but in progress: not held
    assert ledger.finished.get("run-1", clock.now()) is None
    ledger.complete_run(claimed.attempt, {"ok": True}, POLICY)
    RunRecord.get_by_id("run-1").key.delete()  # gone from Datastore: only memory can answer now
    replay = ledger.refusal("run-1", description)
    assert isinstance(replay, Replayed) and replay.record.result == {"ok": True}
    other = RunDescription("scheduler", "other-job")
    assert ledger.refusal("run-1", other).__class__.__name__ == "JobMismatch"  # the checks still apply
    clock.advance(3601 + 60)
    assert ledger.refusal("run-1", description) is None  # past expire_at: absent, as everywhere


def test_a_failed_run_is_never_answered_from_memory(ndb_context, clock):
    """An operator may reopen it; another process's memory must not go on answering the failure."""
    ledger = Ledger(clock)
    claimed = ledger.claim_run("run-2", RunDescription("scheduler", "j"), POLICY)
    ledger.fail_run(claimed.attempt, {"type": "Rejected"}, POLICY)
    description = RunDescription("scheduler", "j")
    assert ledger.refusal("run-2", description).record.status == RunStatus.FAILED
    RunRecord.get_by_id("run-2").key.delete()
    assert ledger.refusal("run-2", description) is None


@pytest.mark.parametrize("raw, entries", [("", 1024), ("0", 0), ("50", 50)])
def test_the_cache_size_is_a_setting(raw, entries):
    from handlers import finished_cache_entries_from_environ

    assert finished_cache_entries_from_environ({"DEDUP_FINISHED_CACHE_ENTRIES": raw}) == entries


@pytest.mark.parametrize("raw", ["-1", "lots", "1e3", "100001"])
def test_a_bad_cache_size_stops_the_app(raw):
    from handlers import SettingError, finished_cache_entries_from_environ

    with pytest.raises(SettingError, match="DEDUP_FINISHED_CACHE_ENTRIES"):
        finished_cache_entries_from_environ({"DEDUP_FINISHED_CACHE_ENTRIES": raw})


def test_the_size_limit_is_exact_and_a_big_result_is_not_encoded_whole(ndb_context):
    later = T + datetime.timedelta(hours=1)
    cache = FinishedRuns(max_document_chars=20)
    cache.remember(record("fits", RunStatus.COMPLETED, later, {"x": "y" * 11}))  # {"x": "yyyyyyyyyyy"}: 20
    cache.remember(record("over", RunStatus.COMPLETED, later, {"x": "y" * 12}))  # 21
    assert cache.get("fits", T) is not None and cache.get("over", T) is None

    encoded = []

    class Item:  # stored results are JSON; an object shows how far the size check encoded
        def __str__(self) -> str:
            encoded.append(self)
            return "item"

    big = record("big", RunStatus.COMPLETED, later, None)
    big.result = [Item() for _ in range(10_000)]  # set after construction: never stored, only measured
    FinishedRuns(max_document_chars=1000).remember(big)
    assert 0 < len(encoded) < 200  # stopped past the limit, not after 10,000 items


def test_what_it_answers_is_a_copy(ndb_context):
    """A caller changing the result it was answered (or the record it remembered) changes no later answer."""
    cache = FinishedRuns()
    kept = record("r", RunStatus.COMPLETED, T + datetime.timedelta(hours=1), {"items": ["a"]})
    cache.remember(kept)
    kept.result["items"].append("changed after remember")
    first = cache.get("r", T)
    first.result["items"].append("changed by the first caller")
    assert cache.get("r", T).result == {"items": ["a"]} and cache.get("r", T).key == kept.key


def test_big_parameters_keep_a_record_out_too(ndb_context):
    """A guarded call's parameters may be 256 KiB: the bound is on what the record holds, not its result alone."""
    cache = FinishedRuns(max_document_chars=100)
    later = T + datetime.timedelta(hours=1)
    small = record("small", RunStatus.COMPLETED, later, {"ok": 1})
    small.parameters = {"p": "x" * 50}
    big = record("big", RunStatus.COMPLETED, later, {"ok": 1})
    big.parameters = {"p": "x" * 100}
    cache.remember(small)
    cache.remember(big)
    assert cache.get("small", T) is not None and cache.get("big", T) is None


@pytest.mark.parametrize("depth", [50, 400, 900])
def test_deeply_nested_parameters_never_raise(ndb_context, depth):
    """Parameters may nest as deep as JSON allows; remembering such a record never fails the finish."""
    nested: dict = {}
    for _ in range(depth):
        nested = {"n": nested}
    kept = record("deep", RunStatus.COMPLETED, T + datetime.timedelta(hours=1), {"ok": 1})
    kept.parameters = nested
    cache = FinishedRuns()
    cache.remember(kept)  # held, or left out when too deep to copy: never an exception
    held = cache.get("deep", T)
    assert held is None or held.parameters == nested
    if depth == 50:
        assert held is not None


def test_what_it_holds_is_bounded_in_bytes(ndb_context):
    """Held pickled: a 16 KiB-of-JSON document of small dicts decodes to many times that, and
    1,024 of them must not fill an instance's memory."""
    later = T + datetime.timedelta(hours=1)
    cache = FinishedRuns(max_entries=50)
    rows = [{"a": i} for i in range(1300)]  # just under 16 KiB of JSON
    for index in range(60):
        cache.remember(record(f"r{index}", RunStatus.COMPLETED, later, rows))
    assert len(cache) == 50 and cache.held_bytes() <= 50 * cache.max_entry_bytes
    assert cache.get("r59", T).result == rows
    tight = FinishedRuns(max_entry_bytes=1000)
    tight.remember(record("rows", RunStatus.COMPLETED, later, rows))
    assert tight.get("rows", T) is None  # fits the JSON limit, not the byte limit


def test_the_cache_is_bounded_in_bytes_whatever_its_entry_count(ndb_context):
    """Issue 26 §4: 100,000 entries of the largest size would be 3.1 GiB on an F2's 768 MB."""
    later = T + datetime.timedelta(hours=1)
    one = len(pickle.dumps(record("probe", RunStatus.COMPLETED, later, {"x": "y" * 2000}), pickle.HIGHEST_PROTOCOL))
    cache = FinishedRuns(max_entries=100_000, max_bytes=5 * one)
    for i in range(20):
        cache.remember(record(f"r{i:02d}", RunStatus.COMPLETED, later, {"x": "y" * 2000}))
    assert cache.held_bytes() <= 5 * one and len(cache) == 5
    assert [cache.get(f"r{i:02d}", T) is not None for i in (14, 15, 19)] == [False, True, True]  # the oldest went
    cache.remember(record("r19", RunStatus.COMPLETED, later, {"x": "y" * 2000}))  # the same run again
    assert len(cache) == 5 and cache.held_bytes() <= 5 * one
    expired = FinishedRuns(max_bytes=10 * one)
    expired.remember(record("gone", RunStatus.COMPLETED, later, {"x": "y" * 2000}))
    assert expired.get("gone", later) is None and expired.held_bytes() == 0  # an expired entry gives its bytes back


@pytest.mark.parametrize(
    ("environ", "mib"),
    [
        ({}, 32),
        ({"DEDUP_FINISHED_CACHE_MIB": "0"}, 0),
        ({"DEDUP_FINISHED_CACHE_MIB": "192", "GAE_MEMORY_MB": "768"}, 192),
    ],
)
def test_the_cache_bytes_are_a_setting(environ, mib):
    from handlers import finished_cache_bytes_from_environ

    assert finished_cache_bytes_from_environ(environ) == mib * 2**20


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"DEDUP_FINISHED_CACHE_MIB": "193", "GAE_MEMORY_MB": "768"}, "at most 192"),  # an F2
        ({"DEDUP_FINISHED_CACHE_MIB": "100", "GAE_MEMORY_MB": "384"}, "at most 96"),  # an F1
        ({"DEDUP_FINISHED_CACHE_MIB": "2048"}, "1024"),
        ({"DEDUP_FINISHED_CACHE_MIB": "lots"}, "whole number"),
    ],
)
def test_a_cache_that_cannot_fit_the_instance_stops_the_app(environ, words):
    from handlers import SettingError, finished_cache_bytes_from_environ

    with pytest.raises(SettingError, match="DEDUP_FINISHED_CACHE_MIB") as refused:
        finished_cache_bytes_from_environ(environ)
    assert words in str(refused.value)
