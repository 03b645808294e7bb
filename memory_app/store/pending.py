"""Messages waiting for the after-append job: the ``index_pending`` mark an append writes, and
the full-text vector the job fills in when it clears the mark."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, router

from ..models import Message

#: Text search configuration of the full-text column (and of every query against it).
FULLTEXT_CONFIG = "english"


def pending_index(session_id, limit: int) -> list[tuple[int, bool]]:
    """``(cursor, remember)`` of the session's messages still marked ``index_pending``, oldest
    first, at most ``limit`` (a partial index serves it)."""
    return list(
        Message.objects.filter(session_id=session_id, index_pending=True)
        .order_by("seq")
        .values_list("seq", "remember")[:limit]
    )


def mark_indexed(session_id, cursors: Sequence[int]) -> int:
    """Fill the full-text vector of these messages (PostgreSQL; elsewhere full-text search
    scans the content itself) and clear their ``index_pending`` mark, in one UPDATE: one new
    row version per message. Returns how many were still marked."""
    cursors = list(cursors)
    connection = connections[router.db_for_write(Message)]
    if connection.vendor != "postgresql":
        return Message.objects.filter(
            session_id=session_id, seq__in=cursors, index_pending=True
        ).update(index_pending=False)
    table = connection.ops.quote_name(Message._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET index_pending = false, "
            f"search_vector = COALESCE(search_vector, to_tsvector(%s::regconfig, content)) "
            f"WHERE session_id = %s AND seq = ANY(%s) AND index_pending",
            [FULLTEXT_CONFIG, session_id, cursors],
        )
        return cursor.rowcount


def index_without_vectors(session_id, limit: int) -> tuple[int, bool] | None:
    """Clear the mark of up to ``limit`` of the session's pending messages that want no vector
    (``remember`` unset: what an append leaves when ``EMBED_ON_APPEND`` is off) and fill their
    full-text vectors, in one statement. Returns ``(how many, whether remembered messages
    still wait)``, or ``None`` off PostgreSQL (where ``pending_index`` and ``mark_indexed`` do
    it). The after-append job runs after nearly every burst of appends: one round trip instead
    of a look-up and an UPDATE keeps its Python short on the thread it shares with the caller's.
    """
    connection = connections[router.db_for_write(Message)]
    if connection.vendor != "postgresql":
        return None
    table = connection.ops.quote_name(Message._meta.db_table)
    # The partial index on pending messages serves both the sub-select and the EXISTS; the
    # EXISTS reads the snapshot before the UPDATE, which leaves remembered rows alone anyway.
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH indexed AS ("
            f" UPDATE {table} SET index_pending = false,"
            f"   search_vector = COALESCE(search_vector, to_tsvector(%s::regconfig, content))"
            f"  WHERE session_id = %s AND index_pending AND NOT remember AND seq IN ("
            f"   SELECT seq FROM {table} WHERE session_id = %s AND index_pending AND NOT remember"
            f"    ORDER BY seq LIMIT %s)"
            f" RETURNING 1)"
            f" SELECT (SELECT count(*) FROM indexed), EXISTS ("
            f"  SELECT 1 FROM {table} WHERE session_id = %s AND index_pending AND remember)",
            [FULLTEXT_CONFIG, session_id, session_id, limit, session_id],
        )
        done, remembered_waiting = cursor.fetchone()
    return done, remembered_waiting


def sessions_pending_index(session_ids: Sequence | None = None) -> list:
    """Sessions (of ``session_ids``, when given) with messages still marked ``index_pending``:
    what ``memory_embed`` catches up with when an after-append job never ran (a crash between
    the commit and the scheduling, a lost task)."""
    qs = Message.objects.filter(index_pending=True)
    if session_ids is not None:
        qs = qs.filter(session_id__in=list(session_ids))
    return list(qs.order_by().values_list("session_id", flat=True).distinct())
