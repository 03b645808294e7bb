"""``SessionMemory.pop_last``: undo the newest message without ever reusing its cursor."""

import pytest

from memory_app.exceptions import InvalidCursor, SessionNotFound
from memory_app.models import Session


def counters(mem):
    s = Session.objects.get(pk=mem.id)
    return s.message_count, s.token_count, s.tokens_since_snapshot, s.next_seq


def test_pop_returns_the_newest_and_never_reuses_its_cursor(mem):
    assert mem.pop_last() is None  # empty log
    first, second = mem.add_many(
        [{"role": "user", "content": "keep me"}, {"role": "assistant", "content": "pop me"}]
    )
    popped = mem.pop_last()
    assert (popped.cursor, popped.content) == (second.cursor, "pop me")
    assert [m.content for m in mem.messages()] == ["keep me"]
    assert counters(mem) == (1, first.tokens, first.tokens, 3)
    # The popped cursor is a gap from now on: the next message gets a fresh one.
    assert mem.add({"role": "assistant", "content": "again"}).cursor == 3
    with pytest.raises(InvalidCursor):
        mem.get_message(2)


def test_pop_below_a_snapshot_leaves_the_tokens_after_it_alone(mem):
    a, b = mem.add_many(
        [{"role": "user", "content": "one two"}, {"role": "user", "content": "three"}]
    )
    mem.save_snapshot("summary", upto=b.cursor)
    assert counters(mem)[2] == 0
    assert mem.pop_last().cursor == b.cursor
    assert counters(mem) == (1, a.tokens, 0, 3)


def test_pop_on_a_deleted_session_is_a_typed_error(mem):
    mem.add({"role": "user", "content": "x"})
    Session.objects.filter(pk=mem.id).delete()
    with pytest.raises(SessionNotFound):
        mem.pop_last()
