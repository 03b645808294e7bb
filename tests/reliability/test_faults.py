"""A batch append cut off half-way, by a killed connection or a statement timeout, stores
nothing; the caller gets an error it can retry, and the retry stores the batch whole."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError, connection

from memory_app import Memory
from memory_app.models import Message, Session

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PAUSE = "pause here"
BATCH = 1000


@pytest.fixture(autouse=True)
def store_only(settings):
    # The store alone: a batch this size would otherwise start a summary (inline, with no broker).
    settings.MEMORY_APP = {
        **getattr(settings, "MEMORY_APP", {}),
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }


@pytest.fixture
def pause_mid_batch():
    """A trigger that stops an insert at the message whose content is PAUSE, after the rows
    before it are written, the first time only (a sequence is not rolled back)."""
    table = Message._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE reliability_pause_once")
        cursor.execute(f"""
            CREATE FUNCTION reliability_pause() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.content = '{PAUSE}' AND nextval('reliability_pause_once') = 1 THEN
                    PERFORM pg_sleep(60);
                END IF;
                RETURN NEW;
            END $$""")
        cursor.execute(
            f"CREATE TRIGGER reliability_pause BEFORE INSERT ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION reliability_pause()"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS reliability_pause ON {table}")
        cursor.execute("DROP FUNCTION IF EXISTS reliability_pause()")
        cursor.execute("DROP SEQUENCE IF EXISTS reliability_pause_once")


def batch_with_pause() -> list[dict]:
    batch = [{"role": "user", "content": f"line {i}"} for i in range(BATCH)]
    batch[BATCH * 3 // 5] = {"role": "user", "content": PAUSE}
    return batch


def state(mem):
    session = Session.objects.get(pk=mem.id)
    return (
        session.next_seq,
        session.message_count,
        session.token_count,
        list(
            Message.objects.filter(session_id=mem.id).order_by("seq").values_list("seq", "content")
        ),
    )


def assert_stored_whole(mem, before, stored, batch):
    next_seq = before[0]
    assert [m.cursor for m in stored] == list(range(next_seq, next_seq + len(batch)))
    after = state(mem)
    assert after[3] == before[3] + [(next_seq + i, m["content"]) for i, m in enumerate(batch)]
    assert after[:3] == (
        next_seq + len(batch),
        before[1] + len(batch),
        before[2] + sum(m.tokens for m in stored),
    )


def sleeping_backend(timeout: float = 20) -> int:
    """The pid of the backend paused in the trigger, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                "AND datname = current_database()"
            )
            row = cursor.fetchone()
        if row:
            return row[0]
        time.sleep(0.05)
    raise AssertionError("the batch never reached the pause")


def test_connection_killed_in_the_middle_of_a_batch(pause_mid_batch):
    mem = Memory.session("killed", namespace="reliability")
    mem.add_many([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    before = state(mem)
    batch = batch_with_pause()
    outcome: dict = {}

    def appender():
        from django.db import connection as own

        try:
            with own.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            try:
                mem.add_many(batch)
            except Exception as err:  # what the caller sees
                outcome["error"] = err
            outcome["retry"] = mem.add_many(batch)  # same thread, same handle
        except Exception as err:
            outcome["retry_error"] = err
        finally:
            own.close()

    thread = threading.Thread(target=appender)
    thread.start()
    pid = sleeping_backend()
    with connection.cursor() as cursor:
        # Half the batch is written (uncommitted) when the server ends the connection.
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND state = 'active'", [pid]
        )
        assert cursor.fetchone()[0] == 1
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    thread.join(timeout=60)
    assert not thread.is_alive()

    assert outcome["pid"] == pid
    assert isinstance(outcome.get("error"), OperationalError), outcome
    assert "retry_error" not in outcome, outcome
    assert_stored_whole(mem, before, outcome["retry"], batch)


def test_statement_timeout_in_the_middle_of_a_batch(pause_mid_batch):
    mem = Memory.session("timed-out", namespace="reliability")
    mem.add({"role": "user", "content": "hi"})
    before = state(mem)
    batch = batch_with_pause()
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '300ms'")
    try:
        with pytest.raises(OperationalError):
            mem.add_many(batch)
        assert state(mem) == before  # nothing half stored, no cursor used up
        stored = mem.add_many(batch)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
    assert_stored_whole(mem, before, stored, batch)
