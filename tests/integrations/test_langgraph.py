"""DjangoSaver under real LangGraph graphs: interrupts and resume (sync and async), a thread
resumed by a new process-like saver, owner isolation, erase, retention, encryption at rest, and
typed errors for bad input."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from langgraph.checkpoint.base.id import uuid6
from langgraph.types import Command

from memory_app import Memory
from memory_app.exceptions import InvalidCheckpoint, InvalidCursor
from memory_app.integrations.langgraph import DjangoSaver
from memory_app.models import Checkpoint, CheckpointBlob, CheckpointWrite, Session
from memory_app.services import retention
from tests.integrations.graphs import planning_graph, run_async

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def thread(key: str) -> dict:
    return {"configurable": {"thread_id": key}}


def test_a_graph_interrupts_and_a_new_saver_resumes_it(user):
    first = planning_graph(DjangoSaver(owner=user, namespace="trips"))
    paused = first.invoke({"log": [], "approved": False}, thread("trip-1"))
    assert paused["__interrupt__"][0].value == {"question": "book it?", "so_far": ["planned"]}

    # Another saver (as in another process) finds the paused thread and resumes it.
    second = planning_graph(DjangoSaver(owner=user, namespace="trips"))
    assert second.get_state(thread("trip-1")).next == ("approve",)
    done = second.invoke(Command(resume="yes"), thread("trip-1"))
    assert done["log"] == ["planned", "human said yes", "booked"]
    assert second.get_state(thread("trip-1")).next == ()

    # The thread is the session trip-1 of its owner and namespace.
    session = Session.objects.get(owner=user, namespace="trips", key="trip-1")
    assert Checkpoint.objects.filter(session=session).count() == len(
        list(second.get_state_history(thread("trip-1")))
    )


def test_the_async_graph_interrupts_and_resumes(user):
    async def scenario():
        graph = planning_graph(DjangoSaver(owner=user, namespace="trips"))
        paused = await graph.ainvoke({"log": [], "approved": False}, thread("trip-a"))
        assert "__interrupt__" in paused
        state = await graph.aget_state(thread("trip-a"))
        assert state.next == ("approve",)
        done = await graph.ainvoke(Command(resume="no"), thread("trip-a"))
        history = [s async for s in graph.aget_state_history(thread("trip-a"))]
        return done, history

    done, history = run_async(scenario())
    assert done["log"] == ["planned", "human said no", "cancelled"]
    assert len(history) >= 4 and history[0].next == ()


def test_running_a_thread_twice_continues_its_state(user):
    graph = planning_graph(DjangoSaver(owner=user, namespace="trips"))
    graph.invoke({"log": [], "approved": False}, thread("twice"))
    graph.invoke(Command(resume="yes"), thread("twice"))
    again = planning_graph(DjangoSaver(owner=user, namespace="trips"))
    again.invoke({"log": ["second trip"], "approved": False}, thread("twice"))
    state = again.get_state(thread("twice"))
    assert state.values["log"] == [
        "planned",
        "human said yes",
        "booked",
        "second trip",
        "planned",
    ]


def test_another_owner_never_sees_the_thread(user, other_user):
    planning_graph(DjangoSaver(owner=user, namespace="trips")).invoke(
        {"log": [], "approved": False}, thread("private")
    )
    theirs = DjangoSaver(owner=other_user, namespace="trips")
    assert theirs.get_tuple(thread("private")) is None
    assert list(theirs.list(None)) == []
    assert list(DjangoSaver(owner=None, namespace="trips").list(None)) == []
    # Their own thread of the same name is a different session.
    planning_graph(theirs).invoke({"log": ["bob"], "approved": False}, thread("private"))
    mine = DjangoSaver(owner=user, namespace="trips").get_tuple(thread("private"))
    assert mine.checkpoint["channel_values"]["log"] == ["planned"]
    # Deleting, pruning and run deletes of the other owner do not reach mine.
    theirs.delete_thread("private")
    theirs.prune(["private"], strategy="delete")
    mine = DjangoSaver(owner=user, namespace="trips")
    theirs.delete_for_runs(
        [t.metadata["run_id"] for t in mine.list(None) if "run_id" in t.metadata]
    )
    assert DjangoSaver(owner=user, namespace="trips").get_tuple(thread("private")) is not None


def test_erase_owner_and_session_delete_remove_checkpoints(user, other_user):
    for owner in (user, other_user):
        planning_graph(DjangoSaver(owner=owner, namespace="trips")).invoke(
            {"log": [], "approved": False}, thread("erase-me")
        )
    theirs = Checkpoint.objects.filter(session__owner=other_user).count()
    assert Checkpoint.objects.filter(session__owner=user).exists()

    erased = Memory.erase_owner(user)

    assert erased.checkpoints > 0 and erased.checkpoint_blobs > 0
    for model in (Checkpoint, CheckpointBlob, CheckpointWrite):
        assert not model.objects.filter(session__owner=user).exists()
    assert Checkpoint.objects.filter(session__owner=other_user).count() == theirs

    session = Session.objects.get(owner=other_user, key="erase-me")
    Memory.get(session.pk, owner=other_user).delete()
    assert not CheckpointBlob.objects.filter(session_id=session.pk).exists()
    assert not CheckpointWrite.objects.filter(session_id=session.pk).exists()


def test_retention_keeps_the_latest_checkpoints_and_the_thread_resumes(user, settings):
    settings.MEMORY_APP = {"RETENTION": {"trips": {"max_checkpoints": 1}}}
    graph = planning_graph(DjangoSaver(owner=user, namespace="trips"))
    graph.invoke({"log": [], "approved": False}, thread("long"))
    kept_elsewhere = planning_graph(DjangoSaver(owner=user, namespace="elsewhere"))
    kept_elsewhere.invoke({"log": [], "approved": False}, thread("long"))
    before = Checkpoint.objects.filter(session__namespace="trips").count()
    elsewhere = Checkpoint.objects.filter(session__namespace="elsewhere").count()
    assert before > 1

    report = retention.apply_retention()

    assert report["checkpoints"] == {"sessions": 1, "checkpoints": before - 1, "batches": 1}
    assert Checkpoint.objects.filter(session__namespace="trips").count() == 1
    assert Checkpoint.objects.filter(session__namespace="elsewhere").count() == elsewhere
    # The latest checkpoint kept its values and its pending interrupt: the thread resumes.
    done = graph.invoke(Command(resume="yes"), thread("long"))
    assert done["log"] == ["planned", "human said yes", "booked"]
    # Values no kept checkpoint names are gone with the checkpoints that named them.
    session = Session.objects.get(owner=user, namespace="trips", key="long")
    retention.apply_retention()
    named = {
        (channel, str(version))
        for checkpoint in Checkpoint.objects.filter(session=session).values_list(
            "checkpoint", flat=True
        )
        for channel, version in checkpoint["channel_versions"].items()
    }
    stored = set(CheckpointBlob.objects.filter(session=session).values_list("channel", "version"))
    assert stored == named


def test_channel_values_and_writes_are_encrypted_at_rest(user, settings):
    settings.MEMORY_APP = {"ENCRYPTION_KEYS": [Fernet.generate_key().decode()]}
    secret = "passport number X1234567"
    graph = planning_graph(DjangoSaver(owner=user, namespace="trips"))
    graph.invoke({"log": [secret], "approved": False}, thread("secret"))

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT blob FROM {CheckpointBlob._meta.db_table} WHERE blob IS NOT NULL "
            f"UNION ALL SELECT blob FROM {CheckpointWrite._meta.db_table} WHERE blob IS NOT NULL"
        )
        raw = [bytes(row[0]) for row in cursor.fetchall()]
    raw = [r for r in raw if r]  # empty values stay empty
    assert raw and all(r.startswith(b"enc:fernet:") for r in raw)
    assert not any(b"X1234567" in r for r in raw)
    state = graph.get_state(thread("secret"))
    assert state.values["log"][0] == secret


def test_a_put_is_one_statement_that_keeps_the_thread_alive(user, settings):
    settings.MEMORY_APP = {"RETENTION": {"trips": {"ttl": "2d", "sliding": True}}}
    saver = DjangoSaver(owner=user, namespace="trips")
    graph = planning_graph(saver)
    graph.invoke({"log": [], "approved": False}, thread("alive"))
    session = Session.objects.get(owner=user, namespace="trips", key="alive")
    Session.objects.filter(pk=session.pk).update(
        updated_at=session.updated_at - dt.timedelta(days=1), expires_at=None
    )
    latest = saver.get_tuple(thread("alive"))
    checkpoint = {**latest.checkpoint, "id": str(uuid6(clock_seq=-2))}  # as LangGraph makes them

    with CaptureQueriesContext(connection) as queries:
        saver.put(latest.config, checkpoint, {"step": 99}, {"log": "99.0"})
    # The thread's session found by its key, the values, the checkpoint and the session's
    # updated_at in one statement: no transaction of its own, no round trip per table.
    assert len(queries) == 1, [q["sql"][:60] for q in queries]

    stored = Checkpoint.objects.get(session=session, checkpoint_id=checkpoint["id"])
    assert stored.parent_checkpoint_id == latest.config["configurable"]["checkpoint_id"]
    assert stored.metadata["step"] == 99
    assert CheckpointBlob.objects.filter(session=session, channel="log", version="99.0").exists()
    session.refresh_from_db()
    assert timezone.now() - session.updated_at < dt.timedelta(minutes=1)
    assert dt.timedelta(days=1, hours=23) < session.expires_at - timezone.now() <= dt.timedelta(2)
    # Stored again (a retried step): the checkpoint is updated, its values kept.
    saver.put(latest.config, checkpoint, {"step": 100}, {"log": "99.0"})
    assert (
        Checkpoint.objects.get(session=session, checkpoint_id=checkpoint["id"]).metadata["step"]
        == 100
    )
    assert (
        CheckpointBlob.objects.filter(session=session, channel="log", version="99.0").count() == 1
    )
    # A task's writes: one statement too.
    config = {"configurable": {**latest.config["configurable"], "checkpoint_id": checkpoint["id"]}}
    with CaptureQueriesContext(connection) as queries:
        saver.put_writes(config, [("log", ["w"]), ("approved", True)], "task-1")
    assert len(queries) == 1, [q["sql"][:60] for q in queries]
    # And a checkpoint is read with its values and writes in one statement.
    with CaptureQueriesContext(connection) as queries:
        read = saver.get_tuple(config)
    assert len(queries) == 1, [q["sql"][:60] for q in queries]
    assert read.checkpoint["channel_values"]["log"] == latest.checkpoint["channel_values"]["log"]
    assert [w[1:] for w in saver.get_tuple(config).pending_writes] == [
        ("log", ["w"]),
        ("approved", True),
    ]
    # Listing a thread: one statement per page of checkpoints, with their values and writes.
    with CaptureQueriesContext(connection) as queries:
        listed = list(saver.list(thread("alive"), limit=3))
    assert len(queries) == 1, [q["sql"][:60] for q in queries]
    assert [t.config["configurable"]["checkpoint_id"] for t in listed][0] == checkpoint["id"]
    assert listed[0].pending_writes == read.pending_writes
    assert [t.metadata["step"] for t in saver.list(thread("alive"), filter={"step": 100})] == [100]
    # The same thread key without an owner is another thread (a session of its own, created
    # on its first put), and the owner's thread is untouched by it.
    ownerless = DjangoSaver(owner=None, namespace="trips")
    ownerless.put(thread("alive"), checkpoint, {"step": 1}, {"log": "1.0"})
    assert Session.objects.filter(owner=None, namespace="trips", key="alive").count() == 1
    assert ownerless.get_tuple(thread("alive")).metadata["step"] == 1
    assert saver.get_tuple(thread("alive")).metadata["step"] == 100


@pytest.mark.parametrize(
    "config, field",
    [
        ({}, "config"),
        ({"configurable": {}}, "thread_id"),
        ({"configurable": {"thread_id": ""}}, "thread_id"),
        ({"configurable": {"thread_id": "x" * 256}}, "thread_id"),
        ({"configurable": {"thread_id": "t\x00"}}, "thread_id"),
        ({"configurable": {"thread_id": "t", "checkpoint_ns": 5}}, "checkpoint_ns"),
        ({"configurable": {"thread_id": "t", "checkpoint_id": "c" * 65}}, "checkpoint_id"),
    ],
)
def test_bad_configs_are_typed_errors_and_store_nothing(user, config, field):
    saver = DjangoSaver(owner=user)
    checkpoint = {"v": 1, "id": "1", "ts": "", "channel_values": {}, "channel_versions": {}}
    checkpoint["versions_seen"] = {}
    for call in (
        lambda: saver.get_tuple(config),
        lambda: saver.put(config, checkpoint, {}, {}),
        lambda: saver.put_writes(config, [("ch", 1)], "task"),
    ):
        with pytest.raises(InvalidCheckpoint) as err:
            call()
        assert err.value.field == field
    assert not Checkpoint.objects.exists() and not Session.objects.exists()


def test_bad_values_are_typed_errors(user):
    saver = DjangoSaver(owner=user)
    good = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = {"v": 1, "id": "cp-1", "ts": "", "channel_versions": {}, "versions_seen": {}}
    with pytest.raises(InvalidCheckpoint) as err:
        saver.put(good, checkpoint, {"nested": {"bad": "\x00"}}, {})
    assert err.value.field == "metadata"
    with pytest.raises(InvalidCheckpoint) as err:
        saver.put(good, {**checkpoint, "id": ""}, {}, {})
    assert err.value.field == "checkpoint.id"
    with pytest.raises(InvalidCheckpoint) as err:
        saver.put(good, {**checkpoint, "channel_values": {"x" * 300: 1}}, {}, {"x" * 300: 1})
    assert err.value.field == "channel"
    with pytest.raises(InvalidCheckpoint) as err:
        saver.put_writes(good, [("ch", 1)], "task")
    assert err.value.field == "checkpoint_id"
    with pytest.raises(InvalidCheckpoint) as err:
        saver.prune(["t"], strategy="keep_some")
    assert err.value.field == "strategy"
    with pytest.raises(InvalidCheckpoint) as err:
        list(saver.list(good, filter="source=input"))
    assert err.value.field == "filter"
    with pytest.raises(InvalidCursor) as err:
        list(saver.list(good, limit=-1))
    assert err.value.field == "limit"
    assert not Checkpoint.objects.exists()


def test_export_owner_holds_the_owners_checkpoints_and_items_only(user, other_user):
    import base64

    from memory_app.integrations.langgraph import DjangoStore

    for owner, word in ((user, "alice-trip"), (other_user, "bob-trip")):
        planning_graph(DjangoSaver(owner=owner, namespace="trips")).invoke(
            {"log": [word], "approved": False}, thread("exported")
        )
        DjangoStore(owner=owner).put(("prefs",), "name", {"text": word})

    exported = Memory.export_owner(user)

    assert [i["value"] for i in exported["items"]] == [{"text": "alice-trip"}]
    assert exported["items"][0]["namespace"] == ["prefs"]
    stored = Checkpoint.objects.filter(session__owner=user).count()
    assert len(exported["checkpoints"]) == stored > 0
    assert {c["thread_id"] for c in exported["checkpoints"]} == {"exported"}
    values = b"".join(
        base64.b64decode(v["base64"])
        for c in exported["checkpoints"]
        for v in c["channel_values"].values()
    )
    assert b"alice-trip" in values and b"bob-trip" not in values
    assert any(c["pending_writes"] for c in exported["checkpoints"])  # the interrupt
