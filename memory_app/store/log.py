"""The append-only message log: appends that hand out gapless cursors, and reads by cursor.

On PostgreSQL an append is one statement: a CTE bumps the session's counters (taking its row
lock, which serialises concurrent appenders) and inserts the messages with the cursors it
handed out. The same UPDATE moves ``expires_at`` forward for namespaces whose retention policy
slides (``store.policies``), so a sliding TTL costs no query of its own. Other databases take
the same lock with an UPDATE, then bulk-insert, in one
transaction. A failed statement rolls both back, so a cursor is never skipped.

The hot paths on PostgreSQL (append, last N, the pages a window reads) skip the ORM's query
compiler: their SQL is built once from the models' metadata and sent with server-side
parameter binding (one fixed statement text whatever the batch size, so the server can reuse
a prepared plan when the project enables ``prepare_threshold``), on one psycopg cursor kept
per connection (``_query``). Django's rules still apply: no statement inside a broken
transaction, database errors as Django's, and query logging and ``execute_wrapper`` hooks see
them like any other query.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from functools import cache
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import F, Max, Min
from django.utils import timezone

from ..conf import memory_settings
from ..encryption import decrypt_row, encrypt_row
from ..exceptions import IdempotencyConflict, InvalidCursor, SessionNotFound
from ..importance import mark_important
from ..models import Embedding, Message, Session, Snapshot
from ..signals import messages_appended
from ..tokens import count_message
from ..types import ANY_OWNER, NewMessage, SnapshotView, StoredMessage
from ..validation import check_count, check_cursor, check_message, check_messages
from . import policies, sessions, snapshots

ROW_FIELDS = (
    "seq",
    "role",
    "content",
    "content_parts",
    "name",
    "tool_calls",
    "tool_call_id",
    "extra",
    "metadata",
    "token_count",
    "remember",
    "idempotency_key",
    "created_at",
    "id",
)


def from_row(row: Sequence) -> StoredMessage:
    # Every read of a stored row ends here: decrypted here (a no-op without encryption).
    return decrypt_row(
        StoredMessage(
            cursor=row[0],
            role=row[1],
            content=row[2],
            content_parts=row[3],
            name=row[4],
            tool_calls=row[5],
            tool_call_id=row[6],
            extra=row[7],
            metadata=row[8] or {},
            tokens=row[9],
            remember=row[10],
            idempotency_key=row[11],
            created_at=row[12],
            id=row[13],
        )
    )


def rows(queryset) -> list[StoredMessage]:
    return [from_row(r) for r in queryset.values_list(*ROW_FIELDS)]


def add(session_id, message: dict[str, Any], *, owner: Any = ANY_OWNER) -> StoredMessage:
    """Check one OpenAI-format message with the rule book and append it."""
    return append(session_id, [check_message(message)], owner=owner)[0]


def add_many(
    session_id, messages: Iterable[dict[str, Any]], *, owner: Any = ANY_OWNER
) -> list[StoredMessage]:
    """Check a batch with the rule book and append it atomically: all or none."""
    return append(session_id, check_messages(messages), owner=owner)


def append(
    session_id, messages: list[NewMessage], *, owner: Any = ANY_OWNER
) -> list[StoredMessage]:
    """Store ``messages`` at the end of the log, all or nothing; returns them with cursors.

    ``owner``: the session must be one ``owner`` may see (``sessions.scoped``), else
    ``SessionNotFound``; the append statement checks it itself, so an append by session id
    costs no query of its own to open the session. Messages whose idempotency key is already
    stored are not stored again: the original is returned in their place.
    """
    session_id = sessions.checked_id(session_id)
    messages = mark_important(messages)
    tokens = [count_message(m.as_openai()) for m in messages]
    if not any(m.idempotency_key for m in messages):
        return _insert(session_id, messages, tokens, owner=owner)
    if owner is not ANY_OWNER:
        sessions.get(session_id, owner=owner)  # stored keys are only looked up in one's own
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
    connection = connections[router.db_for_read(Message)]
    if connection.vendor == "postgresql":
        found = _fetch(connection, _sql().by_keys, [session_id, keys])
    else:
        found = rows(Message.objects.filter(session_id=session_id, idempotency_key__in=keys))
    existing = {m.idempotency_key: m for m in found}
    for index, m in enumerate(messages):
        stored = existing.get(m.idempotency_key)
        if stored is not None and not _same(m, stored):
            raise IdempotencyConflict(
                "idempotency_key",
                f"{m.idempotency_key!r} is already stored with a different message "
                f"(cursor {stored.cursor}); a retry must send the same message",
                index=index if len(messages) > 1 else None,
            )
    fresh = [
        (m, t) for m, t in zip(messages, tokens, strict=True) if m.idempotency_key not in existing
    ]
    stored = iter(
        _insert(session_id, [m for m, _ in fresh], [t for _, t in fresh]) if fresh else []
    )
    return [
        existing[m.idempotency_key] if m.idempotency_key in existing else next(stored)
        for m in messages
    ]


_COMPARED = (
    "role",
    "content",
    "content_parts",
    "name",
    "tool_calls",
    "tool_call_id",
    "extra",
    "metadata",
)


def _same(new: NewMessage, stored: StoredMessage) -> bool:
    """A retried message is the one stored under its key (``remember`` may have been set since by
    importance scoring, so it is not compared)."""
    return all((getattr(new, f) or None) == (getattr(stored, f) or None) for f in _COMPARED)


def _insert(
    session_id, messages: list[NewMessage], tokens: list[int], *, owner: Any = ANY_OWNER
) -> list[StoredMessage]:
    # Every write of messages starts here: encrypted here (a no-op without encryption); tokens
    # were counted on the plaintext.
    messages = [encrypt_row(m) for m in messages]
    alias = router.db_for_write(Message)
    connection = connections[alias]
    if connection.vendor == "postgresql":
        if memory_settings.COMBINE_APPENDS and not connection.in_atomic_block:
            tokens_since, stored = _combined(alias, connection, session_id, messages, tokens, owner)
        else:
            tokens_since, stored = _insert_postgresql(
                connection, session_id, messages, tokens, owner
            )
    else:
        tokens_since, stored = _insert_generic(session_id, messages, tokens, owner)
    # Callers get plaintext back, however the rows above were built (a no-op when they are).
    stored = [decrypt_row(m) for m in stored]
    announce(session_id, stored, tokens_since)
    return stored


def announce(session_id, messages: list[StoredMessage], tokens_since_snapshot: int) -> None:
    """Tell ``messages_appended``'s receivers that ``messages`` were stored (an append, an
    import), inside the writer's transaction: what follows new messages is scheduled there."""
    messages_appended.send(
        sender=Session,
        session_id=session_id,
        messages=messages,
        tokens_since_snapshot=tokens_since_snapshot,
    )


def stored_message(
    cursor: int, m: NewMessage, tokens: int, created_at, pk: int | None
) -> StoredMessage:
    """``m`` (plaintext) as stored at ``cursor``."""
    return _stored(
        (
            cursor,
            m.role,
            m.content,
            m.content_parts,
            m.name,
            m.tool_calls,
            m.tool_call_id,
            m.extra,
            m.metadata,
            tokens,
            m.remember,
            m.idempotency_key,
            created_at,
            pk,
        )
    )


# -- concurrent appends to one session, combined ------------------------------------------
#
# The session's row lock serialises appends to one session: each waits for the one before it
# to commit. Threads of this process that append to the same session at the same time are
# combined instead: the first writes its messages alone; those that arrive while its
# statement runs queue up, and when it is done the first of them writes the whole queue in one
# statement (one lock, one commit, cursors in arrival order) on its own connection and hands
# every caller its messages. Only appends outside a transaction are combined (each caller's
# messages commit before its call returns, as they would alone); an error fails every caller
# of that statement, and none of their messages is stored.


class _Append:
    __slots__ = ("messages", "tokens", "done", "lead", "result", "error")

    def __init__(self, messages, tokens) -> None:
        self.messages = messages
        self.tokens = tokens
        self.done: threading.Event | None = None  # only a caller that queues waits on it
        self.lead: list[_Append] | None = None  # the appends this caller is to write
        self.result = None
        self.error: BaseException | None = None


_waiting: dict[tuple, list[_Append]] = {}  # per (alias, session): appends queued behind a write
_waiting_lock = threading.Lock()


def _combined(alias, connection, session_id, messages, tokens, owner):
    # Only appends checked against the same owner scope share a statement.
    key = (alias, session_id, *sessions.owner_check(owner))
    me = _Append(messages, tokens)
    with _waiting_lock:
        queue = _waiting.get(key)
        if queue is None:
            _waiting[key] = []  # a write is under way; later arrivals queue behind it
            me.lead = [me]
        else:
            me.done = threading.Event()
            queue.append(me)
    if me.lead is None:
        me.done.wait()
        if me.lead is None:  # written by another caller's statement
            if me.error is not None:
                raise me.error
            return me.result
    batch = me.lead
    try:
        if len(batch) == 1:
            result = _insert_postgresql(connection, session_id, messages, tokens, owner)
        else:
            since, stored = _insert_postgresql(
                connection,
                session_id,
                [m for a in batch for m in a.messages],
                [t for a in batch for t in a.tokens],
                owner,
            )
            start = 0
            for a in batch:
                a.result = (since, stored[start : start + len(a.messages)])
                start += len(a.messages)
            result = me.result
    except BaseException as err:
        for a in batch:
            a.error = err
        raise
    finally:
        with _waiting_lock:
            queue = _waiting.pop(key)
            if queue:
                _waiting[key] = []
                queue[0].lead = queue
        if queue:
            queue[0].done.set()
        for a in batch:
            if a is not me:
                a.done.set()
    return result


# -- PostgreSQL: fixed SQL, server-side binding ---------------------------------------------

# Empty metadata (the common case) comes back as NULL: cheaper than decoding "{}" per row.
_COLUMNS = ", ".join("NULLIF(metadata, '{}'::jsonb)" if f == "metadata" else f for f in ROW_FIELDS)


class _Statements:
    """The hot statements, written once from the models' table names."""

    def __init__(self) -> None:
        session = Session._meta.db_table
        message = Message._meta.db_table
        snapshot = Snapshot._meta.db_table
        # Named parameters: each is sent once however often the statement uses it.
        bump = f"""
            WITH bumped AS (
                UPDATE {session}
                   SET next_seq = next_seq + %(n)s,
                       message_count = message_count + %(n)s,
                       token_count = token_count + %(tokens)s,
                       tokens_since_snapshot = tokens_since_snapshot + %(tokens)s,
                       updated_at = %(now)s,
                       {policies.SLIDING_EXPIRY_SQL}
                 WHERE id = %(session)s
                   AND (%(any_owner)s OR owner_id IS NOT DISTINCT FROM %(owner)s)
             RETURNING next_seq - %(n)s AS first_seq, tokens_since_snapshot
            )
            INSERT INTO {message} (session_id, seq, role, content, content_parts, name, tool_calls,
                                   tool_call_id, extra, metadata, token_count, remember,
                                   idempotency_key)
        """
        # A single message travels as plain parameters (the cheapest plan for one row) ...
        self.append_one = (
            bump
            + """
            SELECT %(session)s, bumped.first_seq, %(role)s, %(content)s, %(content_parts)s::jsonb,
                   %(name)s, %(tool_calls)s::jsonb, %(tool_call_id)s, %(extra)s::jsonb,
                   %(metadata)s::jsonb, %(tokens)s::integer, %(remember)s::boolean,
                   %(idempotency_key)s
              FROM bumped
            RETURNING seq, created_at, id, (SELECT tokens_since_snapshot FROM bumped)
        """
        )
        # ... a batch as one JSON array of rows: one parameter, encoded by the json module's C
        # encoder and decoded by the server, whatever the batch size (so the statement text,
        # and a prepared plan, never depend on it).
        self.append_many = (
            bump
            + """
            SELECT %(session)s, bumped.first_seq + v.i, v.role, v.content, v.content_parts,
                   COALESCE(v.name, ''), v.tool_calls, COALESCE(v.tool_call_id, ''), v.extra,
                   COALESCE(v.metadata, '{}'::jsonb), v.token_count, COALESCE(v.remember, false),
                   v.idempotency_key
              FROM bumped,
                   json_to_recordset(%(rows)s::json) AS v(
                       i integer, role text, content text, content_parts jsonb, name text,
                       tool_calls jsonb, tool_call_id text, extra jsonb, metadata jsonb,
                       token_count integer, remember boolean, idempotency_key text)
            RETURNING seq, created_at, id, (SELECT tokens_since_snapshot FROM bumped)
        """
        )
        self.newest = f"""
            SELECT {_COLUMNS} FROM {message}
             WHERE session_id = %s AND seq > %s AND seq < %s
             ORDER BY seq DESC LIMIT %s
        """
        self.by_keys = f"""
            SELECT {_COLUMNS} FROM {message}
             WHERE session_id = %s AND idempotency_key = ANY(%s::text[])
        """
        self.system = f"""
            SELECT {_COLUMNS} FROM {message}
             WHERE session_id = %s AND role = 'system' ORDER BY seq
        """
        # The session's counters (to size a window's first page), its latest snapshot and
        # its system messages (a partial index): one row per system message, at least one.
        self.window_head = f"""
            SELECT s.message_count, s.token_count,
                   snap.version, snap.upto, snap.summary, snap.pinned, snap.model, snap.metadata,
                   snap.created_at, sys.*
              FROM {session} s
              LEFT JOIN LATERAL (
                SELECT * FROM {snapshot} WHERE session_id = s.id ORDER BY version DESC LIMIT 1
              ) snap ON true
              LEFT JOIN LATERAL (
                SELECT {_COLUMNS} FROM {message}
                 WHERE session_id = s.id AND role = 'system' ORDER BY seq
              ) sys ON true
             WHERE s.id = %s
             ORDER BY sys.seq
        """


@cache
def _sql() -> _Statements:
    return _Statements()


def _query(connection, sql: str, params) -> list:
    """Run one of the hot statements on ``connection`` and return its rows.

    Parameters are bound server-side and results read in binary (psycopg decodes jsonb,
    timestamps and numbers in C; Django's text-format timestamp loader is Python). Django's
    own cursors bind client-side unless the project opts in (``OPTIONS["server_side_binding"]``);
    these statements always bind server-side.

    The psycopg cursor is kept on the connection and reused: a fresh cursor starts with empty
    dumper and loader caches, and a Django cursor wrapper around it adds its own layers;
    together about 40 us of a single append (a quarter of its Python time). What the wrapper
    does still happens: the statement fails inside a broken transaction, database errors
    become Django's, and when queries are logged (``DEBUG``) or an ``execute_wrapper`` is
    installed the statement goes through the wrapper itself, so they see it like any other
    query.
    """
    raw = _statement_cursor(connection)
    if connection.queries_logged or connection.execute_wrappers:
        if connection.queries_logged:
            wrapped = connection.make_debug_cursor(raw)
        else:
            wrapped = connection.make_cursor(raw)
        wrapped.execute(sql, params)
        return wrapped.fetchall()
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        raw.execute(sql, params)
        return raw.fetchall()


def _statement_cursor(connection):
    """The binary, server-side-binding psycopg cursor for ``connection``'s current database
    session: kept on the connection while it stays open, fresh when it was reopened."""
    from psycopg import Cursor
    from psycopg.pq import Format

    if (
        connection.errors_occurred
        and connection.connection is not None
        and not connection.in_atomic_block
    ):
        # An earlier statement failed (the server may have ended the connection): check the
        # connection as Django does between requests, so that a retry reconnects instead of
        # failing again on a dead socket.
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()
    connection.close_if_health_check_failed()
    connection.ensure_connection()  # also refuses to run in an event loop (async_unsafe)
    database = connection.connection
    # A connection shared between threads (a live test server's) gets one cursor per call:
    # another thread could run a statement between this one's execute and fetch.
    shared = connection.allow_thread_sharing
    kept = None if shared else getattr(connection, "_memory_app_cursor", None)
    if kept is not None and kept.connection is database and not kept.closed:
        return kept
    with connection.wrap_database_errors:
        raw = Cursor(database)
    raw.format = Format.BINARY
    if not shared:
        connection._memory_app_cursor = raw
    return raw


_STORED_FIELDS = tuple(f.name for f in fields(StoredMessage))
_ROW_NAMES = ("cursor", *ROW_FIELDS[1:9], "tokens", *ROW_FIELDS[10:])
# Reads build thousands of StoredMessages: filling the instance dict directly costs a fraction
# of the frozen dataclass __init__ (one object.__setattr__ per field). Only while the row
# holds exactly the dataclass's fields, in order, and instances have a __dict__.
_DIRECT = _STORED_FIELDS == _ROW_NAMES and not hasattr(StoredMessage, "__slots__")


def _stored(values: Sequence) -> StoredMessage:
    """A StoredMessage from its field values in ``_ROW_NAMES`` order."""
    if _DIRECT:
        message = object.__new__(StoredMessage)
        message.__dict__.update(zip(_ROW_NAMES, values, strict=True))
        return message
    return StoredMessage(**dict(zip(_ROW_NAMES, values, strict=True)))


def _message(row: Sequence) -> StoredMessage:
    """A StoredMessage from a binary row in ``ROW_FIELDS`` order (jsonb already decoded)."""
    if _DIRECT:
        message = object.__new__(StoredMessage)
        values = message.__dict__
        values.update(zip(_ROW_NAMES, row, strict=True))
        if values["metadata"] is None:
            values["metadata"] = {}
        return decrypt_row(message)
    values = dict(zip(_ROW_NAMES, row, strict=True))
    if values["metadata"] is None:
        values["metadata"] = {}
    return decrypt_row(StoredMessage(**values))


def _fetch(connection, sql: str, params: Sequence) -> list[StoredMessage]:
    return [_message(r) for r in _query(connection, sql, params)]


def _json(value) -> str | None:
    return None if value is None else json.dumps(value)


def _insert_postgresql(
    connection, session_id, messages: list[NewMessage], tokens, owner=ANY_OWNER
) -> list[StoredMessage]:
    n = len(messages)
    total = sum(tokens)
    any_owner, owner_pk = sessions.owner_check(owner)
    # The namespaces' sliding TTLs travel as one parameter: the statement text stays fixed.
    params = {
        "n": n,
        "tokens": total,
        "now": timezone.now(),
        "session": session_id,
        "ttls": policies.sliding_ttls(),
        "any_owner": any_owner,
        "owner": owner_pk,
    }
    if n == 1:
        m = messages[0]
        sql = _sql().append_one
        params.update(
            role=m.role,
            content=m.content,
            content_parts=_json(m.content_parts),
            name=m.name,
            tool_calls=_json(m.tool_calls),
            tool_call_id=m.tool_call_id,
            extra=_json(m.extra),
            metadata=json.dumps(m.metadata) if m.metadata else "{}",
            remember=m.remember,
            idempotency_key=m.idempotency_key,
        )
    else:
        sql = _sql().append_many
        params["rows"] = _batch_rows(messages, tokens)
    result = _query(connection, sql, params)
    if not result:
        raise SessionNotFound(f"session {session_id} does not exist")
    # RETURNING order is not the insertion order: place each row by its cursor.
    first = min(r[0] for r in result)
    placed: list = [None] * n
    for seq, created, pk, _since in result:
        placed[seq - first] = (seq, created, pk)
    return result[0][3], [
        stored_message(seq, m, t, created, pk)
        for m, t, (seq, created, pk) in zip(messages, tokens, placed, strict=True)
    ]


_OPTIONAL = (
    "content_parts",
    "name",
    "tool_calls",
    "tool_call_id",
    "extra",
    "metadata",
    "remember",
    "idempotency_key",
)


def _batch_rows(messages: list[NewMessage], tokens: list[int]) -> str:
    """The batch as JSON rows; empty fields are left out (the statement fills them in)."""
    rows = []
    for i, (m, t) in enumerate(zip(messages, tokens, strict=True)):
        row = {"i": i, "role": m.role, "content": m.content, "token_count": t}
        for key in _OPTIONAL:
            value = getattr(m, key)
            if value:
                row[key] = value
        rows.append(row)
    return json.dumps(rows, ensure_ascii=False)


def message_row(session_id, seq: int, m: NewMessage, tokens: int) -> Message:
    """The ORM row of a message as stored (``m`` already encrypted when encryption is on)."""
    return Message(
        session_id=session_id,
        seq=seq,
        role=m.role,
        content=m.content,
        content_parts=m.content_parts,
        name=m.name,
        tool_calls=m.tool_calls,
        tool_call_id=m.tool_call_id,
        extra=m.extra,
        metadata=m.metadata,
        token_count=tokens,
        remember=m.remember,
        idempotency_key=m.idempotency_key,
    )


def _insert_generic(session_id, messages, tokens, owner=ANY_OWNER) -> list[StoredMessage]:
    n = len(messages)
    now = timezone.now()
    changes = {}
    expiry = policies.sliding_expiry(now)  # a CASE on the namespace: still one UPDATE
    if expiry is not None:
        changes["expires_at"] = expiry
    with transaction.atomic(using=router.db_for_write(Message)):
        # The UPDATE takes the session's write lock first, so appenders queue here.
        updated = (
            sessions.scoped(owner)
            .filter(pk=session_id)
            .update(
                next_seq=F("next_seq") + n,
                message_count=F("message_count") + n,
                token_count=F("token_count") + sum(tokens),
                tokens_since_snapshot=F("tokens_since_snapshot") + sum(tokens),
                updated_at=now,
                **changes,
            )
        )
        if not updated:
            raise SessionNotFound(f"session {session_id} does not exist")
        next_seq, tokens_since = (
            Session.objects.filter(pk=session_id)
            .values_list("next_seq", "tokens_since_snapshot")
            .get()
        )
        first = next_seq - n
        Message.objects.bulk_create(
            message_row(session_id, first + i, m, t)
            for i, (m, t) in enumerate(zip(messages, tokens, strict=True))
        )
        return tokens_since, rows(
            Message.objects.filter(session_id=session_id, seq__gte=first).order_by("seq")
        )


# -- reads ----------------------------------------------------------------------------------

_NO_END = 2**63 - 1


def newest(session_id, n: int) -> list[StoredMessage]:
    """The newest ``n`` messages, newest first (one backward index scan)."""
    connection = connections[router.db_for_read(Message)]
    if connection.vendor == "postgresql":
        return _fetch(connection, _sql().newest, [session_id, 0, _NO_END, n])
    return rows(Message.objects.filter(session_id=session_id).order_by("-seq")[:n])


def system_messages(session_id) -> list[StoredMessage]:
    """Every stored system message of the session, in log order (a partial index serves it)."""
    connection = connections[router.db_for_read(Message)]
    if connection.vendor == "postgresql":
        return _fetch(connection, _sql().system, [session_id])
    return rows(Message.objects.filter(session_id=session_id, role="system").order_by("seq"))


def newest_first(
    session_id,
    *,
    after: int,
    page_size: Callable[[int, int], int],
    before: int | None = None,
    fetched: int = 0,
    tokens: int = 0,
) -> Iterator[StoredMessage]:
    """Messages with cursor > ``after`` (and < ``before``), newest first, fetched a page at a
    time (index scans).

    ``page_size(rows_so_far, tokens_so_far)`` sizes each page, so a caller filling a token
    budget can ask for about as many rows as it still needs; ``fetched`` and ``tokens`` say
    what was read before (by ``window_source``).
    """
    connection = connections[router.db_for_read(Message)]
    while True:
        size = max(1, page_size(fetched, tokens))
        if connection.vendor == "postgresql":
            chunk = _fetch(
                connection,
                _sql().newest,
                [session_id, after, _NO_END if before is None else before, size],
            )
        else:
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


def window_source(
    session_id,
    *,
    page_size: Callable[[int, int], int],
    max_tokens: int | None,
) -> tuple[SnapshotView | None, list[StoredMessage], Iterator[StoredMessage]] | None:
    """What a window is built from: ``(latest snapshot, system messages, newest messages after
    the snapshot)``, the last lazy (pages after the first are read only if the window asks).

    Two short index reads on PostgreSQL. With a token budget (``max_tokens``, counted with
    the stored token counts) the first page holds what the session's average message size
    says will fit, with a margin for tool groups straddling the edge, so one page usually
    does. ``None`` on other databases (the caller reads the parts through the ORM).
    """
    connection = connections[router.db_for_read(Message)]
    if connection.vendor != "postgresql":
        return None
    statements = _sql()
    head = _query(connection, statements.window_head, [session_id])
    if not head:  # the session is gone: nothing to send
        return None, [], iter(())
    message_count, token_count, version, upto, summary, pinned, model, metadata, created = head[0][
        :9
    ]
    system = [_message(row[9:]) for row in head if row[9] is not None]
    snapshot = None
    if version is not None:
        snapshot = SnapshotView(
            version=version,
            upto=upto,
            summary=summary,
            pinned=list(pinned or []),
            model=model,
            metadata=dict(metadata or {}),
            created_at=created,
        )
    first = max(1, page_size(0, 0))
    if max_tokens is not None and message_count and token_count:
        first = min(
            memory_settings.WINDOW_PAGE_SIZE * 10,
            16 + math.ceil(1.1 * max_tokens * message_count / token_count),
        )
    after = snapshot.upto if snapshot else 0
    first_page = _query(connection, statements.newest, [session_id, after, _NO_END, first])

    def newest() -> Iterator[StoredMessage]:
        # Built as the window walks back: rows past its budget never become objects.
        for row in first_page:
            yield _message(row)
        if len(first_page) == first:
            yield from newest_first(
                session_id,
                after=after,
                page_size=page_size,
                before=first_page[-1][0],
                fetched=first,
                tokens=sum(row[9] for row in first_page),
            )

    return snapshot, system, newest()


def messages(
    session_id, after: int | None = None, limit: int | None = None, *, before: int | None = None
) -> list[StoredMessage]:
    """Messages with cursor greater than ``after`` (and less than ``before``), oldest first.

    ``limit`` keeps the first ones after ``after``; when only ``before`` is given it keeps the
    last ones before ``before`` instead, which is how a reader pages backwards.
    """
    qs = Message.objects.filter(session_id=session_id)
    if after is not None:
        qs = qs.filter(seq__gt=check_cursor(after, "after"))
    if before is not None:
        qs = qs.filter(seq__lt=check_cursor(before, "before"))
    backwards = before is not None and after is None and limit is not None
    qs = qs.order_by("-seq" if backwards else "seq")
    if limit is not None:
        qs = qs[: check_count(limit, "limit")]
    found = rows(qs)
    if backwards:
        found.reverse()
    return found


def last(session_id, n: int) -> list[StoredMessage]:
    """The newest ``n`` messages, oldest first."""
    found = newest(session_id, check_count(n, "n"))
    found.reverse()
    return found


def get(session_id, cursor: int) -> StoredMessage:
    cursor = check_cursor(cursor)
    found = rows(Message.objects.filter(session_id=session_id, seq=cursor))
    if not found:
        raise InvalidCursor(f"no message at cursor {cursor}", field="cursor")
    return found[0]


def cursor_range(session_id) -> tuple[int, int] | None:
    """``(first, last)`` cursor of the messages stored now, or ``None`` when there are none."""
    bounds = Message.objects.filter(session_id=session_id).aggregate(
        first=Min("seq"), last=Max("seq")
    )
    if bounds["first"] is None:
        return None
    return bounds["first"], bounds["last"]


def pop_last(session_id) -> StoredMessage | None:
    """Delete the newest message and return it; ``None`` when the log is empty.

    The popped cursor is never handed out again (``next_seq`` does not move back), so a reader
    holding it sees a gap, never a different message. Counters stay exact (row lock).
    """
    with transaction.atomic(using=router.db_for_write(Message)):
        session = sessions.lock(session_id)
        newest_rows = rows(Message.objects.filter(session=session).order_by("-seq")[:1])
        if not newest_rows:
            return None
        popped = newest_rows[0]
        # Taken back, not pruned: its vectors go too (they would outlive it otherwise).
        Embedding.objects.filter(session=session, cursor=popped.cursor).delete()
        Message.objects.filter(session=session, seq=popped.cursor).delete()
        since = session.tokens_since_snapshot
        if popped.cursor > snapshots.latest_upto(session.pk):
            since = max(0, since - popped.tokens)
        Session.objects.filter(pk=session.pk).update(
            message_count=session.message_count - 1,
            token_count=session.token_count - popped.tokens,
            tokens_since_snapshot=since,
            updated_at=timezone.now(),
        )
    return popped


# -- indexing after the append --------------------------------------------------------------

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


def sessions_pending_index(session_ids: Sequence | None = None) -> list:
    """Sessions (of ``session_ids``, when given) with messages still marked ``index_pending``:
    what ``memory_embed`` catches up with when an after-append job never ran (a crash between
    the commit and the scheduling, a lost task)."""
    qs = Message.objects.filter(index_pending=True)
    if session_ids is not None:
        qs = qs.filter(session_id__in=list(session_ids))
    return list(qs.order_by().values_list("session_id", flat=True).distinct())
