"""Sessions: keys, owners, listing, metadata, clearing, deleting, retention."""

import datetime as dt

import pytest
from django.core.management import call_command
from django.utils import timezone

from memory_app import Memory
from memory_app.exceptions import InvalidCursor, InvalidSession, SessionExists, SessionNotFound
from memory_app.memory import ANY_OWNER
from memory_app.models import Embedding, Message, Session, Snapshot


def test_key_is_unique_per_owner_and_namespace(db, user, other_user):
    a = Memory.session("k", owner=user)
    assert Memory.session("k", owner=user).id == a.id
    assert Memory.session("k", owner=other_user).id != a.id
    assert Memory.session("k", owner=user, namespace="other-agent").id != a.id
    with pytest.raises(SessionExists):
        Memory.create("k", owner=user)


def test_ownerless_keys_collide_with_each_other(db):
    a = Memory.session("shared")
    assert Memory.session("shared").id == a.id
    with pytest.raises(SessionExists):
        Memory.create("shared")
    assert Session.objects.filter(key="shared").count() == 1


def test_missing_session_without_create(db, user):
    with pytest.raises(SessionNotFound):
        Memory.session("nope", owner=user, create=False)


def test_session_ids_are_uuids_scoped_by_owner(db, user, other_user):
    mine = Memory.session("k", owner=user)
    assert Memory.get(mine.id, owner=user).id == mine.id
    assert Memory.get(str(mine.id), owner=ANY_OWNER).id == mine.id
    for owner in (other_user, None):
        with pytest.raises(SessionNotFound):
            Memory.get(mine.id, owner=owner)
    with pytest.raises(SessionNotFound):
        Memory.get("not-a-uuid", owner=user)


def test_sessions_listing_newest_first_with_snapshot_flag(db, user, other_user):
    old = Memory.session("old", owner=user, title="Old chat")
    new = Memory.session("new", owner=user, title="New chat")
    Memory.session("theirs", owner=other_user)
    new.add({"role": "user", "content": "hi"})
    old.add({"role": "user", "content": "again"})
    old.save_snapshot("s", upto=1, prev=None)
    listing = Memory.sessions(owner=user)
    assert [s.key for s in listing] == ["old", "new"]
    assert [(s.title, s.message_count, s.has_snapshot) for s in listing] == [
        ("Old chat", 1, True),
        ("New chat", 1, False),
    ]
    assert Memory.sessions(owner=user, namespace="elsewhere") == []


def test_invalid_session_fields(db):
    for kwargs in (
        {"key": ""},
        {"key": "x" * 256},
        {"key": "k", "namespace": ""},
        {"key": "k", "metadata": [1]},
        {"key": "k", "title": 5},
    ):
        with pytest.raises(InvalidSession):
            Memory.session(**kwargs)


def test_meta_and_title(mem):
    assert mem.meta == {}
    mem.set_meta("lang", "en")
    mem.set_meta("tier", {"name": "gold"})
    assert mem.meta == {"lang": "en", "tier": {"name": "gold"}}
    mem.set_meta("lang", "")
    assert mem.meta == {"tier": {"name": "gold"}}
    mem.set_title("Trip to Norway")
    assert mem.title == "Trip to Norway" == Session.objects.get(pk=mem.id).title
    with pytest.raises(InvalidSession):
        mem.set_meta("", "x")


def test_clear_removes_everything_but_cursors_never_repeat(mem):
    stored = mem.add_many([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    mem.save_snapshot("s", upto=1, prev=None)
    mem.set_meta("k", "v")
    Embedding.objects.create(
        message_id=stored[0].id,
        session_id=mem.id,
        cursor=stored[0].cursor,
        role=stored[0].role,
        model="m",
        dimensions=3,
        vector=[1, 0, 0],
    )
    mem.clear()
    assert mem.messages() == [] and mem.latest_snapshot() is None and mem.meta == {}
    assert not Embedding.objects.exists()
    assert mem.count() == 0 and Session.objects.get(pk=mem.id).token_count == 0
    assert mem.add({"role": "user", "content": "fresh"}).cursor == 3


def test_delete_session_and_owner_cascade(db, make_user):
    owner = make_user()
    mem = Memory.session("k", owner=owner)
    mem.add({"role": "user", "content": "x"})
    mem.save_snapshot("s", upto=1, prev=None)
    owner.delete()
    assert (
        not Session.objects.exists()
        and not Message.objects.exists()
        and not Snapshot.objects.exists()
    )
    other = Memory.session("k2")
    other.delete()
    assert not Session.objects.exists()


def test_reading_by_cursor(mem):
    mem.add_many([{"role": "user", "content": str(i)} for i in range(10)])
    assert [m.cursor for m in mem.messages(after=7)] == [8, 9, 10]
    assert [m.cursor for m in mem.messages(after=2, limit=3)] == [3, 4, 5]
    assert [m.cursor for m in mem.last(2)] == [9, 10]
    assert mem.get_message(4).content == "3"
    for bad in (-1, "x", 1.5, True):
        with pytest.raises(InvalidCursor):
            mem.messages(after=bad)
    with pytest.raises(InvalidCursor):
        mem.get_message(99)


def test_memory_prune_command(db, user, capsys):
    now = timezone.now()
    expired = Memory.session("expired", owner=user, expires_at=now - dt.timedelta(minutes=1))
    expired.add({"role": "user", "content": "x"})
    Memory.session("future", owner=user, expires_at=now + dt.timedelta(days=1))
    idle = Memory.session("idle", owner=user)
    Session.objects.filter(pk=idle.id).update(updated_at=now - dt.timedelta(days=100))
    Memory.session("fresh", owner=user)

    call_command("memory_prune", "--dry-run")
    assert "1 session(s) would be deleted" in capsys.readouterr().out
    assert Session.objects.count() == 4
    call_command("memory_prune", "--no-progress")
    assert set(Session.objects.values_list("key", flat=True)) == {"future", "idle", "fresh"}
    call_command("memory_prune", "--idle", "90d", "--batch-size", "1", "--no-progress")
    assert set(Session.objects.values_list("key", flat=True)) == {"future", "fresh"}
    assert not Message.objects.exists()
