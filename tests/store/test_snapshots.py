"""Snapshots: compare-and-swap, cursor rules, pruning that keeps cursors."""

import pytest
from django.test import override_settings

from memory_app.exceptions import InvalidCursor, InvalidSnapshot, SnapshotConflict
from memory_app.models import Message, Session


@pytest.fixture
def filled(mem):
    mem.add({"role": "system", "content": "be kind"})
    mem.add_many([{"role": "user", "content": f"m{i}"} for i in range(9)])
    return mem


def test_load_snapshot_returns_tail_after_it(filled):
    assert filled.load_snapshot() == (None, filled.messages())
    snap = filled.save_snapshot("first six", upto=6, prev=None)
    loaded, tail = filled.load_snapshot()
    assert loaded == snap and snap.version == 1
    assert [m.cursor for m in tail] == [7, 8, 9, 10]


def test_compare_and_swap_refuses_a_stale_prev(filled):
    v1 = filled.save_snapshot("s1", upto=3, prev=None)
    with pytest.raises(SnapshotConflict) as conflict:
        filled.save_snapshot("from a stale read", upto=5, prev=None)
    assert conflict.value.current == v1 and conflict.value.expected_version is None
    v2 = filled.save_snapshot("s2", upto=5, prev=v1)
    with pytest.raises(SnapshotConflict):
        filled.save_snapshot("lost update", upto=8, prev=v1)
    assert filled.save_snapshot("s3", upto=8, prev=v2.version).version == 3
    assert [s.version for s in filled.snapshots()] == [1, 2, 3]


def test_cursor_must_move_forward_and_stay_in_the_log(filled):
    v1 = filled.save_snapshot("s1", upto=4, prev=None)
    for bad in (4, 3, 11, 0):
        with pytest.raises(InvalidCursor):
            filled.save_snapshot("bad", upto=bad, prev=v1)
    with pytest.raises(InvalidCursor):
        filled.save_snapshot("bad", upto="soon", prev=v1)
    with pytest.raises(InvalidSnapshot):
        filled.save_snapshot("   ", upto=5, prev=v1)
    assert filled.latest_snapshot() == v1


def test_prune_deletes_covered_messages_and_keeps_cursors(filled):
    filled.add({"role": "user", "content": "keep me", "remember": True})  # cursor 11
    snap = filled.save_snapshot("summary", upto=8, prev=None)
    assert filled.prune_compacted() == 7  # m0..m6; the system prompt stays
    assert [m.cursor for m in filled.messages()] == [1, 9, 10, 11]
    filled.save_snapshot("summary 2", upto=11, prev=snap, prune=True)
    assert [m.content for m in filled.messages()] == ["be kind", "keep me"]
    session = Session.objects.get(pk=filled.id)
    assert session.message_count == 2 == Message.objects.filter(session=session).count()
    assert session.token_count == sum(m.tokens for m in filled.messages())
    assert filled.add({"role": "user", "content": "after"}).cursor == 12


@override_settings(MEMORY_APP={"PRUNE_COMPACTED": True})
def test_prune_setting(filled):
    filled.save_snapshot("summary", upto=5, prev=None)
    assert [m.cursor for m in filled.messages()] == [1, 6, 7, 8, 9, 10]
    filled.save_snapshot("s2", upto=6, prev=1, prune=False)
    assert 6 in [m.cursor for m in filled.messages()]


def test_tokens_since_snapshot_tracks_the_tail(filled):
    tail_tokens = lambda: Session.objects.get(pk=filled.id).tokens_since_snapshot  # noqa: E731
    assert tail_tokens() == sum(m.tokens for m in filled.messages())
    filled.save_snapshot("s", upto=7, prev=None)
    assert tail_tokens() == sum(m.tokens for m in filled.messages(after=7))
    extra = filled.add({"role": "user", "content": "more"})
    assert tail_tokens() == sum(m.tokens for m in filled.messages(after=7)) and extra.tokens > 0


def test_pinned_messages_are_validated(filled):
    with pytest.raises(Exception) as err:
        filled.save_snapshot("s", upto=3, prev=None, pinned=[{"role": "nobody"}])
    assert "role" in str(err.value)
    assert filled.latest_snapshot() is None
