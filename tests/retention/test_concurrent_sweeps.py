"""Two sweeps at once (real threads, real row locks): each batch is taken by one of them only
(SELECT ... FOR UPDATE SKIP LOCKED), and together they leave nothing behind."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connection

from memory_app.models import Message, Session
from memory_app.services import retention

from .conftest import make_session
from .test_prune import bounded_session, cursors

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

HOUR = dt.timedelta(hours=1)


def run_twice_at_once(sweep, *, watch: str) -> tuple[dict, dict]:
    """Run ``sweep()`` in two threads started together; returns what each returned and the
    parameters of each one's statements starting with ``watch`` (each statement then holds
    its transaction's locks a moment longer, so the two sweeps overlap for sure)."""
    barrier = threading.Barrier(2)
    results, seen, errors = {}, {}, []

    def run(name: str) -> None:
        mine = seen.setdefault(name, [])

        def spy(execute, sql, params, many, context):
            result = execute(sql, params, many, context)
            if sql.lstrip().startswith(watch):
                mine.extend(str(p) for p in params)
                time.sleep(0.03)
            return result

        try:
            barrier.wait(10)
            with connection.execute_wrapper(spy):
                results[name] = sweep()
        except Exception as err:  # reported below, with the thread's name
            errors.append((name, err))
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results, seen


def test_two_prunes_at_once_split_the_work_and_lose_nothing():
    doomed = {str(make_session(expires_in=-HOUR).id) for _ in range(30)}
    alive = make_session(expires_in=HOUR)
    results, seen = run_twice_at_once(
        lambda: retention.prune_expired(batch_size=3),
        watch=f'DELETE FROM "{Session._meta.db_table}"',
    )
    a, b = (set(seen[name]) & doomed for name in ("a", "b"))
    assert a and b, "both sweeps should have had work"
    assert not a & b, "a session was deleted by both sweeps"
    assert a | b == doomed
    assert results["a"]["sessions"] + results["b"]["sessions"] == 30
    assert results["a"]["messages"] + results["b"]["messages"] == 60
    assert (results["a"]["sessions"], results["b"]["sessions"]) == (len(a), len(b))
    assert list(Session.objects.values_list("pk", flat=True)) == [alive.id]
    assert not Message.objects.exclude(session_id=alive.id).exists()


def test_two_trims_at_once_trim_each_session_once(settings):
    settings.MEMORY_APP = {"RETENTION": {"bounded": {"max_messages": 5}}}
    sessions = [bounded_session() for _ in range(12)]
    results, seen = run_twice_at_once(
        lambda: retention.trim_to_policy(batch_size=2),
        watch=f'DELETE FROM "{Message._meta.db_table}"',
    )
    assert results["a"]["sessions"] + results["b"]["sessions"] == 12
    assert results["a"]["messages"] + results["b"]["messages"] == 12 * 8
    assert results["a"]["sessions"] and results["b"]["sessions"]
    for mem in sessions:
        assert cursors(mem) == [1, 4, 11, 12, 13, 14]
