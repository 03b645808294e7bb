"""Per-owner export and erase through the adapter: one transaction, zero rows of the owner left
in any table, nobody else's rows touched, and no message loaded into memory to delete it."""

from __future__ import annotations

import json
import re
import threading

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from memory_app import Memory
from memory_app.exceptions import InvalidOwner, SessionNotFound
from memory_app.memory import ANY_OWNER
from memory_app.models import Message, Session

from .conftest import fill_owner

pytestmark = pytest.mark.django_db


def _owner_paths(model, prefix: str = "", depth: int = 0) -> list[str]:
    """Every lookup from ``model`` to a user through foreign keys (owner, session__owner, ...)."""
    paths = []
    for field in model._meta.get_fields():
        if not (field.many_to_one and field.concrete):
            continue
        if field.related_model is get_user_model():
            paths.append(prefix + field.name)
        elif field.related_model._meta.app_label == "memory_app" and depth < 3:
            paths += _owner_paths(field.related_model, f"{prefix}{field.name}__", depth + 1)
    return paths


def _whose(owner_id) -> dict:
    """Per memory_app model: a filter for the rows that belong to ``owner_id`` by any path."""
    filters = {}
    for model in apps.get_app_config("memory_app").get_models():
        paths = _owner_paths(model)
        assert paths, f"{model.__name__}: nothing says whose rows these are"
        q = Q()
        for path in paths:
            q |= Q(**{path: owner_id})
        filters[model] = q
    return filters


def owner_rows(owner_id) -> dict[str, int]:
    return {
        model.__name__: model.objects.filter(q).count() for model, q in _whose(owner_id).items()
    }


def everything_but(owner_id) -> dict[str, str]:
    """Every row of every memory_app table that does not belong to ``owner_id``, as text."""
    return {
        model.__name__: repr(list(model.objects.exclude(q).order_by("pk").values_list()))
        for model, q in _whose(owner_id).items()
    }


def all_rows() -> dict[str, str]:
    """Every row of every memory_app table, as text (to check that nothing changed)."""
    return everything_but(-1)


def test_erase_leaves_zero_rows_of_the_owner_and_touches_nobody_else(
    user, other_user, alice_memory, bob_memory
):
    Memory.create("service", owner=None).add({"role": "user", "content": "ownerless"})
    before = owner_rows(user.pk)
    assert before["Session"] == 2 and before["Message"] == 10 and before["Snapshot"] == 2
    others = everything_but(user.pk)

    erased = Memory.erase_owner(user)

    assert owner_rows(user.pk) == dict.fromkeys(before, 0)
    assert everything_but(user.pk) == others
    assert erased.as_dict() == {
        "sessions": 2,
        "messages": 10,
        "snapshots": 2,
        "embeddings": before.get("Embedding", 0),
        "checkpoints": 0,
        "checkpoint_blobs": 0,
        "checkpoint_writes": 0,
        "items": 0,
    }
    assert get_user_model().objects.filter(pk=user.pk).exists()  # the user stays; only memory goes
    # Erasing again finds nothing, and the owner can start afresh.
    assert Memory.erase_owner(user.pk).as_dict() == dict.fromkeys(erased.as_dict(), 0)
    assert Memory.create("chat-0", owner=user).add({"role": "user", "content": "hi"}).cursor == 1


def test_erase_is_one_transaction(user, alice_memory, bob_memory):
    before = owner_rows(user.pk)

    def fail_after_messages(table: str, rows: int) -> None:
        if table == "messages":
            raise RuntimeError("crash half-way")

    with pytest.raises(RuntimeError):
        Memory.erase_owner(user, progress=fail_after_messages)
    assert owner_rows(user.pk) == before
    assert [m.cursor for m in alice_memory[0].messages()] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("nobody", [None, ANY_OWNER, True])
def test_erase_and_export_need_an_owner(nobody, alice_memory):
    Memory.create("service", owner=None)
    with pytest.raises(InvalidOwner):
        Memory.erase_owner(nobody)
    with pytest.raises(InvalidOwner):
        Memory.export_owner(nobody)
    assert Session.objects.count() == 3


def _selects_from(queries, table: str) -> list[str]:
    pattern = re.compile(rf'^\s*SELECT\b(?:(?!\bFROM\b).)*\bFROM\s+"?{table}"?', re.S | re.I)
    return [q["sql"] for q in queries if pattern.search(q["sql"])]


@pytest.mark.parametrize("operation", ["clear", "delete", "erase"])
def test_deleting_never_loads_the_messages(user, operation):
    table = Message._meta.db_table
    statements = {}
    for size in (3, 600):
        memory = Memory.create(f"s-{size}", owner=user)
        memory.add_many([{"role": "user", "content": f"m{i}"} for i in range(size)])
        with CaptureQueriesContext(connection) as queries:
            if operation == "erase":
                Memory.erase_owner(user)
            else:
                getattr(memory, operation)()
        assert _selects_from(queries.captured_queries, table) == []
        statements[size] = len(queries.captured_queries)
        assert Message.objects.filter(session_id=memory.id).count() == 0
    # The same statements whatever the session's length.
    assert statements[3] == statements[600]


def test_clear_keeps_the_session_and_its_cursor(user):
    memory = fill_owner(user, sessions=1)[0]
    memory.clear()
    assert owner_rows(user.pk) == {**dict.fromkeys(owner_rows(user.pk), 0), "Session": 1}
    assert memory.info().metadata == {}
    assert memory.add({"role": "user", "content": "again"}).cursor == 6


def test_delete_of_a_deleted_session_is_harmless(user):
    memory = Memory.create("gone", owner=user)
    memory.delete()
    memory.delete()
    with pytest.raises(SessionNotFound):
        Memory.get(memory.id, owner=user)


# -- export -------------------------------------------------------------------------------------


def test_export_owner_holds_every_session_of_the_owner_and_nothing_else(
    user, other_user, alice_memory, bob_memory
):
    exported = Memory.export_owner(user)
    assert (exported["format"], exported["version"], exported["owner"]) == (
        "memory_app.owner",
        1,
        {"id": user.pk},
    )
    assert [s["session"]["key"] for s in exported["sessions"]] == ["chat-0", "chat-1"]
    # Each session is exactly what SessionMemory.export() gives.
    assert exported["sessions"] == [m.export() for m in alice_memory]
    text = json.dumps(exported)
    assert str(bob_memory[0].id) not in text and "vector" not in text and "test-model" not in text


def test_streamed_export_equals_the_export_at_any_batch_size(user, alice_memory):
    whole = Memory.export_owner(user)
    for batch_size in (1, 2, 1000):
        chunks = list(Memory.iter_owner_export(user, batch_size=batch_size))
        streamed = json.loads("".join(chunks))
        assert streamed | {"exported_at": None} == whole | {"exported_at": None}
    assert len(list(Memory.iter_owner_export(user, batch_size=1))) > len(
        list(Memory.iter_owner_export(user, batch_size=1000))
    )


def test_an_owner_export_restores_session_by_session(user, other_user, alice_memory):
    exported = Memory.export_owner(user)
    Memory.erase_owner(user)
    for data in exported["sessions"]:
        Memory.import_session(data, owner=user)

    def comparable(export: dict) -> list:
        # A restored session has a new id and is updated now; everything else is as it was.
        return [
            {**s, "session": {**s["session"], "id": None, "updated_at": None}}
            for s in export["sessions"]
        ]

    assert comparable(Memory.export_owner(user)) == comparable(exported)


def test_an_empty_owner_exports_no_sessions(other_user):
    assert Memory.export_owner(other_user)["sessions"] == []


# -- concurrency ---------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_append_racing_an_erase_is_erased_or_refused(make_user):
    owner = make_user("racer")
    memory = Memory.create("busy", owner=owner)
    memory.add({"role": "user", "content": "first"})
    erasing, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def erase():
        def pause(table, rows):
            if table == "embeddings":  # the sessions are locked by now
                erasing.set()
                release.wait(10)

        try:
            outcome["erased"] = Memory.erase_owner(owner, progress=pause)
        finally:
            connection.close()

    def append():
        try:
            Memory.get(memory.id, owner=owner).add({"role": "user", "content": "late"})
            outcome["append"] = "stored"
        except SessionNotFound:
            outcome["append"] = "refused"
        finally:
            connection.close()

    eraser = threading.Thread(target=erase)
    eraser.start()
    assert erasing.wait(10)
    appender = threading.Thread(target=append)
    appender.start()
    appender.join(0.5)
    assert appender.is_alive()  # waiting for the erase's lock on the session
    release.set()
    eraser.join(10)
    appender.join(10)
    assert outcome == {"erased": outcome["erased"], "append": "refused"}
    assert outcome["erased"].messages == 1
    assert owner_rows(owner.pk) == dict.fromkeys(owner_rows(owner.pk), 0)


def test_memory_prune_deletes_without_loading_messages(user):
    import datetime as dt

    from django.core.management import call_command

    expired = fill_owner(user, sessions=1)[0]
    expired.update(expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    kept = fill_owner(user, sessions=1, prefix="kept")[0]
    with CaptureQueriesContext(connection) as queries:
        call_command("memory_prune", "--no-progress")
    assert _selects_from(queries.captured_queries, Message._meta.db_table) == []
    assert [s.key for s in Memory.sessions(owner=user)] == ["kept-0"]
    assert Message.objects.filter(session_id=expired.id).count() == 0
    assert kept.count() == 5
