"""Reading the log a page at a time, forwards and backwards, by cursor."""

import pytest
from asgiref.sync import async_to_sync

from memory_app.exceptions import InvalidCursor


@pytest.fixture
def ten(mem):
    mem.add_many([{"role": "user", "content": f"m{i}"} for i in range(1, 11)])
    return mem


def contents(messages):
    return [m.content for m in messages]


def test_before_with_limit_returns_the_nearest_older_messages_oldest_first(ten):
    assert [m.cursor for m in ten.messages(before=8, limit=3)] == [5, 6, 7]
    assert contents(ten.messages(before=3, limit=5)) == ["m1", "m2"]
    assert ten.messages(before=1, limit=5) == []


def test_before_without_limit_returns_everything_older(ten):
    assert [m.cursor for m in ten.messages(before=4)] == [1, 2, 3]


def test_after_and_before_bound_a_range_and_limit_keeps_its_start(ten):
    assert [m.cursor for m in ten.messages(after=2, before=9)] == [3, 4, 5, 6, 7, 8]
    assert [m.cursor for m in ten.messages(after=2, before=9, limit=2)] == [3, 4]


def test_paging_backwards_then_forwards_visits_every_message_once(ten):
    seen, before = [], None
    while True:
        page = ten.messages(before=before, limit=4) if before else ten.last(4)
        if not page:
            break
        seen[:0] = [m.cursor for m in page]
        before = page[0].cursor
    assert seen == list(range(1, 11))
    forward, after = [], 0
    while page := ten.messages(after=after, limit=4):
        forward += [m.cursor for m in page]
        after = page[-1].cursor
    assert forward == seen


def test_before_must_be_a_cursor(ten):
    with pytest.raises(InvalidCursor):
        ten.messages(before=-1, limit=2)
    with pytest.raises(InvalidCursor):
        ten.messages(before="x")


def test_cursor_range_follows_pruning_and_clearing(ten):
    assert ten.cursor_range() == (1, 10)
    ten.save_snapshot("first four", upto=4, prune=True)
    assert ten.cursor_range() == (5, 10)
    ten.clear()
    assert ten.cursor_range() is None
    ten.add({"role": "user", "content": "again"})
    assert ten.cursor_range() == (11, 11)


def test_async_twins_page_backwards(ten):
    async def read():
        return await ten.amessages(before=6, limit=2), await ten.acursor_range()

    page, bounds = async_to_sync(read)()
    assert [m.cursor for m in page] == [4, 5]
    assert bounds == (1, 10)


def test_the_newest_snapshots_and_every_range(ten):
    for version, upto in enumerate((2, 5, 7, 9), start=1):
        ten.save_snapshot(f"summary {version}", upto=upto, prev=version - 1 or None)
    assert [s.version for s in ten.snapshots(newest=2)] == [3, 4]
    assert [s.version for s in ten.snapshots(newest=10)] == [1, 2, 3, 4]
    assert [s.version for s in ten.snapshots()] == [1, 2, 3, 4]
    assert ten.snapshot_ranges() == [(1, 2), (2, 5), (3, 7), (4, 9)]
    with pytest.raises(InvalidCursor):
        ten.snapshots(newest=-1)
