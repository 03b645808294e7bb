"""Safe behind a pooler in transaction mode (PgBouncer's ``pool_mode = transaction``).

Such a pooler hands a server connection to a client for one transaction, then to another
client. So the store must leave nothing on a server session once a transaction ends: no
``SET`` without ``LOCAL``, no session advisory lock, no ``WITH HOLD`` cursor, no prepared
statement when the pooler does not track them. The first test checks exactly that on a direct
connection after the operations that use such machinery (owner-scope vector search sets
pgvector's HNSW options, the HNSW index build takes an advisory lock, an owner export reads in
one REPEATABLE READ transaction with a chunked iterator). The second runs only in the suite's
run through PgBouncer (``scripts/test``) and checks that run really goes through it.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

pytestmark = [pytest.mark.postgres]

THROUGH_POOLER = os.environ.get("DB_TRANSACTION_POOLER") == "1"


def session_state() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT current_setting('hnsw.ef_search', true),
                   current_setting('hnsw.iterative_scan', true),
                   current_setting('hnsw.max_scan_tuples', true),
                   (SELECT count(*) FROM pg_locks
                     WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
                   (SELECT count(*) FROM pg_cursors),
                   current_setting('transaction_isolation')""")
        ef, scan, tuples, locks, cursors, isolation = cursor.fetchone()
    return {
        "ef_search": ef,
        "iterative_scan": scan,
        "max_scan_tuples": tuples,
        "advisory_locks": locks,
        "open_cursors": cursors,
        "isolation": isolation,
    }


@pytest.mark.django_db(transaction=True)
def test_no_session_state_outlives_a_transaction(user, settings):
    from memory_app import Memory
    from memory_app.services.embedding import ensure_hnsw_index

    # Values no default has, so a leaked one would show.
    settings.MEMORY_APP = {"HNSW_EF_SEARCH": 77, "HNSW_MAX_SCAN_TUPLES": 12345}
    mem = Memory.session("pooled", owner=user, namespace="tests")
    mem.add_many([{"role": "user", "content": f"order {i} never arrived"} for i in range(30)])
    mem.embed()
    ensure_hnsw_index("pooler-test-model", 8)
    assert mem.search("order arrived", scope="owner", mode="vector")
    assert mem.search("order arrived", scope="owner", mode="hybrid")
    assert mem.window(max_tokens=200).messages
    export = Memory.export_owner(user)
    assert len(export["sessions"][0]["messages"]) == 30

    # Nothing the operations set or took is left on the session: the next transaction (which a
    # pooler may give to another client) sees pgvector's defaults (or none, on a server
    # connection that has not loaded pgvector yet), no lock, no cursor.
    after = session_state()
    assert after["ef_search"] in (None, "40")
    assert after["iterative_scan"] in (None, "off")
    assert after["max_scan_tuples"] in (None, "20000")
    assert after["advisory_locks"] == 0 and after["open_cursors"] == 0
    assert after["isolation"] == "read committed"


@pytest.mark.skipif(not THROUGH_POOLER, reason="only in the run through PgBouncer (scripts/test)")
@pytest.mark.django_db(transaction=True)
def test_this_run_goes_through_pgbouncer_in_transaction_mode(user):
    import psycopg

    from memory_app import Memory

    settings = connection.settings_dict
    # No prepared statements and no server-side cursors through the pooler (project/database.py).
    assert settings["OPTIONS"].get("prepare_threshold") is None
    assert settings["DISABLE_SERVER_SIDE_CURSORS"] is True

    mem = Memory.session("pooled", owner=user, namespace="tests")
    for i in range(10):  # more than psycopg's default prepare threshold (5)
        mem.add({"role": "user", "content": f"turn {i}"})
        assert mem.last(1)[0].content == f"turn {i}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == 0

    # PgBouncer's admin console names the pool this run's test database uses.
    console = psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname="pgbouncer",
        autocommit=True,
        prepare_threshold=None,
    )
    with console, console.cursor() as cursor:
        cursor.execute("SHOW POOLS")
        columns = [c.name for c in cursor.description]
        pools = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    mine = [p for p in pools if p["database"] == settings["NAME"]]
    assert mine and mine[0]["pool_mode"] == "transaction"


@pytest.mark.skipif(not THROUGH_POOLER, reason="only in the run through PgBouncer (scripts/test)")
@pytest.mark.django_db(transaction=True)
def test_a_pooler_that_refuses_prepared_statements_turns_them_off(user, settings, caplog):
    import psycopg

    from memory_app import Memory
    from memory_app.store import statements

    # As a project that left PREPARE_STATEMENTS on behind PgBouncer 1.18 would run.
    settings.MEMORY_APP = {**settings.MEMORY_APP, "PREPARE_STATEMENTS": True}
    statements._unprepared.discard(connection.alias)
    mem = Memory.session("prepared", owner=user, namespace="tests")
    # Other clients leave a statement named as psycopg names a connection's first one on every
    # server connection of the pool.
    params = connection.get_connection_params()
    others = [
        psycopg.connect(
            host=params["host"], port=params["port"], user=params["user"], dbname=params["dbname"]
        )
        for _ in range(8)
    ]
    try:
        for other in others:  # each inside its open transaction: each on a server of its own
            other.execute("DEALLOCATE ALL")
            other.execute('PREPARE "_pg3_0" AS SELECT 1')
        for other in others:
            other.commit()
        connection.close()  # a fresh client connection: its first prepared name is "_pg3_0"
        for i in range(6):
            mem.add({"role": "user", "content": f"turn {i}"})
        assert [m.content for m in mem.messages()] == [f"turn {i}" for i in range(6)]
        assert [m.cursor for m in mem.messages()] == list(range(1, 7))
        assert connection.alias in statements._unprepared
        refusals = [r for r in caplog.records if "refused a prepared statement" in r.message]
        assert len(refusals) == 1
    finally:
        # Leave no statement on the pool's server connections for the tests after this one.
        for other in others:
            other.execute("DEALLOCATE ALL")
        for other in others:
            other.commit()
            other.close()
        connection.close()
        statements._unprepared.discard(connection.alias)
