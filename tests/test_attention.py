"""Issue 37 §1: the home page's attention-first order in one round trip, whatever the fleet.

Each audit share writes what its pass judged (models.attention_share); a page reads every
share's entity in one lookup, with one query of the pauses changed since, sent together.  Where
an entity is missing, describes other jobs or is stale, the index's keys-only queries answer:
never a wrong order for want of a pass.  On the real emulator, on both flavours.
"""

from __future__ import annotations

import datetime

import pytest
from google.cloud import ndb

from dedup.record_store import RecordStore
from devtools.latency_proxy import DelayingProxy
from devtools.rpc_counter import counting_client
from models.attention_share import AttentionShare
from models.audit import AuditMark
from models.schedule_pause import SchedulePauses
from schedules import attention
from schedules.attention import FRESH_SECONDS, Share, forget_share, members_of, needing_attention, note_share

NOW = datetime.datetime(2031, 3, 4, 12, 0, tzinfo=datetime.UTC)
AHEAD = NOW + datetime.timedelta(hours=3)
GONE = NOW - datetime.timedelta(hours=1)
MINUTE = datetime.timedelta(minutes=1)


def ids(n: int, start: int = 0) -> list[str]:
    return [f"acme/us-central1/job-{i:05d}" for i in range(start, start + n)]


def share_of(ordinal: int, history_ids: list[str]) -> Share:
    return Share(ordinal, history_ids[0], len(history_ids), members_of(history_ids))


def pause(history_id: str, paused: bool, changed_at: datetime.datetime) -> None:
    SchedulePauses(id=history_id, pauses=[], paused=paused, changed_at=changed_at).put()


@pytest.mark.both_emulators
def test_the_shares_entities_name_the_jobs_to_put_first(ndb_context):
    store = RecordStore.of_context()
    first, second = share_of(0, ids(3)), share_of(1, ids(2, 3))
    # Attention ahead, attention gone by (not first), none, a streak's FOREVER; a pause read by the pass.
    note_share(store, first, {ids(1)[0]: AHEAD, ids(1, 1)[0]: GONE, ids(1, 2)[0]: None}, [], NOW - MINUTE)
    note_share(store, second, {ids(1, 3)[0]: datetime.datetime(9999, 1, 1, tzinfo=datetime.UTC)}, ids(1, 4), NOW)
    assert needing_attention(store, [first, second], NOW) == {ids(1)[0], ids(1, 3)[0], ids(1, 4)[0]}
    # Only what the pass knew ahead of its read is stored: an attention that ended before it is not.
    entity = AttentionShare.key_for(0).get()
    assert set(entity.jobs) == {ids(1)[0]}
    assert needing_attention(store, [], NOW) == set()


@pytest.mark.both_emulators
def test_a_pause_or_resume_since_the_pass_is_seen_at_once_and_a_resume_keeps_a_judged_attention(ndb_context):
    store = RecordStore.of_context()
    share = share_of(0, ids(4))
    a, b, c, d = ids(4)
    note_share(store, share, {a: AHEAD}, [b, c], NOW - 10 * MINUTE)
    pause(a, False, NOW - MINUTE)  # resumed: its judged attention stays
    pause(b, False, NOW - MINUTE)  # resumed since the pass: no longer first
    pause(d, True, NOW - MINUTE)  # paused since the pass: first
    pause(c, True, NOW - 20 * MINUTE)  # paused before, as the pass read it
    assert needing_attention(store, [share], NOW) == {a, c, d}


@pytest.mark.both_emulators
def test_without_a_current_entity_for_every_share_the_index_answers(ndb_context):
    store = RecordStore.of_context()
    a, b, c = ids(3)
    # What the index holds: a's mark needs attention, c is paused (b's mark's attention has ended).
    AuditMark(id=a, checked_until=NOW, attention_until=AHEAD).put()
    AuditMark(id=b, checked_until=NOW, attention_until=GONE).put()
    pause(c, True, NOW - datetime.timedelta(days=2))
    by_index = {a, c}
    share = share_of(0, [a, b, c])
    assert needing_attention(store, [share], NOW) == by_index  # no entity yet: the first deploy
    stale = NOW - datetime.timedelta(seconds=FRESH_SECONDS + 1)
    note_share(store, share, {b: AHEAD}, [], stale)  # the audit has stopped passing
    assert needing_attention(store, [share], NOW) == by_index
    # scheduler.yaml splits otherwise now, or another version serves another: the same first job and
    # size with another job between them is told apart too.
    for other in (share_of(0, [b, a, c]), share_of(0, [a, b]), share_of(0, [a, ids(1, 9)[0], c])):
        note_share(store, other, {b: AHEAD}, [], NOW)
        assert needing_attention(store, [share], NOW) == by_index
    note_share(store, share, {b: AHEAD}, [], NOW)
    assert needing_attention(store, [share], NOW) == {b}  # current: what the pass judged
    assert needing_attention(store, [share, share_of(1, ids(1, 3))], NOW) == by_index  # one share of two missing
    forget_share(store, share)  # a pass that failed or raced another
    assert needing_attention(store, [share], NOW) == by_index


def test_more_pause_changes_since_the_passes_than_a_page_reads_and_the_index_answers(ndb_context, monkeypatch):
    store = RecordStore.of_context()
    monkeypatch.setattr(attention, "RECENT_CHANGES", 2)
    a, b, c = ids(3)
    share = share_of(0, [a, b, c])
    note_share(store, share, {}, [], NOW)
    for job in (a, b):
        pause(job, True, NOW)
    assert needing_attention(store, [share], NOW) == {a, b}  # two changes: read as they stand
    pause(c, False, NOW)  # three: the open pauses by the index
    SchedulePauses(id=b, pauses=[], paused=False, changed_at=None).put()  # (not a change the page can see)
    assert needing_attention(store, [share], NOW) == {a}


def page_calls(client: ndb.Client, counter, shares: list[Share]) -> tuple[int, int]:
    """The calls and round trips of finding the order: the fewest of three tries, since a thread
    descheduled between two sends makes calls sent together look sequential (only ever adding)."""
    tries = []
    with client.context():
        for _ in range(3):
            counter.wait_until_idle()
            counter.reset()
            needing_attention(RecordStore.of_context(), shares, NOW)
            counter.wait_until_idle()
            tries.append((counter.total, counter.sequential_round_trips()))
    return min(tries)


def test_the_order_costs_one_round_trip_whatever_the_number_needing_attention(datastore):
    host, port = datastore.host.rsplit(":", 1)
    with DelayingProxy(host, int(port), 20) as proxy:  # a round trip long against Python between sends
        client, counter = counting_client(datastore.project, proxy.host)
        order_costs(client, counter)


def order_costs(client: ndb.Client, counter) -> None:
    with client.context():
        store = RecordStore.of_context()
        few, many = [share_of(0, ids(1000))], [share_of(n, ids(1000, 1000 * n)) for n in range(3)]
        note_share(store, few[0], dict.fromkeys(ids(10), AHEAD), [], NOW)
        for share in many:
            note_share(store, share, dict.fromkeys(ids(1000, 1000 * share.ordinal), AHEAD), [], NOW)
        ndb.put_multi([AuditMark(id=job, checked_until=NOW, attention_until=AHEAD) for job in ids(3000)])
    # A lookup and a query, sent together: ten jobs needing attention or 3,000 alike.
    assert page_calls(client, counter, few) == (2, 1)
    assert page_calls(client, counter, many) == (2, 1)
    with client.context():
        ndb.delete_multi([AttentionShare.key_for(n) for n in range(3)])
    # Without the entities the index answers, a round trip per batch of keys: what they spare.
    calls, round_trips = page_calls(client, counter, many)
    assert calls > 4 and round_trips > 2


@pytest.mark.both_emulators
def test_a_slower_pass_never_undoes_what_a_later_one_wrote(ndb_context):
    store = RecordStore.of_context()
    a, b = ids(2)
    share = share_of(0, [a, b])
    note_share(store, share, {b: AHEAD}, [], NOW - MINUTE)  # the later pass's read
    note_share(store, share, {a: AHEAD}, [], NOW - 2 * MINUTE)  # a retried task's, written after it
    assert needing_attention(store, [share], NOW) == {b}
    note_share(store, share, {a: AHEAD}, [], NOW)  # the next pass
    assert needing_attention(store, [share], NOW) == {a}
