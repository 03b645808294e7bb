"""PostgreSQL-specific guarantees: concurrent appenders, one round trip per append, index-only
reads whatever the session length, migrations and the pgvector check."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from memory_app import Memory
from memory_app.checks import check_pgvector, pgvector_available
from memory_app.models import Message
from tests.conftest import database_url

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db(transaction=True)
def test_concurrent_processes_get_gapless_unique_cursors(user):
    mem = Memory.session("contended", owner=user)
    env = {**os.environ, "DATABASE_URL": database_url()}
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.append_worker", str(mem.id), "40", str(batch)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for batch in (1, 1, 3, 7)
    ]
    results = []
    for worker in workers:
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0
        results.append(json.loads(out))
    every = sorted(c for cursors in results for c in cursors)
    assert every == list(range(1, 161))
    for cursors in results:  # each process saw its own cursors increase
        assert cursors == sorted(cursors)
    stored = mem.messages()
    assert [m.cursor for m in stored] == list(range(1, 161))
    assert len({m.content for m in stored}) == 160
    # Per-process order is preserved in the log.
    for cursors in results:
        pid_contents = [mem.get_message(c).content for c in cursors]
        assert [int(c.split(":")[1]) for c in pid_contents] == list(range(40))
    assert mem.count() == 160


def test_an_append_is_one_round_trip(mem, django_assert_num_queries):
    with django_assert_num_queries(1):
        mem.add({"role": "user", "content": "one statement"})
    with django_assert_num_queries(1):
        mem.add_many([{"role": "user", "content": str(i)} for i in range(100)])


@pytest.mark.parametrize("size", [100, 20_000])
def test_reads_cost_the_same_whatever_the_session_length(mem, size, django_assert_max_num_queries):
    for start in range(0, size, 1000):
        mem.add_many(
            [
                {"role": "user", "content": f"message {i}"}
                for i in range(start, min(size, start + 1000))
            ]
        )
    with django_assert_max_num_queries(1):
        assert len(mem.last(50)) == 50
    with django_assert_max_num_queries(5):  # snapshot, system messages, two pages of the tail
        window = mem.window(max_tokens=8000)
    assert window.cursors[-1] == size and window.budget_tokens <= 8000
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory_app_message")
        sql, params = (
            Message.objects.filter(session_id=mem.id).order_by("-seq")[:50].query.sql_with_params()
        )
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    if size > 1000:  # the planner rightly scans tiny tables instead
        assert "Index Scan Backward using memory_message_session_seq_uniq" in plan
        assert "Sort" not in plan


def test_no_missing_migrations(db):
    call_command("makemigrations", "memory_app", "--check", "--dry-run", verbosity=0)


COVERED_FOREIGN_KEYS = [
    ("memory_app_session", "owner_id"),
    ("memory_app_snapshot", "session_id"),
    ("memory_app_embedding", "session_id"),
    ("memory_app_embedding", "owner_id"),
    ("memory_app_item", "owner_id"),
]


def index_shapes(table: str) -> tuple[list[list[str]], list[list[str]]]:
    """The column lists of the table's indexes, and of its foreign keys."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    indexes = [info["columns"] for info in found.values() if info["index"] or info["unique"]]
    foreign_keys = [info["columns"] for info in found.values() if info["foreign_key"]]
    return indexes, foreign_keys


def assert_covered_indexes_dropped():
    for table, column in COVERED_FOREIGN_KEYS:
        indexes, foreign_keys = index_shapes(table)
        assert [column] not in indexes, f"{table}.{column} still has an index of its own"
        assert [column] in foreign_keys, f"{table}.{column} lost its foreign key"
        # ... and some other index starts with the column, so lookups by it stay indexed.
        assert any(len(cols) > 1 and cols[0] == column for cols in indexes), (table, column)


def test_foreign_keys_have_no_index_a_composite_one_starts_with(db):
    assert_covered_indexes_dropped()


@pytest.mark.django_db(transaction=True)
def test_the_covered_indexes_come_back_when_migrating_back():
    call_command("migrate", "memory_app", "0008", verbosity=0)
    try:
        for table, column in COVERED_FOREIGN_KEYS:
            assert [column] in index_shapes(table)[0], (table, column)
    finally:
        call_command("migrate", "memory_app", verbosity=0)
    assert_covered_indexes_dropped()


def fulltext_index_definition() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'memory_message_search_vector_gin'"
        )
        return cursor.fetchone()[0]


def test_the_fulltext_index_leaves_out_messages_whose_vector_is_not_filled_in(db, user):
    assert fulltext_index_definition().endswith(
        "USING gin (search_vector) WHERE (search_vector IS NOT NULL)"
    )
    # ... and searches still go through it (the query implies the condition).
    Memory.session("gin", owner=user).add({"role": "user", "content": "mushroom risotto"})
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            f"EXPLAIN SELECT id FROM {Message._meta.db_table} "
            "WHERE search_vector @@ websearch_to_tsquery('english', 'risotto')"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "memory_message_search_vector_gin" in plan, plan


@pytest.mark.django_db(transaction=True)
def test_the_fulltext_index_takes_every_message_again_when_migrating_back():
    call_command("migrate", "memory_app", "0009", verbosity=0)
    try:
        assert fulltext_index_definition().endswith("USING gin (search_vector)")
    finally:
        call_command("migrate", "memory_app", verbosity=0)
    assert fulltext_index_definition().endswith("WHERE (search_vector IS NOT NULL)")


def test_first_migration_created_the_vector_extension(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert cursor.fetchone() is not None
    assert check_pgvector(databases=["default"]) == []


def plain_postgres():
    """A PostgreSQL server without pgvector (the machine's own, when there is one)."""
    import psycopg

    url = os.environ.get("PLAIN_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    try:
        conn = psycopg.connect(url, connect_timeout=2, autocommit=True)
    except psycopg.OperationalError:
        pytest.skip("no PostgreSQL without pgvector reachable (set PLAIN_POSTGRES_URL)")
    with conn.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        if cursor.fetchone():
            pytest.skip("that server has pgvector")
    return conn, url


def test_missing_pgvector_is_reported_clearly(tmp_path):
    conn, url = plain_postgres()
    name = f"memory_nopgvector_{os.getpid()}"
    with conn.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        target = url.rsplit("/", 1)[0] + "/" + name
        env = {**os.environ, "DATABASE_URL": target}
        check = subprocess.run(
            [sys.executable, "manage.py", "check", "--database", "default"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert check.returncode != 0
        assert "memory_app.E001" in check.stderr and "pgvector" in check.stderr
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--skip-checks", "--no-input"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert migrate.returncode != 0
        assert "needs the pgvector extension" in migrate.stderr
        assert "apt-get install postgresql-<version>-pgvector" in migrate.stderr
    finally:
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.close()


def test_pgvector_probe_on_this_database(db):
    assert pgvector_available(connection) is True
