"""The async twins do what the sync methods do."""

import asyncio

import pytest

from memory_app import Memory
from memory_app.exceptions import SnapshotConflict


@pytest.mark.django_db(transaction=True)
def test_async_twins(make_user):
    # The twins run the ORM in a worker thread: committed data (transaction=True) is visible there.
    asyncio.run(scenario(make_user()))


async def close_thread_connections():
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(connections.close_all)()


async def scenario(owner):
    mem = await Memory.asession("async", owner=owner)
    first = await mem.aadd({"role": "user", "content": "hi"})
    batch = await mem.aadd_many(
        [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    )
    assert [first.cursor, *(m.cursor for m in batch)] == [1, 2, 3]
    assert [m.content for m in await mem.amessages(after=1)] == ["hello", "bye"]
    assert [m.cursor for m in await mem.alast(1)] == [3]
    assert await mem.acount() == 3
    window = await mem.awindow(max_messages=2)
    assert [m["content"] for m in window] == ["hello", "bye"]
    snap = await mem.asave_snapshot("greeting", upto=2, prev=None)
    with pytest.raises(SnapshotConflict):
        await mem.asave_snapshot("again", upto=3, prev=None)
    assert (await mem.aload_snapshot())[0] == snap
    await mem.aset_meta("k", "v")
    assert await mem.ameta() == {"k": "v"}
    assert [s.key for s in await Memory.asessions(owner=owner)] == ["async"]
    data = await mem.aexport()
    await mem.aclear()
    assert await mem.acount() == 0
    copy = await Memory.aimport_session(data, key="copy", owner=owner)
    assert await copy.acount() == 3
    await copy.adelete()
    await close_thread_connections()
