"""Threads of one process appending to one session at once: their appends are combined into
fewer statements (COMBINE_APPENDS), with the same guarantees as appends made one by one."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from memory_app import Memory
from memory_app.exceptions import SessionNotFound
from memory_app.models import Message, Session
from memory_app.store import log

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 16


def run_threads(target, count: int = THREADS) -> list[BaseException]:
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as err:  # checked by the caller, after every thread has finished
            errors.append(err)
        finally:
            connection.close()  # each thread has a connection of its own

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_threads_on_one_session_share_statements_and_keep_every_guarantee():
    mem = Memory.session("combined", namespace="reliability")
    told: dict[int, list] = {}

    def appender(i: int) -> None:
        session = Memory.get(mem.id)
        told[i] = []
        for j in range(15):
            if j % 3 == 2:
                batch = [{"role": "user", "content": f"t{i} m{j} part{k}"} for k in range(3)]
                told[i].append((batch, session.add_many(batch)))
            else:
                message = {"role": "user", "content": f"t{i} m{j}"}
                told[i].append(([message], [session.add(message)]))

    assert run_threads(appender) == []
    stored = list(
        Message.objects.filter(session_id=mem.id)
        .order_by("seq")
        .values_list("seq", "content", "created_at")
    )
    total = THREADS * (10 + 5 * 3)
    assert [seq for seq, _, _ in stored] == list(range(1, total + 1))  # gapless, nothing lost
    by_cursor = {seq: content for seq, content, _ in stored}
    for calls in told.values():
        for sent, returned in calls:
            cursors = [m.cursor for m in returned]
            # Each caller was told where its own messages are; a batch stays contiguous.
            assert [by_cursor[c] for c in cursors] == [m["content"] for m in sent]
            assert cursors == list(range(cursors[0], cursors[0] + len(sent)))
        firsts = [returned[0].cursor for _, returned in calls]
        assert firsts == sorted(firsts)  # one thread's appends keep their order
    session = Session.objects.get(pk=mem.id)
    assert (session.next_seq, session.message_count) == (total + 1, total)
    # Rows written by one statement share its transaction's timestamp: fewer statements than
    # the 240 calls means appends were combined.
    statements = len({created for _, _, created in stored})
    assert statements < THREADS * 15


@pytest.fixture
def statements(monkeypatch):
    """Every append statement written, as the number of messages it carried; the first one is
    held until every other caller has queued behind it, so they are combined for certain."""
    written: list[int] = []
    first = threading.Event()
    real = log._insert_postgresql

    def counted(connection, session_id, messages, tokens, owner):
        written.append(len(messages))
        if not first.is_set():
            first.set()
            deadline = time.monotonic() + 10
            while sum(map(len, log._combiner._waiting.values())) < THREADS - 1:
                assert time.monotonic() < deadline, "the other callers never queued"
                time.sleep(0.001)
        return real(connection, session_id, messages, tokens, owner)

    monkeypatch.setattr(log, "_insert_postgresql", counted)
    return written


def test_a_failed_combined_statement_fails_every_caller_in_it_and_stores_nothing(statements):
    mem = Memory.session("combined-gone", namespace="reliability")
    sessions = [Memory.get(mem.id) for _ in range(THREADS)]
    statements.clear()
    Session.objects.filter(pk=mem.id).delete()  # every append now finds no session
    failures: list[BaseException] = []

    def appender(i: int) -> None:
        try:
            sessions[i].add({"role": "user", "content": f"t{i}"})
        except SessionNotFound as err:
            failures.append(err)

    assert run_threads(appender) == []
    # The first caller's statement alone, then one statement for the fifteen queued behind it,
    # which fails all fifteen: each hears of the failure, none of their messages is stored.
    assert statements == [1, THREADS - 1]
    assert len(failures) == THREADS
    assert not Message.objects.filter(session_id=mem.id).exists()


def test_queued_callers_each_get_their_own_messages_back(statements):
    mem = Memory.session("combined-held", namespace="reliability")
    statements.clear()
    told: dict[int, list] = {}

    def appender(i: int) -> None:
        told[i] = Memory.get(mem.id).add_many(
            [{"role": "user", "content": f"t{i} part{k}"} for k in range(i % 3 + 1)]
        )

    assert run_threads(appender) == []
    assert len(statements) == 2 and sum(statements) == sum(i % 3 + 1 for i in range(THREADS))
    stored = dict(Message.objects.filter(session_id=mem.id).values_list("seq", "content"))
    for i, returned in told.items():
        assert [stored[m.cursor] for m in returned] == [m.content for m in returned]
        assert [m.content for m in returned] == [f"t{i} part{k}" for k in range(i % 3 + 1)]
    assert sorted(stored) == list(range(1, len(stored) + 1))


def test_appends_inside_a_transaction_are_never_combined(settings):
    # A caller's transaction may roll back: its messages must go with it, so they are written
    # on its own connection, inside it, as they would be without combining.
    mem = Memory.session("combined-atomic", namespace="reliability")

    class Abort(Exception):
        pass

    def appender(i: int) -> None:
        session = Memory.get(mem.id)
        try:
            with transaction.atomic():
                session.add({"role": "user", "content": f"t{i}"})
                if i % 2:
                    raise Abort
        except Abort:
            pass

    assert run_threads(appender, 8) == []
    contents = sorted(Message.objects.filter(session_id=mem.id).values_list("content", flat=True))
    assert contents == sorted(f"t{i}" for i in range(0, 8, 2))
