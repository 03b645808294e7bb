"""Owner-scope search goes through the model's HNSW index, and its iterative scan keeps a
selective filter from returning too few rows (PostgreSQL + pgvector only)."""

from __future__ import annotations

import random

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from memory_app import Memory
from memory_app.models import Embedding, Message
from memory_app.providers.embeddings import get_embedder
from memory_app.services import background, recall
from memory_app.services.embedding import ensure_hnsw_index, hnsw_index_name
from memory_app.services.recall import apply_hnsw_settings

pytestmark = pytest.mark.postgres

WORDS = (
    "apple banana cherry delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


def fill(mem, n, rnd, capture, role="user"):
    for start in range(0, n, 1000):
        with capture(execute=True):
            mem.add_many(
                [
                    {"role": role, "content": " ".join(rnd.choices(WORDS, k=6))}
                    for _ in range(min(1000, n - start))
                ]
            )


def owner_search_sql(mem, query, **kwargs):
    """Run an owner-scope vector search; return its results and the SQL it sent."""
    with CaptureQueriesContext(connection) as captured:
        results = mem.search(query, scope="owner", mode="vector", **kwargs)
    sql = [q["sql"] for q in captured.captured_queries if "hits AS MATERIALIZED" in q["sql"]]
    assert len(sql) == 1
    return results, sql[0]


def run(sql, *, iterative="relaxed_order", explain=False):
    """Run captured search SQL again under the search's HNSW settings (iterative scan changed)."""
    with transaction.atomic(), connection.cursor() as cursor:
        apply_hnsw_settings(cursor)
        cursor.execute(f"SET LOCAL hnsw.iterative_scan = {iterative}")
        cursor.execute(("EXPLAIN (ANALYZE, COSTS OFF) " if explain else "") + sql)
        rows = cursor.fetchall()
    return "\n".join(r[0] for r in rows) if explain else rows


@pytest.fixture
def small_vectors(memory_settings_override):
    # 32 dimensions keep the index small and quick to build.
    memory_settings_override(EMBEDDER_OPTIONS={"dimensions": 32})
    return get_embedder()


def test_index_is_created_once_per_model_with_its_expression(
    db, small_vectors, mem, django_capture_on_commit_callbacks
):
    name = hnsw_index_name(small_vectors.name)
    assert name.startswith("memory_emb_hnsw_lexical_hash_v1_32_") and len(name) <= 63
    with django_capture_on_commit_callbacks(execute=True):
        mem.add({"role": "user", "content": "first words stored"})
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [name])
        (indexdef,) = cursor.fetchone()
    assert "USING hnsw (((vector)::vector(32)) vector_cosine_ops)" in indexdef
    assert "WHERE ((model)::text = 'lexical-hash-v1-32'::text)" in indexdef
    # Idempotent: asking again changes nothing and fails nothing.
    assert ensure_hnsw_index(small_vectors.name, 32) == name
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_indexes WHERE indexname LIKE 'memory_emb_hnsw_%%'")
        assert cursor.fetchone()[0] >= 1


def test_owner_scope_uses_the_hnsw_index(
    db, small_vectors, user, django_capture_on_commit_callbacks
):
    rnd = random.Random(7)
    for key in ("a", "b", "c"):
        fill(Memory.session(key, owner=user), 1200, rnd, django_capture_on_commit_callbacks)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Embedding._meta.db_table}")
    mem = Memory.session("a", owner=user)
    results, sql = owner_search_sql(mem, "apple banana cherry", limit=10)
    assert len(results) == 10
    assert {r.session_id for r in results} <= set(
        Memory.sessions(owner=user)[i].id for i in range(3)
    )
    plan = run(sql, explain=True)
    assert f"Index Scan using {hnsw_index_name(small_vectors.name)}" in plan, plan
    assert "rows=10" in plan.splitlines()[0]


def test_iterative_scan_fills_the_limit_under_a_selective_filter(
    db, small_vectors, make_user, django_capture_on_commit_callbacks
):
    rnd = random.Random(11)
    crowd, few = make_user("crowd"), make_user("few")
    fill(Memory.session("big", owner=crowd), 2000, rnd, django_capture_on_commit_callbacks)
    mine = Memory.session("small", owner=few)
    fill(mine, 25, rnd, django_capture_on_commit_callbacks)
    with transaction.atomic():
        # Make the planner take the HNSW index although the owner filter is selective (as it
        # may when its statistics are stale): that is the case the iterative scan is for.
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off")
        results, sql = owner_search_sql(mine, "apple banana cherry", limit=20)
        plan = run(sql, explain=True)
        assert f"Index Scan using {hnsw_index_name(small_vectors.name)}" in plan, plan
        # Without the iterative scan the index hands over ef_search candidates, nearly all of
        # the crowd's, and the filter leaves too few.
        assert len(run(sql, iterative="off")) < 20
        # With it (what search() does) the scan goes on until the limit is met.
        assert len(results) == 20
        assert len(run(sql)) == 20
    assert {r.session_id for r in results} == {mine.id}
    assert all(
        r.message.id
        in set(Message.objects.filter(session=mine.session).values_list("id", flat=True))
        for r in results
    )


def test_fulltext_search_uses_the_gin_index(
    garden_chat, memory_settings_override, django_capture_on_commit_callbacks, monkeypatch
):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'memory_message_search_vector_gin'"
        )
        (indexdef,) = cursor.fetchone()
    assert "USING gin (search_vector)" in indexdef
    memory_settings_override(EMBED_ON_APPEND=False, IMPORTANCE_THRESHOLD=None)
    rnd = random.Random(3)
    for _ in range(3):
        garden_chat.add_many(
            [{"role": "user", "content": " ".join(rnd.choices(WORDS, k=8))} for _ in range(1000)]
        )
    # The after-append job stores their vectors (the test transaction never commits: run it).
    assert background.run_after_append(garden_chat.id) >= 3000
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Message._meta.db_table}")

    def plan_of(scope: str, *, without_session_index: bool = False) -> str:
        with CaptureQueriesContext(connection) as captured:
            found = garden_chat.search("mushroom risotto", scope=scope, mode="fulltext")
        assert [r.cursor for r in found] == [5]
        (sql,) = [q["sql"] for q in captured.captured_queries if "websearch_to_tsquery" in q["sql"]]
        with transaction.atomic(), connection.cursor() as cursor:
            # 3,000 short rows are cheaper to scan than to look up, now that the vector is
            # stored: what matters is that the index can serve the query (same expression).
            cursor.execute("SET LOCAL enable_seqscan = off")
            if without_session_index:
                # On so small a table reading the owner's rows by session may cost the same
                # as the GIN lookup, and the planner's pick between the two then depends on
                # what earlier tests left in the table: take that road away (rolled back).
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the inserts' FK checks, now
                cursor.execute(
                    f"ALTER TABLE {Message._meta.db_table} "
                    f"DROP CONSTRAINT memory_message_session_seq_uniq"
                )
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(r[0] for r in cursor.fetchall())
            transaction.set_rollback(True)
        return plan

    gin = "Bitmap Index Scan on memory_message_search_vector_gin"
    default = recall.OWNER_SCAN_MAX_MESSAGES
    for scope, owner_scan_max in (("session", None), ("owner", 100), ("owner", None)):
        monkeypatch.setattr(recall, "OWNER_SCAN_MAX_MESSAGES", owner_scan_max or default)
        plan = plan_of(scope, without_session_index=owner_scan_max is not None)
        # The stored vector is matched (no to_tsvector per indexed row).
        assert "(search_vector @@ " in plan, plan
        if scope == "owner" and owner_scan_max is not None:
            # An owner with more messages than the cap: through the GIN index.
            assert gin in plan, plan
        elif scope == "owner":
            # A modest history (3,000 < the cap) is read by its sessions' index, tested per
            # row: the cost follows the owner's messages, not the table's.
            assert gin not in plan and "memory_message_session_seq_uniq" in plan, plan
        # Messages not indexed yet are found through the small partial index of pending ones.
        assert "memory_message_pending_idx" in plan, plan
