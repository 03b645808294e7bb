"""The append-only message log: appends that hand out gapless cursors, and reads by cursor.

On PostgreSQL an append is one statement: a CTE bumps the session's counters (taking its row
lock, which serialises concurrent appenders) and inserts the messages with the cursors it
handed out. Other databases take the same lock with an UPDATE, then bulk-insert, in one
transaction. A failed statement rolls both back, so a cursor is never skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence

from django.db import IntegrityError, connections, router, transaction
from django.db.models import F
from django.utils import timezone

from .encryption import decrypt_row, encrypt_row
from .exceptions import SessionNotFound
from .models import Message, Session
from .tokens import count_message
from .types import StoredMessage
from .validation import NewMessage

ROW_FIELDS = (
    "seq", "role", "content", "content_parts", "name", "tool_calls", "tool_call_id", "extra",
    "metadata", "token_count", "remember", "idempotency_key", "created_at", "id",
)


def from_row(row: Sequence) -> StoredMessage:
    # Every read of a stored row ends here: decrypted here (a no-op without encryption).
    return decrypt_row(StoredMessage(
        cursor=row[0], role=row[1], content=row[2], content_parts=row[3], name=row[4],
        tool_calls=row[5], tool_call_id=row[6], extra=row[7], metadata=row[8] or {},
        tokens=row[9], remember=row[10], idempotency_key=row[11], created_at=row[12], id=row[13],
    ))


def rows(queryset) -> list[StoredMessage]:
    return [from_row(r) for r in queryset.values_list(*ROW_FIELDS)]


def append(session_id, messages: list[NewMessage]) -> list[StoredMessage]:
    """Store ``messages`` at the end of the log, all or nothing; returns them with cursors.

    Messages whose idempotency key is already stored are not stored again: the original is
    returned in their place.
    """
    tokens = [count_message(m.as_openai()) for m in messages]
    if not any(m.idempotency_key for m in messages):
        return _insert(session_id, messages, tokens)
    for _attempt in range(3):
        try:
            with transaction.atomic(using=router.db_for_write(Message)):
                return _append_idempotent(session_id, messages, tokens)
        except IntegrityError:
            # A concurrent retry with the same key won the race: look again.
            continue
    return _append_idempotent(session_id, messages, tokens)


def _append_idempotent(session_id, messages, tokens) -> list[StoredMessage]:
    keys = [m.idempotency_key for m in messages if m.idempotency_key]
    existing = {
        m.idempotency_key: m
        for m in rows(Message.objects.filter(session_id=session_id, idempotency_key__in=keys))
    }
    fresh = [(m, t) for m, t in zip(messages, tokens, strict=True) if m.idempotency_key not in existing]
    stored = iter(_insert(session_id, [m for m, _ in fresh], [t for _, t in fresh]) if fresh else [])
    return [existing[m.idempotency_key] if m.idempotency_key in existing else next(stored) for m in messages]


def _insert(session_id, messages: list[NewMessage], tokens: list[int]) -> list[StoredMessage]:
    # Every write of messages starts here: encrypted here (a no-op without encryption); tokens
    # were counted on the plaintext.
    messages = [encrypt_row(m) for m in messages]
    connection = connections[router.db_for_write(Message)]
    if connection.vendor == "postgresql":
        stored = _insert_postgresql(connection, session_id, messages, tokens)
    else:
        stored = _insert_generic(session_id, messages, tokens)
    # Callers get plaintext back, however the rows above were built (a no-op when they are).
    stored = [decrypt_row(m) for m in stored]
    from .signals import messages_appended

    messages_appended.send(sender=Session, session_id=session_id, messages=stored)
    return stored


_PG_COLUMNS = (
    "role", "content", "content_parts", "name", "tool_calls", "tool_call_id", "extra",
    "metadata", "token_count", "remember", "idempotency_key",
)
_PG_JSON = {"content_parts", "tool_calls", "extra", "metadata"}


def _insert_postgresql(connection, session_id, messages, tokens) -> list[StoredMessage]:
    session_table = Session._meta.db_table
    message_table = Message._meta.db_table
    n = len(messages)
    values_sql = ", ".join(["(%s::bigint, " + ", ".join(["%s"] * len(_PG_COLUMNS)) + ")"] * n)
    params: list = [n, n, sum(tokens), sum(tokens), timezone.now(), session_id, n, session_id]
    for ordinal, (message, token_count) in enumerate(zip(messages, tokens, strict=True)):
        params.append(ordinal)
        for column in _PG_COLUMNS:
            if column == "token_count":
                value = token_count
            else:
                value = getattr(message, column)
            if column in _PG_JSON:
                value = None if value is None else json.dumps(value)
            params.append(value)
    select_columns = ", ".join(
        f"v.{c}::jsonb" if c in _PG_JSON else
        ("v.token_count::integer" if c == "token_count" else
         ("v.remember::boolean" if c == "remember" else f"v.{c}"))
        for c in _PG_COLUMNS
    )
    returning = ", ".join(ROW_FIELDS)
    sql = f"""
        WITH bumped AS (
            UPDATE {session_table}
               SET next_seq = next_seq + %s,
                   message_count = message_count + %s,
                   token_count = token_count + %s,
                   tokens_since_snapshot = tokens_since_snapshot + %s,
                   updated_at = %s
             WHERE id = %s
         RETURNING next_seq - %s AS first_seq
        )
        INSERT INTO {message_table} (session_id, seq, {", ".join(_PG_COLUMNS)})
        SELECT %s, bumped.first_seq + v.ordinal, {select_columns}
          FROM bumped, (VALUES {values_sql}) AS v(ordinal, {", ".join(_PG_COLUMNS)})
        RETURNING {returning}
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        result = cursor.fetchall()
    if not result:
        raise SessionNotFound(f"session {session_id} does not exist")
    # Django has psycopg hand jsonb over as text (JSONField decodes it); do the same here.
    json_positions = [ROW_FIELDS.index(c) for c in _PG_JSON]
    decoded = []
    for row in result:
        row = list(row)
        for i in json_positions:
            if isinstance(row[i], str):
                row[i] = json.loads(row[i])
        decoded.append(from_row(row))
    return sorted(decoded, key=lambda m: m.cursor)


def _insert_generic(session_id, messages, tokens) -> list[StoredMessage]:
    n = len(messages)
    with transaction.atomic(using=router.db_for_write(Message)):
        # The UPDATE takes the session's write lock first, so appenders queue here.
        updated = Session.objects.filter(pk=session_id).update(
            next_seq=F("next_seq") + n,
            message_count=F("message_count") + n,
            token_count=F("token_count") + sum(tokens),
            tokens_since_snapshot=F("tokens_since_snapshot") + sum(tokens),
            updated_at=timezone.now(),
        )
        if not updated:
            raise SessionNotFound(f"session {session_id} does not exist")
        next_seq = Session.objects.filter(pk=session_id).values_list("next_seq", flat=True).get()
        first = next_seq - n
        Message.objects.bulk_create(
            Message(
                session_id=session_id, seq=first + i, role=m.role, content=m.content,
                content_parts=m.content_parts, name=m.name, tool_calls=m.tool_calls,
                tool_call_id=m.tool_call_id, extra=m.extra, metadata=m.metadata,
                token_count=t, remember=m.remember, idempotency_key=m.idempotency_key,
            )
            for i, (m, t) in enumerate(zip(messages, tokens, strict=True))
        )
        return rows(Message.objects.filter(session_id=session_id, seq__gte=first).order_by("seq"))


def newest_first(
    session_id, *, after: int, page_size: Callable[[int, int], int]
) -> Iterator[StoredMessage]:
    """Messages with cursor > ``after``, newest first, fetched a page at a time (index scans).

    ``page_size(rows_so_far, tokens_so_far)`` sizes each page, so a caller filling a token
    budget can ask for about as many rows as it still needs.
    """
    before = None
    fetched = tokens = 0
    while True:
        size = max(1, page_size(fetched, tokens))
        qs = Message.objects.filter(session_id=session_id, seq__gt=after)
        if before is not None:
            qs = qs.filter(seq__lt=before)
        chunk = rows(qs.order_by("-seq")[:size])
        yield from chunk
        if len(chunk) < size:
            return
        before = chunk[-1].cursor
        fetched += len(chunk)
        tokens += sum(m.tokens for m in chunk)
